#include "model/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <utility>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer {
namespace {

using nlohmann::json;

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    throw InvalidArgument(str_cat("config.json: field '", key, "' has the wrong type: ", it->dump()));
  }
}

// An optional list of strings (null or absent: empty), e.g. quantization_config.ignore.
std::vector<std::string> string_list(const json& j, const char* key, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  DI_CHECK_ARG(it->is_array(), where, ".", key, " is not a list: ", it->dump());
  std::vector<std::string> out;
  for (const json& v : *it) {
    DI_CHECK_ARG(v.is_string(), where, ".", key, " holds ", v.dump(), ", not a module name or pattern");
    out.push_back(v.get<std::string>());
  }
  return out;
}

int64_t require_int(const json& j, const char* key) {
  auto it = j.find(key);
  DI_CHECK_ARG(it != j.end() && it->is_number_integer(), "config.json: missing integer field '", key, "'");
  return it->get<int64_t>();
}

std::vector<int32_t> ids_of(const json& value) {
  std::vector<int32_t> ids;
  if (value.is_number_integer()) ids.push_back(value.get<int32_t>());
  if (value.is_array()) {
    for (const auto& v : value) {
      if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
    }
  }
  return ids;
}

RopeConfig parse_rope(const json& j) {
  RopeConfig rope;
  rope.theta = get_or<double>(j, "rope_theta", 10000.0);
  rope.interleaved = get_or<bool>(j, "rope_interleave", true);
  // DeepSeek's own configs write `rope_scaling`; transformers 5 writes `rope_parameters` (with rope_theta inside).
  const json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_object()) {
      params = &*it;
      break;
    }
  }
  if (params == nullptr) return rope;
  rope.theta = get_or<double>(*params, "rope_theta", rope.theta);
  std::string type = get_or<std::string>(*params, "rope_type", get_or<std::string>(*params, "type", "default"));
  if (type == "default" || type.empty()) return rope;
  DI_CHECK_ARG(type == "yarn", "config.json: rope scaling type '", type,
               "' is not supported (DeepSeek models use 'yarn' or none)");
  rope.type = RopeType::kYarn;
  rope.factor = get_or<double>(*params, "factor", 1.0);
  rope.original_max_position_embeddings = get_or<int64_t>(*params, "original_max_position_embeddings", 4096);
  rope.beta_fast = get_or<double>(*params, "beta_fast", 32.0);
  rope.beta_slow = get_or<double>(*params, "beta_slow", 1.0);
  rope.mscale = get_or<double>(*params, "mscale", 0.0);  // 0: absent
  rope.mscale_all_dim = get_or<double>(*params, "mscale_all_dim", 0.0);
  return rope;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// DeepSeek's block-scaled FP8. The config may list modules left in their dtype: transformers' FineGrainedFP8Config as
// modules_to_not_convert (keys matched anywhere in the name), vLLM's Fp8Config as ignored_layers (whole module names,
// which match so too); the loader reads that from the tensors, the memory plan from these lists.
void parse_fp8(const json& q, ModelConfig& c) {
  c.fp8.enabled = true;
  if (auto b = q.find("weight_block_size"); b != q.end() && b->is_array() && b->size() == 2) {
    c.fp8.block_rows = (*b)[0].get<int64_t>();
    c.fp8.block_cols = (*b)[1].get<int64_t>();
  }
  c.fp8.scale_fmt = get_or<std::string>(q, "scale_fmt", "");
  const std::string where = "config.json: quantization_config";
  std::vector<std::string> left_out = string_list(q, "modules_to_not_convert", where);
  for (std::string& name : string_list(q, "ignored_layers", where)) left_out.push_back(std::move(name));
  c.quantized_modules = QuantizedModules(QuantizedModules::Matching::kSubstring, {}, std::move(left_out), where);
}

// The FP4 layouts compressed-tensors writes (model/fp4.h), by their format name; kNone for others.
Fp4Format compressed_tensors_fp4(std::string_view format) {
  if (format == "nvfp4-pack-quantized") return Fp4Format::kNvfp4CompressedTensors;
  if (format == "mxfp4-pack-quantized") return Fp4Format::kMxfp4CompressedTensors;
  return Fp4Format::kNone;
}

