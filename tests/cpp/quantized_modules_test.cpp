// Which linear modules a quantized checkpoint's config lists as quantized: each library's matching rules, the
// config fields they come from, and the FP4 rounding source leaving the excluded layers' values as they are.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/fp4_source.h"
#include "model/quantized_modules.h"
#include "model/weights.h"

namespace deepinfer {
namespace {

using Matching = QuantizedModules::Matching;

constexpr const char* kQB = "model.layers.3.self_attn.q_b_proj";
constexpr const char* kKvA = "model.layers.3.self_attn.kv_a_proj_with_mqa";
constexpr const char* kExpert = "model.layers.3.mlp.experts.7.down_proj";
constexpr const char* kShared = "model.layers.3.mlp.shared_experts.gate_proj";

TEST(QuantizedModules, EveryModuleWithoutLists) {
  const QuantizedModules all;
  EXPECT_FALSE(all.has_exclusions());
  for (const char* m : {kQB, kKvA, kExpert, "lm_head"}) EXPECT_TRUE(all.quantizes(m)) << m;
}

TEST(QuantizedModules, CompressedTensorsMatchesRegexFromTheStartAndNamesExactly) {
  const QuantizedModules q(Matching::kCompressedTensors, {"Linear"},
                           {"lm_head", "re:.*kv_a_proj_with_mqa$", "re:layers\\.3", "model.layers.3.self_attn"},
                           "quantization_config");
  EXPECT_TRUE(q.has_exclusions());
  EXPECT_TRUE(q.quantizes(kQB));  // "re:layers\.3" does not match at the name's start; the parent's name is not it
  EXPECT_FALSE(q.quantizes(kKvA));
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_TRUE(q.quantizes("model.lm_head"));  // a plain name is matched whole
  EXPECT_TRUE(q.quantizes(kExpert));

  const QuantizedModules attention_only(Matching::kCompressedTensors, {"re:.*self_attn\\..*"}, {}, "q");
  EXPECT_TRUE(attention_only.quantizes(kQB));
  EXPECT_FALSE(attention_only.quantizes(kExpert));
  EXPECT_FALSE(attention_only.quantizes(kShared));
}

TEST(QuantizedModules, FusedExpertTensorsAnswerAsTheirFirstExpert) {
  const QuantizedModules q(Matching::kCompressedTensors, {"Linear"}, {"re:.*experts\\.0\\.down_proj"}, "q");
  EXPECT_FALSE(q.quantizes("model.layers.3.mlp.experts.down_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.3.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(q.quantizes(kExpert));
}

TEST(QuantizedModules, AwqKeysMatchAnywhereInTheName) {
  const QuantizedModules q(Matching::kSubstring, {}, {"kv_a_proj", "shared_experts"}, "q");
  EXPECT_FALSE(q.quantizes(kKvA));
  EXPECT_FALSE(q.quantizes(kShared));
  EXPECT_TRUE(q.quantizes(kQB));
  EXPECT_TRUE(q.quantizes(kExpert));
}

TEST(QuantizedModules, ModelOptGlobsMatchTheNameOrADottedPrefix) {
  const QuantizedModules q(Matching::kGlob, {}, {"lm_head", "model.layers.?.self_attn*", "*.mlp.shared_experts"},
                           "q");
  EXPECT_FALSE(q.quantizes(kQB));
  EXPECT_FALSE(q.quantizes(kKvA));
  EXPECT_FALSE(q.quantizes(kShared));  // its parent "model.layers.3.mlp.shared_experts" is excluded
  EXPECT_TRUE(q.quantizes(kExpert));
  EXPECT_TRUE(q.quantizes("model.layers.13.self_attn.o_proj"));  // '?' is one character
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_TRUE(q.quantizes("lm_head_extra.proj"));  // a prefix ends at a dot
}

TEST(QuantizedModules, ABadRegexIsRefusedNamingTheField) {
  try {
    QuantizedModules(Matching::kCompressedTensors, {}, {"re:(unclosed"}, "quantization_config.ignore");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("quantization_config.ignore"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("re:(unclosed"), std::string::npos) << e.what();
  }
  // Outside compressed-tensors "re:" is no prefix: AWQ's keys are plain text.
  EXPECT_NO_THROW(QuantizedModules(Matching::kSubstring, {}, {"re:(unclosed"}, "q"));
}

TEST(QuantizedModules, ModuleOfStripsTheWeightSuffix) {
  EXPECT_EQ(module_of("model.layers.0.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj");
  EXPECT_EQ(module_of("model.layers.0.mlp.experts.down_proj"), "model.layers.0.mlp.experts.down_proj");
}

// ------------------------------------------------------------------------------------- from config.json

nlohmann::json tiny_config(const nlohmann::json& quantization) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}}, {"vocab_size", 32}, {"hidden_size", 64},
          {"intermediate_size", 64}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"kv_lora_rank", 32},
          {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 16}, {"v_head_dim", 16},
          {"quantization_config", quantization}};
}

