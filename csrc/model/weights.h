// The weights of a DeepSeek V2/V3 model in the layouts the ops expect, placed by a WeightSink: host float32 (the CPU
// backend, tests) or a backend's device.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dummy_normal.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "model/config.h"
#include "model/int4.h"
#include "model/model_shard.h"
#include "model/weight_sink.h"

namespace deepinfer {

struct MlaWeights {
  Weight q_proj;      // [H * qk_head_dim, D]          without q_lora_rank
  Weight q_a_proj;    // [q_lora_rank, D]              with q_lora_rank
  Tensor q_a_norm;    // [q_lora_rank]
  Weight q_b_proj;    // [H * qk_head_dim, q_lora_rank]
  Weight kv_a_proj;   // [kv_lora_rank + rope, D]
  Tensor kv_a_norm;   // [kv_lora_rank]
  // kv_b_proj and its absorbed halves stay in the model dtype under FP8: they are 0.15% of DeepSeek-V3's weights per
  // layer, and W_UK / W_UV are laid out per head (transposed), off the stored 128 x 128 blocks.
  Tensor kv_b_proj;   // [H * (nope + v), kv_lora_rank]  used by prefill to decompress
  Tensor w_uk_t;      // [H, kv_lora_rank, nope]         K half of kv_b_proj, per head, transposed (absorbed decode)
  Tensor w_uv;        // [H, v, kv_lora_rank]            V half of kv_b_proj, per head
  Weight o_proj;      // [D, H * v]
};

struct MlpWeights {
  Weight gate_up;  // [2I, D]  gate_proj rows then up_proj rows
  Weight down;     // [D, I]
};

// The shared experts (an MLP n_shared_experts * I wide) are stored as n_shared_experts more experts of width I after
// the E routed ones: slot E + j holds rows [j I, (j + 1) I) of the shared gate_proj and up_proj and columns
// [j I, (j + 1) I) of the shared down_proj. Routing gives every token these s experts with weight 1.
struct MoeWeights {
  Tensor gate;                // [E, D]  router
  Tensor correction_bias;     // [E]     V3 only (empty otherwise)
  Weight experts_gate_up;     // [E + s, 2I, D]  gate rows then up rows
  Weight experts_down;        // [E + s, D, I]
  int64_t num_shared_experts = 0;  // s: the last s experts of the stacked tensors
  // Under expert parallelism (model_shard.h): the stacked tensors hold routed experts [first_expert, first_expert +
  // their count) of num_routed_experts and no shared ones; the rank's channels of the shared experts are shared_mlp.
  int64_t first_expert = 0;
  int64_t num_routed_experts = 0;
  std::optional<MlpWeights> shared_mlp;
};

struct LayerWeights {
  Tensor input_norm;           // [D]
  Tensor post_attention_norm;  // [D]
  MlaWeights attn;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

// DeepSeek-V3's multi-token prediction layer (one depth), stored as model.layers.{num_hidden_layers}.*: for position i
// it reads the main model's final hidden state h_i (after model.norm) and the next token t_{i+1}, and predicts t_{i+2}:
//   x_i = eh_proj([enorm(Emb(t_{i+1})) ; hnorm(h_i)]),  y = block(x) over its own latent cache,
//   logits_i = lm_head(head_norm(y_i)).
// The embedding and the output head are the main model's (DeepSeek stores copies under the layer; they are equal).
struct MtpWeights {
  Tensor enorm;      // [D]
  Tensor hnorm;      // [D]
  Weight eh_proj;    // [D, 2D]  embedding half first
  LayerWeights block;
  Tensor head_norm;  // [D]      shared_head.norm
};

struct ModelWeights {
  Tensor embed;    // [V, D]
  std::vector<LayerWeights> layers;
  Tensor norm;     // [D]
  Tensor lm_head;  // [V, D] (a copy of embed when tied)
  std::optional<MtpWeights> mtp;  // loaded only for MTP speculative decoding
};

// Where tensors come from: a checkpoint directory, or random values for benchmarks (load_format="dummy").
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // The shape tensor `name` is stored with, when the source stores tensors (a checkpoint); nullopt when it makes any
  // shape it is asked for (dummy weights). Throws naming the tensor when a checkpoint lacks it.
  virtual std::optional<std::vector<int64_t>> stored_shape(const std::string& /*name*/) const { return std::nullopt; }
  // Whether tensor `name` is stored as block-scaled FP8 in 128 x 128 blocks, which read_fp8_rows reads as stored.
  virtual bool stores_fp8(const std::string& /*name*/) const { return false; }
  // Whether the source is an FP8 checkpoint (its config's Fp8Config.enabled): its authors chose which linear layers
  // to quantize, so an FP8 sink keeps the ones it stores unquantized (!stored_fp8) in the model dtype. Otherwise (a
  // bf16 checkpoint, dummy weights) an FP8 sink quantizes linear weights at load.
  virtual bool fp8_checkpoint() const { return false; }
  // Whether tensor `name` is stored as FP8 codes with scales, in blocks of any size: stores_fp8 without its
  // condition that the blocks (and, sharded, this rank's slice) fall on 128 x 128 (those are read as float32 and
  // quantized again, but stay FP8).
  virtual bool stored_fp8(const std::string& name) const { return stores_fp8(name); }
  // The stored codes of rows [first_row, first_row + num_rows) of 2-D FP8 tensor `name` (first_row a multiple of
  // 128) and the scales of their block rows; only where stores_fp8(name). Throws like read_rows.
  virtual void read_fp8_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row,
                             int64_t num_rows, std::span<uint8_t> codes, std::span<float> scale_inv) const;
  // Whether 2-D tensor `name` is a 4-bit weight (stored in 4 bits, or rounded to them by the source), and its form;
  // read_int4_rows then reads its codes and scales as they are (read_rows reads the same weight dequantized).
  virtual std::optional<Int4Form> int4_form(const std::string& /*name*/) const { return std::nullopt; }
  // Rows [first_row, first_row + num_rows) of 4-bit weight `name` of `shape` ([N, K]); only where int4_form(name).
  virtual void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row,
                              int64_t num_rows, Int4Rows& out) const;
  // Dummy weights: where the values of tensor `name`, read with `shape`, lie in their stream (core/dummy_normal.h),
  // which a device can make itself: its rows of row_length = product(shape[1:]) values, row 0 from `first` on
  // (a shard's slice: a later range, or row_stride > row_length). nullopt for every other source, and for tensors
  // that are not a stream (norm weights, biases). A source that transforms values (rounding to 4 bits) must answer
  // nullopt, as the default does.
  virtual std::optional<dummy_normal::StreamRange> normal_stream(const std::string& /*name*/,
                                                                 std::span<const int64_t> /*shape*/) const {
    return std::nullopt;
  }
  // Fills `out` (fp32) with rows [first_row, first_row + num_rows) of dimension 0 of tensor `name`, whose whole
  // shape is `shape` (a 0-D tensor is one row): num_rows * product(shape[1:]) values, row-major. They equal the
  // same rows of a whole read bit for bit, so a large tensor can be read piece by piece (one expert at a time).
  // Throws naming the tensor on a missing tensor, a wrong shape, a range outside the tensor or a wrong `out` size.
  virtual void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row,
                         int64_t num_rows, std::span<float> out) const = 0;
  // The whole tensor (read_rows over every row): `out` holds product(shape) values.
  void read(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const {
    read_rows(name, shape, 0, shape.empty() ? 1 : shape[0], out);
  }
};