// One config group's 4-bit FP weights: NVFP4 (tensor_group, group 16) or MXFP4 (group, group 32), symmetric. A
// group that also quantizes activations (NVFP4 W4A4, MXFP4) is loaded weight-only: Hopper has no FP4 tensor cores.
void check_fp4_group(const json& w, Fp4Format format, const std::string& at) {
  const int64_t bits = get_or<int64_t>(w, "num_bits", 0);
  const std::string type = get_or<std::string>(w, "type", "");
  DI_CHECK_ARG(bits == 4 && type == "float", at, ".weights is ", bits, "-bit '", type, "': the FP4 formats hold ",
               "4-bit 'float' weights");
  const bool nv = format == Fp4Format::kNvfp4CompressedTensors;
  const std::string strategy = get_or<std::string>(w, "strategy", "");
  const std::string want_strategy = nv ? "tensor_group" : "group";
  DI_CHECK_ARG(strategy == want_strategy, at, ".weights.strategy '", strategy, "' is not ", nv ? "NVFP4" : "MXFP4",
               "'s ('", want_strategy, "')");
  const int64_t group_size = get_or<int64_t>(w, "group_size", 0);
  DI_CHECK_ARG(group_size == (nv ? 16 : 32), at, ".weights.group_size is ", group_size, "; ", nv ? "NVFP4" : "MXFP4",
               " scales groups of ", nv ? 16 : 32);
  DI_CHECK_ARG(get_or<bool>(w, "symmetric", true), at, ".weights.symmetric is false: FP4 weights are symmetric");
}

// One config group's block-scaled FP8 weights, DeepSeek's layout in compressed-tensors' terms (llm-compressor's
// FP8_BLOCK: e4m3 weights, a scale per 128 x 128 block, activations quantized dynamically per token per 128 channels,
// or not at all): `w` is the group's weights. Returns whether the group quantizes activations.
bool check_fp8_block_group(const json& group, const json& w, const std::string& at) {
  const int64_t bits = get_or<int64_t>(w, "num_bits", 0);
  const std::string type = get_or<std::string>(w, "type", "");
  DI_CHECK_ARG(bits == 8 && type == "float", at, ".weights is ", bits, "-bit '", type, "': 'float-quantized' ",
               "checkpoints are read as 8-bit 'float' (e4m3) weights");
  const std::string strategy = get_or<std::string>(w, "strategy", "");
  const auto blocks = w.find("block_structure");
  const bool block_128 = strategy == "block" && blocks != w.end() && *blocks == json::array({128, 128});
  DI_CHECK_ARG(block_128, at, ".weights: strategy '", strategy, "'", blocks != w.end() ? " block_structure " : "",
               blocks != w.end() ? blocks->dump() : "", " is not supported; FP8 weights are read with a scale per ",
               "128 x 128 block (strategy 'block', block_structure [128, 128], as DeepSeek's FP8 release)");
  DI_CHECK_ARG(!get_or<bool>(w, "dynamic", false) && get_or<bool>(w, "symmetric", true), at,
               ".weights: dynamic or asymmetric FP8 weight scales are not supported");
  const auto in = group.find("input_activations");
  if (in == group.end() || in->is_null()) return false;
  const std::string in_strategy = get_or<std::string>(*in, "strategy", "");
  DI_CHECK_ARG(get_or<int64_t>(*in, "num_bits", 0) == 8 && get_or<std::string>(*in, "type", "") == "float" &&
                   get_or<bool>(*in, "dynamic", false) &&
                   (in_strategy == "token" || (in_strategy == "group" && get_or<int64_t>(*in, "group_size", 0) == 128)),
               at, ".input_activations ", in->dump(), " is not supported: FP8 activations are quantized dynamically, ",
               "per token per 128 channels (strategy 'group', group_size 128, or 'token')");
  return true;
}

