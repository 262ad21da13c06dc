// Multi-head Latent Attention over the paged latent cache.
//
// Cache layout, one layer: [num_pages, page_size, latent_dim] with latent_dim = kv_lora_rank + rope_dim; a token's
// row holds the normalized c_kv (kv_a_layernorm output) followed by its rotated k_pe. Nothing else is cached.
#pragma once

#include <cstdint>

#include "backend/ops/attention_metadata.h"
#include "backend/ops/dense.h"
#include "core/tensor.h"

namespace deepinfer {

// cache[slot / page_size, slot % page_size, :] = latent[t, :] for every token t.
struct MlaCacheWriteArgs {
  ConstTensorView latent;        // [T, latent_dim]
  TensorView cache;              // [num_pages, page_size, latent_dim]
  ConstTensorView slot_mapping;  // [T] int32, each in [0, num_pages * page_size)
  int64_t kv_lora_rank = 0;
  void validate() const;
};

// The step between the projections and attention, in one op: what a layer does to its fresh latents and queries
// before it attends. Defined as this composition of other ops (Backend::mla_prepare runs exactly these by default):
//   1. rms_norm of c_kv = latent[:, :rank] with kv_a_norm, in place (the kv_a_layernorm);
//   2. rope of q_pe = q[:, :, nope:], every head, in place;
//   3. rope of k_pe = latent[:, rank:], in place;
//   4. mla_cache_write of the latent rows into the cache at slot_mapping;
//   5. copy of the rotated q_pe of the first Td tokens (the decode tokens, first in the batch) into
//      q_abs[:, :, rank:], the rope columns of the absorbed decode query. q_abs[:, :, :rank] is left as it is.
// Rope pairs, angles and scaling are RopeArgs's; slots follow mla_cache_write (a device backend skips a slot outside
// the cache, as its mla_cache_write does). A backend may fuse the five steps when that saves passes over memory.
// The step contract: the tokens are one step's (a ForwardBatch's), so of a sequence that an mla_decode of the same step
// attends over, this op writes only the newest row, that of its decode token; the other tokens' rows belong to other
// sequences. A device backend relies on it to read a decode's older cache rows while this op may still run.
struct MlaPrepareArgs {
  TensorView latent;              // [T, rank + rope]: c_kv | k_pe, normalized and rotated in place
  TensorView q;                   // [T, H, nope + rope]: q_pe rotated in place
  TensorView q_abs;               // [Td, H, rank + rope], Td <= T; a default (empty) view when there is no decode
  TensorView cache;               // [num_pages, page_size, rank + rope]: one layer of the latent cache
  ConstTensorView slot_mapping;   // [T] int32
  ConstTensorView positions;      // [T] int32
  ConstTensorView kv_a_norm;      // [rank] float32
  ConstTensorView inv_freq;       // [rope / 2] float32
  int64_t kv_lora_rank = 0;
  float eps = 1e-6f;
  float attention_scaling = 1.0f;
  bool interleaved = true;        // rope pairs (2i, 2i+1) as DeepSeek stores them; else halves (i, i + rope / 2)

  int64_t num_tokens() const { return latent.shape.ndim() == 2 ? latent.shape[0] : 0; }
  int64_t num_decode_tokens() const { return q_abs.shape.ndim() == 3 ? q_abs.shape[0] : 0; }
  int64_t rope_dim() const { return latent.shape.ndim() == 2 ? latent.shape[1] - kv_lora_rank : 0; }
  void validate() const;
};

// Absorbed decode: each sequence has one query, row s of q; all heads share the latent rows of its pages.
//   scores[h, j] = scale * (q_latent[h] · c_kv[j] + q_pe[h] · k_pe[j]);  out[h] = softmax(scores[h]) · c_kv
// q is one tensor, q_latent (q_nope · W_UK) then the rotated q_pe in each head row, as the CUDA kernel reads it.
struct MlaDecodeArgs {
  ConstTensorView q;          // [S, H, kv_lora_rank + rope_dim]
  ConstTensorView cache;      // [num_pages, page_size, kv_lora_rank + rope_dim]
  TensorView out_latent;      // [S, H, kv_lora_rank]
  AttentionMetadata meta;     // S sequences of exactly one query each (query_start 0, 1, ..., S up to an offset)
  int64_t kv_lora_rank = 0;
  float softmax_scale = 1.0f;
  // The absorbed form's value projection, optional (both or neither): out[s, h] = w_uv[h] · o_latent[s, h], as a
  // head_linear would compute it. Given them, the op's result is `out`, and out_latent is scratch whose contents are
  // unspecified afterwards: a device backend may fold the split-KV combine into the projection and never write it.
  ConstTensorView w_uv;  // [H, v_head_dim, kv_lora_rank]
  TensorView out;        // [S, H, v_head_dim]
  bool projects() const { return w_uv.data != nullptr; }
  // The head_linear the projection stands for, on out_latent.
  HeadLinearArgs projection() const { return {.x = out_latent, .w = w_uv, .out = out}; }
  void validate() const;
};

// Prefill (and chunked prefill over a cached prefix): keys and values are decompressed from the cache with
// kv_b_proj, then causal attention with q/k head size nope + rope and v head size v_head_dim.
struct MlaPrefillArgs {
  ConstTensorView q;          // [T, H, nope + rope]   rope part rotated
  ConstTensorView cache;      // [num_pages, page_size, kv_lora_rank + rope_dim]
  ConstTensorView kv_b;       // [H * (nope + v), kv_lora_rank]
  TensorView out;             // [T, H, v]
  AttentionMetadata meta;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t v_head_dim = 0;
  float softmax_scale = 1.0f;
  void validate() const;
};

}  // namespace deepinfer