// A checkpoint with 4-bit linear layers (config.int4, config.fp4) reads them dequantized to float32
// (model/int4_source.h, model/fp4_source.h).
std::unique_ptr<WeightSource> open_checkpoint_source(const std::filesystem::path& dir, const ModelConfig& config);
// Deterministic random weights: value i of matrix `name` is 0.02 * a standard normal made from a 64-bit hash of
// (seed, FNV-1a of the name, i), in plain float arithmetic (no std::hash, no libm); norm weights are 1, biases 0.
// Generated in parallel (OpenMP), any row range on its own.
std::unique_ptr<WeightSource> make_dummy_source(uint64_t seed);

using LoadProgress = std::function<void(int64_t done, int64_t total)>;

// The most float32 values the loader reads at once from a tensor whose rows are at most this wide (64 MiB).
inline constexpr int64_t kLoadChunkFloats = int64_t{1} << 24;

// The bytes of every resident weight by dtype (FP8 scales count as float32): what the load log and /metrics report.
std::vector<std::pair<DType, int64_t>> weight_bytes_by_dtype(const ModelWeights& weights);

// Loads the main model's layers and, with `with_mtp`, the first MTP layer stored after them (the others are skipped;
// throws when the config declares none), placing every tensor through `sink` as
// soon as it is read. The host holds at most one piece of float32 values at a time: a chunk of whole rows of up to
// kLoadChunkFloats, one row when a row is larger (one expert of a fused [E, 2I, D] tensor), one expert's tensor, or
// one head of kv_b_proj (from which w_uk_t and w_uv are derived on the host); a chunk of rows of a shared down_proj
// also has its columns of one shared expert gathered beside it. A tied lm_head reads the embedding again. Throws when
// a checkpoint's shared experts are not n_shared_experts * moe_intermediate_size wide.
//
// One rank's part under tensor/expert parallelism: `config` is the rank's local_config, `source` reads through
// make_sharded_source, and `shard` picks the routed experts under EP.
ModelWeights load_weights(const ModelConfig& config, const WeightSource& source, WeightSink& sink,
                          const LoadProgress& progress = {}, const ModelShard& shard = {}, bool with_mtp = false);
// The same into host float32 tensors (make_host_sink()).
ModelWeights load_weights(const ModelConfig& config, const WeightSource& source, const LoadProgress& progress = {});

}  // namespace deepinfer