// compressed-tensors checkpoints (what llm-compressor writes): pack-quantized W4A16 integer weights, NVFP4 / MXFP4
// float weights, or block-scaled FP8 weights (float-quantized). Every config group must use one format and one
// scheme (the loader reads one group size and one symmetry from here; the tensors say which layers are quantized).
void parse_compressed_tensors(const json& q, ModelConfig& c) {
  const std::string where = "config.json: quantization_config";
  const std::string format = get_or<std::string>(q, "format", "");
  DI_CHECK_ARG(format == "pack-quantized" || format == "mixed-precision" || format == "float-quantized" ||
                   compressed_tensors_fp4(format) != Fp4Format::kNone,
               where, ".format '", format, "' is not supported: DeepInfer reads compressed-tensors' ",
               "'pack-quantized' 4-bit integer weights (W4A16), 'nvfp4-pack-quantized' / 'mxfp4-pack-quantized' ",
               "FP4 weights and 'float-quantized' block-scaled FP8 weights");
  auto groups = q.find("config_groups");
  DI_CHECK_ARG(groups != q.end() && groups->is_object() && !groups->empty(), where,
               ".config_groups is missing or empty");
  std::optional<std::string> common_format;  // every group's
  std::vector<std::string> targets;          // every group's, together
  std::optional<std::pair<int64_t, bool>> scheme;  // (group size, symmetric) shared by every group
  for (const auto& [name, group] : groups->items()) {
    const std::string at = str_cat(where, ".config_groups.", name);
    DI_CHECK_ARG(group.is_object(), at, " is not an object");
    const std::string group_format = get_or<std::string>(group, "format", format);
    const Fp4Format fp4 = compressed_tensors_fp4(group_format);
    DI_CHECK_ARG(group_format == "pack-quantized" || group_format == "float-quantized" || fp4 != Fp4Format::kNone,
                 at, ".format '", group_format, "' is not supported (the formats read are 'pack-quantized', "
                 "'nvfp4-pack-quantized', 'mxfp4-pack-quantized' and 'float-quantized')");
    DI_CHECK_ARG(!common_format || *common_format == group_format, at, ".format '", group_format, "' differs from ",
                 "another group's '", *common_format, "'; one quantized format for every layer is supported");
    common_format = group_format;
    for (std::string& t : string_list(group, "targets", at)) targets.push_back(std::move(t));
    auto w = group.find("weights");
    DI_CHECK_ARG(w != group.end() && w->is_object(), at, ".weights is missing: the group quantizes no weights");
    if (group_format == "float-quantized") {
      const bool activations = check_fp8_block_group(group, *w, at);
      DI_CHECK_ARG(!c.fp8.enabled || c.fp8.activations == activations, at, ": quantizes activations where another ",
                   "group does not (or the other way round); one FP8 scheme for every layer is supported");
      c.fp8 = {.enabled = true, .block_rows = 128, .block_cols = 128, .scale_fmt = "", .activations = activations};
      continue;
    }
    if (fp4 != Fp4Format::kNone) {
      check_fp4_group(*w, fp4, at);
      c.fp4 = {.format = fp4, .group_size = fp4 == Fp4Format::kNvfp4CompressedTensors ? 16 : 32};
      continue;
    }
    auto in = group.find("input_activations");
    DI_CHECK_ARG(in == group.end() || in->is_null(), at, ".input_activations: quantized activations are not "
                 "supported; DeepInfer loads weight-only 4-bit checkpoints (W4A16)");
    const int64_t bits = get_or<int64_t>(*w, "num_bits", 0);
    DI_CHECK_ARG(bits == 4, at, ".weights.num_bits is ", bits, ": only 4-bit weights are supported");
    const std::string type = get_or<std::string>(*w, "type", "");
    DI_CHECK_ARG(type == "int", at, ".weights.type '", type, "' is not supported (only 'int')");
    const std::string strategy = get_or<std::string>(*w, "strategy", "");
    DI_CHECK_ARG(strategy == "group" || strategy == "channel", at, ".weights.strategy '", strategy,
                 "' is not supported ('group' or 'channel')");
    // GPTQ's "weight" (alias "static") activation order permutes columns during calibration only: the groups stay
    // contiguous. "group" (alias "dynamic") stores permuted groups (weight_g_idx), which is not read.
    auto actorder = w->find("actorder");
    const bool contiguous_groups =
        actorder == w->end() || actorder->is_null() || (actorder->is_boolean() && !actorder->get<bool>()) ||
        (actorder->is_string() && (*actorder == "weight" || *actorder == "static"));
    DI_CHECK_ARG(contiguous_groups, at, ".weights.actorder ", actorder == w->end() ? "" : actorder->dump(),
                 ": activation-ordered groups (weight_g_idx) are not supported ('weight' / 'static' order is)");
    DI_CHECK_ARG(!get_or<bool>(*w, "dynamic", false), at, ".weights.dynamic: dynamic weight scales are not supported");
    int64_t group_size = -1;
    if (strategy == "group") {
      group_size = get_or<int64_t>(*w, "group_size", 0);
      DI_CHECK_ARG(group_size > 0, at, ".weights.group_size must be > 0 for the 'group' strategy, got ", group_size);
    }
    const std::pair<int64_t, bool> this_scheme{group_size, get_or<bool>(*w, "symmetric", true)};
    DI_CHECK_ARG(!scheme || *scheme == this_scheme, at, ": its weights (group_size ", group_size, ", symmetric ",
                 this_scheme.second, ") differ from another group's; one scheme for every layer is supported");
    scheme = this_scheme;
  }
  if (scheme) c.int4 = {.format = Int4Format::kCompressedTensors, .group_size = scheme->first, .symmetric = scheme->second};
  c.quantized_modules = QuantizedModules(QuantizedModules::Matching::kCompressedTensors, std::move(targets),
                                         string_list(q, "ignore", where), where);
}