nlohmann::json ct_int4(const nlohmann::json& targets, const nlohmann::json& ignore) {
  return {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
          {"config_groups", {{"group_0", {{"targets", targets},
                                          {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true},
                                                       {"strategy", "group"}, {"group_size", 32}}}}}}},
          {"ignore", ignore}};
}

nlohmann::json ct_nvfp4(const nlohmann::json& ignore) {
  return {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}},
                                          {"weights", {{"num_bits", 4}, {"type", "float"}, {"symmetric", true},
                                                       {"strategy", "tensor_group"}, {"group_size", 16}}}}}}},
          {"ignore", ignore}};
}

TEST(QuantizedModulesConfig, CompressedTensorsTakesEveryGroupsTargetsLessIgnore) {
  const ModelConfig c = parse_model_config(tiny_config(ct_int4({"re:.*mlp\\..*"}, {"re:.*down_proj"})));
  EXPECT_TRUE(c.quantized_modules.quantizes("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(c.quantized_modules.quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(c.quantized_modules.quantizes("model.layers.0.self_attn.o_proj"));  // no group targets it
}

TEST(QuantizedModulesConfig, AwqFp8AndModelOptListsAreRead) {
  const ModelConfig fp8 = parse_model_config(tiny_config(
      {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"modules_to_not_convert", {"self_attn.o_proj"}}}));
  EXPECT_TRUE(fp8.fp8.enabled);
  EXPECT_FALSE(fp8.quantized_modules.quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_TRUE(fp8.quantized_modules.quantizes("model.layers.0.self_attn.q_b_proj"));
  // vLLM's key for the same list, beside transformers' own.
  const ModelConfig fp8_vllm = parse_model_config(tiny_config(
      {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"modules_to_not_convert", {"self_attn.o_proj"}},
       {"ignored_layers", {"model.layers.1.mlp.down_proj"}}}));
  EXPECT_FALSE(fp8_vllm.quantized_modules.quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(fp8_vllm.quantized_modules.quantizes("model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(fp8_vllm.quantized_modules.quantizes("model.layers.11.mlp.down_proj"));

  const ModelConfig awq = parse_model_config(tiny_config(
      {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"version", "gemm"}, {"zero_point", true},
       {"modules_to_not_convert", {"self_attn"}}}));
  EXPECT_FALSE(awq.quantized_modules.quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_TRUE(awq.quantized_modules.quantizes("model.layers.0.mlp.down_proj"));

  const ModelConfig modelopt = parse_model_config(tiny_config(
      {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
       {"exclude_modules", {"lm_head", "model.layers.0.self_attn*"}}}));
  EXPECT_FALSE(modelopt.quantized_modules.quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_TRUE(modelopt.quantized_modules.quantizes("model.layers.0.mlp.down_proj"));

  const ModelConfig none_listed = parse_model_config(tiny_config(
      {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"version", "gemm"}, {"zero_point", true},
       {"modules_to_not_convert", nullptr}}));
  EXPECT_FALSE(none_listed.quantized_modules.has_exclusions());
}

TEST(QuantizedModulesConfig, AListThatIsNotOneOfNamesIsRefused) {
  EXPECT_THROW(parse_model_config(tiny_config(ct_int4({"Linear"}, "lm_head"))), InvalidArgument);
  EXPECT_THROW(parse_model_config(tiny_config(ct_int4({"Linear"}, {"lm_head", 3}))), InvalidArgument);
  EXPECT_THROW(parse_model_config(tiny_config(ct_int4({"Linear"}, {"re:[z-a]"}))), InvalidArgument);
}

TEST(QuantizedModulesConfig, TheFp4RoundingSourceLeavesExcludedLayersUnrounded) {
  const ModelConfig c = parse_model_config(tiny_config(ct_nvfp4({"lm_head", "re:.*o_proj$"})));
  ASSERT_TRUE(c.fp4.enabled());
  const std::unique_ptr<WeightSource> plain = make_dummy_source(5);
  const std::unique_ptr<WeightSource> rounded =
      make_fp4_rounding_source(make_dummy_source(5), c.fp4, c.quantized_modules);
  const std::vector<int64_t> shape{8, 64};
  std::vector<float> raw(8 * 64), values(8 * 64);

  const std::string excluded = "model.layers.0.self_attn.o_proj.weight";
  EXPECT_FALSE(rounded->int4_form(excluded).has_value());
  plain->read_rows(excluded, shape, 0, 8, raw);
  rounded->read_rows(excluded, shape, 0, 8, values);
  EXPECT_EQ(values, raw);

  const std::string quantized = "model.layers.0.self_attn.q_b_proj.weight";
  ASSERT_TRUE(rounded->int4_form(quantized).has_value());
  plain->read_rows(quantized, shape, 0, 8, raw);
  rounded->read_rows(quantized, shape, 0, 8, values);
  EXPECT_NE(values, raw);  // random values rounded to e2m1 times a group scale
}

}  // namespace
}  // namespace deepinfer
