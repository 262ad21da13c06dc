// Dense ops: linear layers, embedding lookup, RMSNorm, SiLU-gated MLP activation.
//
// Activations are float32 or bfloat16 (all of one op's activations the same dtype; the CPU backend computes in
// float32, the CUDA backend takes both); norm weights are float32. Every tensor of an op is on one device.
#pragma once

#include <span>

#include "core/tensor.h"
#include "core/weight.h"

namespace deepinfer {

// out[M, N] = x[M, K] · w[N, K]^T   (w in Hugging Face's [out_features, in_features] layout)
// w is x's dtype, or block-scaled FP8 (core/weight.h) with the activations in any dtype: the product is then that of
// the dequantized weight.
// With accumulate, out[M, N] += x · w^T instead: the shared experts' down projection adds into the routed experts'
// output without a separate add (and with one rounding of the sum).
struct LinearArgs {
  ConstTensorView x;
  WeightView w;
  TensorView out;
  bool accumulate = false;
  void validate() const;
};

// The gated MLP's first half in one op: out[M, I] = silu(x · w[0:I]^T) * (x · w[I:2I]^T), w = [gate; up] as the
// model stores gate_up_proj. Backends without a fused kernel run linear then silu_mul.
struct LinearSiluMulArgs {
  ConstTensorView x;  // [M, K]
  WeightView w;       // [2I, K]
  TensorView out;     // [M, I]
  void validate() const;
};

// Several products of the same x in one op: each target's out = x · w^T, or with silu_mul out = silu(x · gate^T) *
// (x · up^T) for w = [gate; up]. A decode step reads q_proj with kv_a_proj, and the router with the shared experts'
// gate_up, in one launch this way. Backends without a fused kernel run the targets one by one.
struct LinearTarget {
  WeightView w;       // [N, K] (silu_mul: [2I, K])
  TensorView out;     // [M, N] (silu_mul: [M, I]); x's dtype, or float32 when not silu_mul
  bool silu_mul = false;
};
inline constexpr size_t kMultiLinearMaxTargets = 3;
struct MultiLinearArgs {
  ConstTensorView x;                      // [M, K]
  std::span<const LinearTarget> targets;  // 1..kMultiLinearMaxTargets
  void validate() const;
};

// out[t, h, :] = x[t, h, :] · w[h]^T for every head h: x [T, H, K], w [H, N, K], out [T, H, N].
// MLA's absorbed decode multiplies queries and outputs by per-head slices of kv_b_proj this way. The head rows of x
// and out may be wider than K and N: row (t, h) of x starts at element (t * H + h) * x_head_stride, so x can be the
// q_nope columns of a [T, H, nope + rope] query and out the q_latent columns of a [T, H, rank + rope] one (views
// from TensorView::columns).
struct HeadLinearArgs {
  ConstTensorView x;            // [T, H, K]
  ConstTensorView w;            // [H, N, K]
  TensorView out;               // [T, H, N]
  int64_t x_head_stride = 0;    // elements; 0 = K
  int64_t out_head_stride = 0;  // elements; 0 = N
  void validate() const;
};

// out[t] = table[token_ids[t]]
struct EmbeddingArgs {
  ConstTensorView token_ids;  // [T] int32, each in [0, vocab_size)
  ConstTensorView table;      // [V, D]: rows [first_row, first_row + V) of the vocabulary
  TensorView out;             // [T, D]
  // A vocabulary-parallel rank's shard (model_shard.h): its table holds rows [first_row, first_row + V) of a
  // vocabulary of vocab_size; ids outside its rows give zero rows, so the ranks' outputs sum to the lookup. Defaults:
  // the table is the whole vocabulary.
  int64_t first_row = 0;
  int64_t vocab_size = 0;  // 0: V
  void validate() const;
};

// out = x / rms(x) * weight, per row. x and out may alias. Rows may be `row_stride` elements apart (0 = D), so
// the c_kv half of a [T, kv_lora_rank + rope] latent can be normalized in place.
struct RmsNormArgs {
  ConstTensorView x;       // [T, D]
  ConstTensorView weight;  // [D] float32
  TensorView out;          // [T, D]
  float eps = 1e-6f;
  int64_t row_stride = 0;
  void validate() const;
};

// residual += x; out = rms_norm(residual). The fused pre-norm step between sublayers.
struct AddRmsNormArgs {
  TensorView residual;     // [T, D], updated in place
  ConstTensorView x;       // [T, D]
  ConstTensorView weight;  // [D] float32
  TensorView out;          // [T, D]
  float eps = 1e-6f;
  void validate() const;
};

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]
struct SiluMulArgs {
  ConstTensorView gate_up;  // [T, 2I]
  TensorView out;           // [T, I]
  void validate() const;
};

// x += y (elementwise)
struct AddArgs {
  TensorView x;
  ConstTensorView y;
  void validate() const;
};

}  // namespace deepinfer