// NVIDIA ModelOpt's export: config.json's quantization_config {quant_method: "modelopt", quant_algo, group_size}, or
// hf_quant_config.json's {"quantization": {quant_algo, group_size, exclude_modules}}. Its NVFP4 weights load
// weight-only (NVFP4 also quantizes activations, for Blackwell's FP4 tensor cores; Hopper has none).
void parse_modelopt(const json& q, std::string_view where, ModelConfig& c) {
  std::string algo = get_or<std::string>(q, "quant_algo", "");
  std::transform(algo.begin(), algo.end(), algo.begin(), [](unsigned char ch) { return std::toupper(ch); });
  DI_CHECK_ARG(algo == "NVFP4" || algo == "W4A16_NVFP4", where, ".quant_algo '", algo, "' is not supported: ",
               "DeepInfer loads ModelOpt's NVFP4 checkpoints ('NVFP4', 'W4A16_NVFP4'); its FP8 ones are not read");
  const int64_t group_size = get_or<int64_t>(q, "group_size", 16);
  DI_CHECK_ARG(group_size == 16, where, ".group_size is ", group_size, "; NVFP4 scales groups of 16");
  c.fp4 = {.format = Fp4Format::kNvfp4ModelOpt, .group_size = 16};
  c.quantized_modules = QuantizedModules(QuantizedModules::Matching::kGlob, {},
                                         string_list(q, "exclude_modules", where), where);
}

// AutoAWQ's GEMM layout with zero points (transformers' AwqConfig writes `bits`; AutoAWQ's own files `w_bit`).
void parse_awq(const json& q, ModelConfig& c) {
  const std::string where = "config.json: quantization_config";
  const int64_t bits = get_or<int64_t>(q, "bits", get_or<int64_t>(q, "w_bit", 0));
  DI_CHECK_ARG(bits == 4, where, ".bits is ", bits, ": AWQ checkpoints of 4-bit weights are supported");
  std::string version = get_or<std::string>(q, "version", "gemm");
  std::transform(version.begin(), version.end(), version.begin(), [](unsigned char ch) { return std::tolower(ch); });
  DI_CHECK_ARG(version == "gemm", where, ".version '", version, "' is not supported (AutoAWQ's 'gemm' layout is)");
  DI_CHECK_ARG(get_or<bool>(q, "zero_point", true), where,
               ".zero_point is false: AWQ without zero points is not supported");
  const int64_t group_size = get_or<int64_t>(q, "group_size", get_or<int64_t>(q, "q_group_size", 128));
  DI_CHECK_ARG(group_size > 0 || group_size == -1, where, ".group_size must be > 0 or -1, got ", group_size);
  c.int4 = {.format = Int4Format::kAwq, .group_size = group_size, .symmetric = false};
  std::vector<std::string> left_out = string_list(q, "modules_to_not_convert", where);
  for (std::string& name : string_list(q, "ignored_layers", where)) left_out.push_back(std::move(name));
  c.quantized_modules = QuantizedModules(QuantizedModules::Matching::kSubstring, {}, std::move(left_out), where);
}

