// The DeepSeek V2/V3 architecture, parsed from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/quantized_modules.h"

namespace deepinfer {

enum class ModelVersion : uint8_t { kV2, kV3 };
enum class ExpertScoring : uint8_t { kSoftmax, kSigmoid };
// How experts are chosen: V2 "greedy" (plain top-k), V2 "group_limited_greedy" (group score = max),
// V3 "noaux_tc" (group score = sum of the top-2 biased scores).
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class RopeType : uint8_t { kDefault, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0: absent (then cos/sin scale by mscale(factor, 1))
  double mscale_all_dim = 0.0;
  bool interleaved = true;  // DeepSeek checkpoints rotate pairs (2i, 2i+1)
};

struct Fp8Config {
  bool enabled = false;             // weights stored as float8_e4m3fn with weight_scale_inv
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  std::string scale_fmt;            // "" or "ue8m0"
  // The checkpoint quantizes activations too (W8A8: DeepSeek's, compressed-tensors' FP8_BLOCK); false: its weights
  // only (compressed-tensors' block-FP8 group without input_activations), which the engine then runs as W8A16.
  bool activations = true;
};

// A checkpoint whose linear layers are stored in 4 bits (model/int4.h has the layouts). Which layers are quantized is
// read from the tensors themselves (X.weight_packed or X.qweight stored instead of X.weight), so the config's
// `ignore` / `modules_to_not_convert` lists (regexes in one library, substrings in the other) need no matching.
enum class Int4Format : uint8_t {
  kNone,
  kCompressedTensors,  // quant_method "compressed-tensors", format "pack-quantized", W4A16 int weights
  kAwq,                // quant_method "awq", version "gemm", zero_point true
};

struct Int4Config {
  Int4Format format = Int4Format::kNone;
  int64_t group_size = 128;  // inputs a scale covers; -1: one per output channel (the whole row)
  bool symmetric = false;    // compressed-tensors without zero points
  bool enabled() const { return format != Int4Format::kNone; }
};

// A checkpoint whose linear layers are stored as 4-bit floats (model/fp4.h has the layouts), loaded weight-only.
// Which layers are quantized is read from the tensors, as for INT4.
enum class Fp4Format : uint8_t {
  kNone,
  kNvfp4CompressedTensors,  // quant_method "compressed-tensors", format "nvfp4-pack-quantized"
  kMxfp4CompressedTensors,  // quant_method "compressed-tensors", format "mxfp4-pack-quantized"
  kNvfp4ModelOpt,           // quant_method "modelopt" (or hf_quant_config.json), quant_algo NVFP4 / W4A16_NVFP4
};

struct Fp4Config {
  Fp4Format format = Fp4Format::kNone;
  int64_t group_size = 16;  // 16 (NVFP4) or 32 (MXFP4)
  bool enabled() const { return format != Fp4Format::kNone; }
};

struct ModelConfig {
  ModelVersion version = ModelVersion::kV3;
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP
  int64_t moe_intermediate_size = 0;  // one expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  std::optional<int64_t> q_lora_rank;  // unset: q_proj directly from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;       // 0: every layer dense
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  ExpertScoring scoring = ExpertScoring::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  RopeConfig rope;
  Fp8Config fp8;
  Int4Config int4;
  Fp4Config fp4;
  QuantizedModules quantized_modules;    // a quantized checkpoint's targets and layers left unquantized, as listed
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the main layers
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::string torch_dtype;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cached values per token per layer
  bool is_moe_layer(int64_t layer) const;
  // Softmax scale of MLA attention, including the YaRN mscale^2 correction.
  double softmax_scale() const;

  void validate() const;  // throws InvalidArgument naming the field
};

ModelConfig parse_model_config(const nlohmann::json& j);
// Reads DIR/config.json (and generation_config.json for EOS ids when present).
ModelConfig load_model_config(const std::filesystem::path& model_dir);

}  // namespace deepinfer
