// The weights of a DeepSeek V2/V3 model, widened to fp32 for the CPU backend, in the layouts the ops expect.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace deepinfer {

struct MlaWeights {
  Tensor q_proj;      // [H * qk_head_dim, D]          without q_lora_rank
  Tensor q_a_proj;    // [q_lora_rank, D]              with q_lora_rank
  Tensor q_a_norm;    // [q_lora_rank]
  Tensor q_b_proj;    // [H * qk_head_dim, q_lora_rank]
  Tensor kv_a_proj;   // [kv_lora_rank + rope, D]
  Tensor kv_a_norm;   // [kv_lora_rank]
  Tensor kv_b_proj;   // [H * (nope + v), kv_lora_rank]  used by prefill to decompress
  Tensor w_uk_t;      // [H, kv_lora_rank, nope]         K half of kv_b_proj, per head, transposed (absorbed decode)
  Tensor w_uv;        // [H, v, kv_lora_rank]            V half of kv_b_proj, per head
  Tensor o_proj;      // [D, H * v]
};

struct MlpWeights {
  Tensor gate_up;  // [2I, D]  gate_proj rows then up_proj rows
  Tensor down;     // [D, I]
};

struct MoeWeights {
  Tensor gate;                // [E, D]  router
  Tensor correction_bias;     // [E]     V3 only (empty otherwise)
  Tensor experts_gate_up;     // [E, 2I, D]
  Tensor experts_down;        // [E, D, I]
  std::optional<MlpWeights> shared;  // n_shared_experts * moe_intermediate_size wide
};

struct LayerWeights {
  Tensor input_norm;           // [D]
  Tensor post_attention_norm;  // [D]
  MlaWeights attn;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

struct ModelWeights {
  Tensor embed;    // [V, D]
  std::vector<LayerWeights> layers;
  Tensor norm;     // [D]
  Tensor lm_head;  // [V, D] (a copy of embed when tied)
};

// Where tensors come from: a checkpoint directory, or random values for benchmarks (load_format="dummy").
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // Fills `out` (fp32, `shape`) from tensor `name`; throws naming the tensor on a missing tensor or wrong shape.
  virtual void read(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const = 0;
};

std::unique_ptr<WeightSource> open_checkpoint_source(const std::filesystem::path& dir, const ModelConfig& config);
// Deterministic random weights: N(0, 0.02) for matrices, 1 for norms, 0 for biases.
std::unique_ptr<WeightSource> make_dummy_source(uint64_t seed);

using LoadProgress = std::function<void(int64_t done, int64_t total)>;

// Loads the main model's layers (MTP layers stored after them are skipped).
ModelWeights load_weights(const ModelConfig& config, const WeightSource& source, const LoadProgress& progress = {});

}  // namespace deepinfer