void parse_quantization(const json& q, ModelConfig& c) {
  const std::string method = get_or<std::string>(q, "quant_method", "");
  if (method == "fp8") return parse_fp8(q, c);
  if (method == "compressed-tensors") return parse_compressed_tensors(q, c);
  if (method == "awq") return parse_awq(q, c);
  if (method == "modelopt") {
    // Older exports nest the settings under "quantization", as hf_quant_config.json does.
    const auto nested = q.find("quantization");
    return parse_modelopt(nested != q.end() && nested->is_object() ? *nested : q, "config.json: quantization_config",
                          c);
  }
  throw InvalidArgument(str_cat("config.json: quantization_config.quant_method '", method, "' is not supported: "
                                "DeepInfer loads 'fp8' (DeepSeek's block-scaled FP8), 'compressed-tensors' "
                                "(pack-quantized 4-bit integer or NVFP4 / MXFP4 weights), 'awq' (AutoAWQ GEMM) and "
                                "'modelopt' (NVFP4) checkpoints"));
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type == RopeType::kYarn && rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    DI_CHECK_ARG(v > 0, "config.json: '", name, "' must be > 0, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(kv_lora_rank, "kv_lora_rank");
  positive(qk_nope_head_dim, "qk_nope_head_dim");
  positive(qk_rope_head_dim, "qk_rope_head_dim");
  positive(v_head_dim, "v_head_dim");
  DI_CHECK_ARG(qk_rope_head_dim % 2 == 0, "config.json: qk_rope_head_dim must be even, got ", qk_rope_head_dim);
  if (q_lora_rank) positive(*q_lora_rank, "q_lora_rank");
  if (first_k_dense_replace > 0 || n_routed_experts == 0) positive(intermediate_size, "intermediate_size");
  if (n_routed_experts > 0) {
    positive(moe_intermediate_size, "moe_intermediate_size");
    positive(num_experts_per_tok, "num_experts_per_tok");
    positive(moe_layer_freq, "moe_layer_freq");
    DI_CHECK_ARG(n_shared_experts >= 0, "config.json: n_shared_experts must be >= 0, got ", n_shared_experts);
    DI_CHECK_ARG(num_experts_per_tok <= n_routed_experts, "config.json: num_experts_per_tok (", num_experts_per_tok,
                 ") exceeds n_routed_experts (", n_routed_experts, ")");
    DI_CHECK_ARG(n_group >= 1 && n_routed_experts % n_group == 0, "config.json: n_routed_experts (",
                 n_routed_experts, ") must be divisible by n_group (", n_group, ")");
    DI_CHECK_ARG(topk_group >= 1 && topk_group <= n_group, "config.json: topk_group (", topk_group,
                 ") must be in [1, n_group=", n_group, "]");
    DI_CHECK_ARG(num_experts_per_tok <= topk_group * (n_routed_experts / n_group) ||
                     topk_method == TopkMethod::kGreedy,
                 "config.json: num_experts_per_tok (", num_experts_per_tok, ") exceeds the experts in topk_group (",
                 topk_group, ") groups");
    if (topk_method == TopkMethod::kNoauxTc) {
      DI_CHECK_ARG(n_routed_experts / n_group >= 2, "config.json: noaux_tc routing needs >= 2 experts per group");
    }
  }
  DI_CHECK_ARG(rope.type != RopeType::kYarn || rope.factor >= 1.0, "config.json: yarn factor must be >= 1, got ",
               rope.factor);
}

ModelConfig parse_model_config(const json& j) {
  DI_CHECK_ARG(j.is_object(), "config.json: expected a JSON object");
  ModelConfig c;
  std::string arch;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  const std::string model_type = get_or<std::string>(j, "model_type", "");
  if (arch == "DeepseekV3ForCausalLM" || (arch.empty() && model_type == "deepseek_v3")) {
    c.version = ModelVersion::kV3;
  } else if (arch == "DeepseekV2ForCausalLM" || (arch.empty() && model_type == "deepseek_v2")) {
    c.version = ModelVersion::kV2;
  } else {
    throw InvalidArgument(str_cat("unsupported architecture '", arch.empty() ? model_type : arch,
                                  "': DeepInfer serves DeepseekV2ForCausalLM and DeepseekV3ForCausalLM"));
  }
  c.architecture = arch.empty() ? (c.version == ModelVersion::kV3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM")
                                : arch;
  c.vocab_size = require_int(j, "vocab_size");
  c.hidden_size = require_int(j, "hidden_size");
  c.intermediate_size = get_or<int64_t>(j, "intermediate_size", 0);
  c.moe_intermediate_size = get_or<int64_t>(j, "moe_intermediate_size", 0);
  c.num_hidden_layers = require_int(j, "num_hidden_layers");
  c.num_attention_heads = require_int(j, "num_attention_heads");
  if (auto it = j.find("q_lora_rank"); it != j.end() && it->is_number_integer()) c.q_lora_rank = it->get<int64_t>();
  c.kv_lora_rank = require_int(j, "kv_lora_rank");
  c.qk_nope_head_dim = require_int(j, "qk_nope_head_dim");
  c.qk_rope_head_dim = require_int(j, "qk_rope_head_dim");
  c.v_head_dim = require_int(j, "v_head_dim");
  c.n_routed_experts = get_or<int64_t>(j, "n_routed_experts", 0);
  c.n_shared_experts = get_or<int64_t>(j, "n_shared_experts", 0);
  c.num_experts_per_tok = get_or<int64_t>(j, "num_experts_per_tok", 0);
  c.n_group = get_or<int64_t>(j, "n_group", 1);
  c.topk_group = get_or<int64_t>(j, "topk_group", 1);
  c.first_k_dense_replace = get_or<int64_t>(j, "first_k_dense_replace", 0);
  c.moe_layer_freq = get_or<int64_t>(j, "moe_layer_freq", 1);
  c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
  c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
  c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings", 4096);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  c.num_nextn_predict_layers = get_or<int64_t>(j, "num_nextn_predict_layers", 0);
  c.torch_dtype = get_or<std::string>(j, "torch_dtype", get_or<std::string>(j, "dtype", ""));
  DI_CHECK_ARG(!get_or<bool>(j, "attention_bias", false), "config.json: attention_bias=true is not a DeepSeek layout");
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  DI_CHECK_ARG(act == "silu", "config.json: hidden_act '", act, "' is not supported (DeepSeek uses silu)");

  const std::string scoring =
      get_or<std::string>(j, "scoring_func", c.version == ModelVersion::kV3 ? "sigmoid" : "softmax");
  if (scoring == "sigmoid") {
    c.scoring = ExpertScoring::kSigmoid;
  } else if (scoring == "softmax") {
    c.scoring = ExpertScoring::kSoftmax;
  } else {
    throw InvalidArgument(str_cat("config.json: scoring_func '", scoring, "' is not supported"));
  }
  const std::string topk =
      get_or<std::string>(j, "topk_method", c.version == ModelVersion::kV3 ? "noaux_tc" : "greedy");
  if (c.version == ModelVersion::kV3) {
    DI_CHECK_ARG(topk == "noaux_tc", "config.json: topk_method '", topk, "' is not supported for V3 (noaux_tc)");
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (topk == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (topk == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else {
    throw InvalidArgument(str_cat("config.json: topk_method '", topk, "' is not supported for V2"));
  }
  c.rope = parse_rope(j);

  if (auto it = j.find("quantization_config"); it != j.end() && it->is_object()) parse_quantization(*it, c);
  if (auto it = j.find("eos_token_id"); it != j.end()) c.eos_token_ids = ids_of(*it);
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) c.bos_token_id = it->get<int32_t>();
  c.validate();
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  DI_CHECK_ARG(std::filesystem::is_directory(model_dir), "model path '", model_dir.string(),
               "' does not exist or is not a directory");
  const auto path = model_dir / "config.json";
  std::ifstream in(path);
  DI_CHECK_ARG(in.good(), "no config.json in '", model_dir.string(), "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidArgument(str_cat("'", path.string(), "' is not valid JSON: ", e.what()));
  }
  ModelConfig c = parse_model_config(j);
  // ModelOpt's exports before config.json carried their quantization_config describe it in hf_quant_config.json.
  const auto modelopt_path = model_dir / "hf_quant_config.json";
  if (std::ifstream mo(modelopt_path); mo.good() && !j.contains("quantization_config")) {
    const json m = json::parse(mo, nullptr, /*allow_exceptions=*/false);
    const auto q = m.is_object() ? m.find("quantization") : m.end();
    DI_CHECK_ARG(m.is_object() && q != m.end() && q->is_object(), "'", modelopt_path.string(), "' is not ModelOpt's ",
                 "quantization record (an object with a \"quantization\" object)");
    parse_modelopt(*q, "hf_quant_config.json: quantization", c);
  }
  const auto gen_path = model_dir / "generation_config.json";
  if (std::ifstream gen(gen_path); gen.good()) {
    json g = json::parse(gen, nullptr, /*allow_exceptions=*/false);
    if (g.is_object()) {
      if (auto it = g.find("eos_token_id"); it != g.end()) {
        for (int32_t id : ids_of(*it)) {
          if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
            c.eos_token_ids.push_back(id);
          }
        }
      }
    }
  }
  return c;
}

}  // namespace deepinfer
