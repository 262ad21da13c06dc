// 4-bit weights on the host: the compressed-tensors and AWQ nibble orders pinned by hand-written words, dequantization
// against a packer written here from the layouts' definitions, round-to-nearest INT4, and the checkpoint source's
// checks of packed tensors (before a weight is read).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/e2m1.h"
#include "core/error.h"
#include "core/int4.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/fp4_source.h"
#include "model/int4.h"
#include "backend/cpu/weight_values.h"
#include "model/int4_source.h"
#include "model/model_shard.h"
#include "model/sharded_source.h"
#include "model/weight_sink.h"
#include "model/weights.h"
#include "safetensors_writer.h"

namespace deepinfer {
namespace {

using namespace test;  // NOLINT: the shared test helpers

std::span<const std::byte> as_bytes(const std::vector<int32_t>& words) {
  return std::as_bytes(std::span<const int32_t>(words));
}

// compressed-tensors' packing: 8 values a word along the packed dimension, value i in bits 4 (i % 8) .. + 3, each
// stored as q + 8. `q` is [rows, cols]; packed along cols.
std::vector<int32_t> pack_ct_rows(const std::vector<int>& q, int64_t rows, int64_t cols) {
  const int64_t words = (cols + 7) / 8;
  std::vector<uint32_t> out(static_cast<size_t>(rows * words), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[static_cast<size_t>(r * words + c / 8)] |= static_cast<uint32_t>(q[static_cast<size_t>(r * cols + c)] + 8)
                                                     << (4 * (c % 8));
    }
  }
  return {out.begin(), out.end()};
}

// AWQ's packing of a [rows, cols] matrix of unsigned values along cols: nibble j of word c / 8 holds column
// 8 (c / 8) + kAwqColumnOfNibble[j] (AutoAWQ's order_map).
std::vector<int32_t> pack_awq_rows(const std::vector<int>& q, int64_t rows, int64_t cols) {
  std::vector<uint32_t> out(static_cast<size_t>(rows * cols / 8), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t w = 0; w < cols / 8; ++w) {
      for (int j = 0; j < 8; ++j) {
        const int64_t c = 8 * w + kAwqColumnOfNibble[static_cast<size_t>(j)];
        out[static_cast<size_t>(r * cols / 8 + w)] |= static_cast<uint32_t>(q[static_cast<size_t>(r * cols + c)])
                                                      << (4 * j);
      }
    }
  }
  return {out.begin(), out.end()};
}

TEST(Int4Layout, CompressedTensorsPutsTheFirstValueInTheLowNibble) {
  // Row values q = k - 8 for k = 0..7 (stored k): the word reads 0x76543210.
  const std::vector<int32_t> words{0x76543210};
  const std::vector<float> scales{1.0f};
  std::vector<float> out(8);
  dequantize_int4_rows({.layout = Int4Layout::kCompressedTensors, .rows = 1, .cols = 8, .group_size = 8,
                        .qweight = as_bytes(words), .scales = scales},
                       0, 1, out);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(out[static_cast<size_t>(k)], static_cast<float>(k - 8)) << k;
}

TEST(Int4Layout, AwqInterleavesTheColumnsOfAWord) {
  // Columns 0..7 holding 0..7: nibbles in the order 0 2 4 6 1 3 5 7 read 0x75316420; zero points 0, scale 1.
  const std::vector<int32_t> words{0x75316420}, zeros{0};
  const std::vector<float> scales(8, 1.0f);
  std::vector<float> out(8);
  dequantize_int4_rows({.layout = Int4Layout::kAwq, .rows = 8, .cols = 1, .group_size = 1, .qweight = as_bytes(words),
                        .zeros = as_bytes(zeros), .scales = scales},
                       0, 8, out);  // W is [N = 8, K = 1]: row n is column n of the stored [K, N]
  for (int n = 0; n < 8; ++n) EXPECT_EQ(out[static_cast<size_t>(n)], static_cast<float>(n)) << n;
}

TEST(Int4Dequantize, CompressedTensorsGroupsAndZeroPoints) {
  // N = 11 (zero points take two words along N), K = 20 (rows end in a partly filled word), groups of 10.
  const int64_t n = 11, k = 20, g = 10, groups = k / g;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> value(-8, 7);
  std::vector<int> q(static_cast<size_t>(n * k)), z(static_cast<size_t>(n * groups));
  for (int& v : q) v = value(rng);
  for (int& v : z) v = value(rng);
  std::vector<float> scales(static_cast<size_t>(n * groups));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f * static_cast<float>(i + 1);
  // weight_zero_point is [N, K / G] packed along N: transpose, pack rows of N, transpose back.
  std::vector<int> z_t(static_cast<size_t>(groups * n));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < groups; ++c) z_t[static_cast<size_t>(c * n + r)] = z[static_cast<size_t>(r * groups + c)];
  }
  const std::vector<int32_t> zt_words = pack_ct_rows(z_t, groups, n);  // [groups, ceil(N / 8)]
  const int64_t zn = (n + 7) / 8;
  std::vector<int32_t> z_words(static_cast<size_t>(zn * groups));
  for (int64_t c = 0; c < groups; ++c) {
    for (int64_t w = 0; w < zn; ++w) z_words[static_cast<size_t>(w * groups + c)] = zt_words[static_cast<size_t>(c * zn + w)];
  }
  const std::vector<int32_t> words = pack_ct_rows(q, n, k);
  const PackedInt4 packed{.layout = Int4Layout::kCompressedTensors, .rows = n, .cols = k, .group_size = g,
                          .qweight = as_bytes(words), .zeros = as_bytes(z_words), .scales = scales};
  std::vector<float> all(static_cast<size_t>(n * k));
  dequantize_int4_rows(packed, 0, n, all);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const size_t s = static_cast<size_t>(r * groups + c / g);
      EXPECT_EQ(all[static_cast<size_t>(r * k + c)],
                static_cast<float>(q[static_cast<size_t>(r * k + c)] - z[s]) * scales[s])
          << r << ", " << c;
    }
  }
  std::vector<float> part(static_cast<size_t>(3 * k));
  dequantize_int4_rows(packed, 7, 3, part);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 7 * k));
  // Symmetric: no zero points.
  std::vector<float> row(static_cast<size_t>(k));
  dequantize_int4_rows({.layout = Int4Layout::kCompressedTensors, .rows = n, .cols = k, .group_size = g,
                        .qweight = as_bytes(words), .scales = scales},
                       0, 1, row);
  EXPECT_EQ(row[0], static_cast<float>(q[0]) * scales[0]);
  expect_error([&] { dequantize_int4_rows({.layout = Int4Layout::kCompressedTensors, .rows = n, .cols = k,
                                           .group_size = 6, .qweight = as_bytes(words), .scales = scales},
                                          0, 1, row); },
               {"with group size 6: the group size must divide K"});
}

TEST(Int4Dequantize, AwqGroupsAndZeroPoints) {
  const int64_t n = 24, k = 6, g = 3, groups = k / g;  // stored qweight [K, N / 8]
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> value(0, 15);
  std::vector<int> q(static_cast<size_t>(k * n)), z(static_cast<size_t>(groups * n));  // [K, N], [K / G, N]
  for (int& v : q) v = value(rng);
  for (int& v : z) v = value(rng);
  std::vector<float> scales(static_cast<size_t>(groups * n));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.5f + 0.125f * static_cast<float>(i);
  const std::vector<int32_t> words = pack_awq_rows(q, k, n), z_words = pack_awq_rows(z, groups, n);
  const PackedInt4 packed{.layout = Int4Layout::kAwq, .rows = n, .cols = k, .group_size = g,
                          .qweight = as_bytes(words), .zeros = as_bytes(z_words), .scales = scales};
  std::vector<float> out(static_cast<size_t>(5 * k));
  dequantize_int4_rows(packed, 9, 5, out);  // rows 9..13 of W [N, K]: columns of the stored [K, N]
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t col = 9 + r;
      const size_t s = static_cast<size_t>((c / g) * n + col);
      EXPECT_EQ(out[static_cast<size_t>(r * k + c)],
                static_cast<float>(q[static_cast<size_t>(c * n + col)] - z[s]) * scales[s])
          << r << ", " << c;
    }
  }
}

// ---------------------------------------------------------------------------------------------- rounding

TEST(Int4Rounding, AsymmetricGroupsKeepZeroAndTheirEnds) {
  // Group [-1.5, 3]: s = 0.3, z = 5; the ends and 0 are codes 0, 15 and 5.
  std::vector<float> x{0.0f, 3.0f, -1.5f, 0.7f, /* second group */ 2.0f, 2.0f, 2.0f, 2.0f};
  round_int4(x, 8, {.group_size = 4});
  const float s = 4.5f / 15.0f;
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_FLOAT_EQ(x[1], 10.0f * s);
  EXPECT_FLOAT_EQ(x[2], -5.0f * s);
  EXPECT_FLOAT_EQ(x[3], 2.0f * s);  // 0.7 / 0.3 = 2.33 -> 2
  for (int i = 4; i < 8; ++i) EXPECT_FLOAT_EQ(x[static_cast<size_t>(i)], 2.0f);  // [0, 2]: s = 2 / 15, 2 is code 15
}

TEST(Int4Rounding, ErrorsAreWithinHalfAStepAndRoundingIsIdempotent) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int64_t rows = 6, cols = 64;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(rng);
  for (const Int4Rounding r : {Int4Rounding{.group_size = 16}, Int4Rounding{.group_size = -1},
                               Int4Rounding{.group_size = 32, .symmetric = true}}) {
    std::vector<float> y = x;
    round_int4(y, cols, r);
    const int64_t g = r.group_size == -1 ? cols : r.group_size;
    for (int64_t b = 0; b < rows * cols / g; ++b) {
      float lo = 0, hi = 0, amax = 0;
      for (int64_t i = b * g; i < (b + 1) * g; ++i) {
        lo = std::min(lo, x[static_cast<size_t>(i)]);
        hi = std::max(hi, x[static_cast<size_t>(i)]);
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
      }
      const float step = r.symmetric ? amax / 7 : (hi - lo) / 15;
      std::set<float> levels;
      for (int64_t i = b * g; i < (b + 1) * g; ++i) {
        EXPECT_LE(std::fabs(y[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]), 0.5f * step * 1.0001f);
        levels.insert(y[static_cast<size_t>(i)]);
      }
      EXPECT_LE(levels.size(), 16u);
    }
    std::vector<float> again = y;
    round_int4(again, cols, r);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(again[i], y[i], 1e-6f) << i;
  }
  std::vector<float> zeros(32, 0.0f);
  round_int4(zeros, 32, {.group_size = 8});
  round_int4(zeros, 32, {.group_size = 8, .symmetric = true});
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
  expect_error([&] { round_int4(zeros, 32, {.group_size = 12}); }, {"group size 12 does not divide rows of 32"});
}

TEST(Int4Rounding, AppliesToTheProjectionsOnly) {
  for (const char* name : {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_b_proj.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
                           "model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.1.mlp.experts.gate_up_proj",
                           "model.layers.3.eh_proj.weight"}) {
    EXPECT_TRUE(is_int4_linear(name)) << name;
  }
  for (const char* name : {"model.layers.1.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                           "model.layers.0.input_layernorm.weight", "model.layers.1.mlp.gate.e_score_correction_bias"}) {
    EXPECT_FALSE(is_int4_linear(name)) << name;
  }
}

// ---------------------------------------------------------------------------------------------- the checkpoint

nlohmann::json tiny_config(const nlohmann::json& quantization) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}}, {"vocab_size", 32}, {"hidden_size", 16},
          {"intermediate_size", 24}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"kv_lora_rank", 8},
          {"qk_nope_head_dim", 4}, {"qk_rope_head_dim", 4}, {"v_head_dim", 4}, {"quantization_config", quantization}};
}

nlohmann::json ct_quantization(bool symmetric, int64_t group_size) {
  return {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}},
                                          {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", symmetric},
                                                       {"strategy", "group"}, {"group_size", group_size}}}}}}},
          {"ignore", {"lm_head"}}};
}

// One compressed-tensors weight "m.weight" [n, k] with float32 scales, and a plain "p.weight".
std::vector<RawTensor> ct_tensors(int64_t n, int64_t k, int64_t g, const std::vector<int>& q, bool zeros) {
  std::vector<float> scales(static_cast<size_t>(n * (k / g)), 0.25f);
  std::vector<RawTensor> t{
      {"m.weight_packed", "I32", {n, (k + 7) / 8}, to_bytes(pack_ct_rows(q, n, k))},
      {"m.weight_scale", "F32", {n, k / g}, to_bytes(scales)},
      {"m.weight_shape", "I64", {2}, to_bytes(std::vector<int64_t>{n, k})},
      {"p.weight", "F32", {2, 2}, to_bytes(std::vector<float>{1, 2, 3, 4})}};
  if (zeros) {
    // Zero point 1 everywhere (stored 9): [ceil(N / 8), K / G] words of 0x99999999.
    t.push_back({"m.weight_zero_point", "I32", {(n + 7) / 8, k / g},
                 to_bytes(std::vector<int32_t>(static_cast<size_t>((n + 7) / 8 * (k / g)),
                                               static_cast<int32_t>(0x99999999u)))});
  }
  return t;
}

TEST(Int4Checkpoint, ReadsPackedWeightsByTheirPlainNames) {
  TempDir dir;
  const int64_t n = 8, k = 16, g = 8;
  std::vector<int> q(static_cast<size_t>(n * k));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int>(i % 16) - 8;
  write_safetensors(dir.path() / "model.safetensors", ct_tensors(n, k, g, q, /*zeros=*/true),
                    nullptr, HeaderPadding::kOdd);  // unaligned words
  const ModelConfig config = parse_model_config(tiny_config(ct_quantization(false, g)));
  ASSERT_EQ(config.int4.format, Int4Format::kCompressedTensors);
  const auto source = open_int4_checkpoint_source(Checkpoint::open(dir.path()), config);
  EXPECT_TRUE(source->contains("m.weight"));
  EXPECT_EQ(*source->stored_shape("m.weight"), (std::vector<int64_t>{n, k}));
  std::vector<float> w(static_cast<size_t>(n * k));
  source->read(std::string("m.weight"), std::vector<int64_t>{n, k}, w);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], static_cast<float>(q[i] - 1) * 0.25f) << i;
  std::vector<float> p(4);
  source->read(std::string("p.weight"), std::vector<int64_t>{2, 2}, p);  // stays as stored
  EXPECT_EQ(p, (std::vector<float>{1, 2, 3, 4}));
  expect_error([&] { source->read(std::string("m.weight"), std::vector<int64_t>{k, n}, w); },
               {"m.weight", "m.weight_packed", "[8, 16]", "expected [16, 8]"});
}

TEST(Int4Checkpoint, BadPackedTensorsFailWhenOpened) {
  const int64_t n = 8, k = 16;
  const std::vector<int> q(static_cast<size_t>(n * k), 0);
  const auto open = [](const std::vector<RawTensor>& tensors, const nlohmann::json& quantization) {
    TempDir dir;
    write_safetensors(dir.path() / "model.safetensors", tensors);
    return open_int4_checkpoint_source(Checkpoint::open(dir.path()), parse_model_config(tiny_config(quantization)));
  };
  std::vector<RawTensor> t = ct_tensors(n, k, 8, q, true);
  t[2].bytes = to_bytes(std::vector<int64_t>{n, 24});  // weight_shape disagrees with weight_packed
  expect_error([&] { open(t, ct_quantization(false, 8)); },
               {"m.weight_packed has shape [8, 2]", "m.weight_shape is [8, 24]", "[8, 3]"});
  expect_error([&] { open(ct_tensors(n, k, 8, q, true), ct_quantization(false, 6)); },
               {"group_size 6", "does not divide K = 16", "m"});
  expect_error([&] { open(ct_tensors(n, k, 8, q, false), ct_quantization(false, 8)); },
               {"m.weight_packed has no m.weight_zero_point"});
  t = ct_tensors(n, k, 8, q, true);
  t[1].shape = {n, 1};
  t[1].bytes = to_bytes(std::vector<float>(static_cast<size_t>(n), 1.0f));
  expect_error([&] { open(t, ct_quantization(false, 8)); }, {"m.weight_scale has shape [8, 1], expected [8, 2]"});
  EXPECT_NO_THROW(open(ct_tensors(n, k, 8, q, false), ct_quantization(true, 8)));
  // AWQ: qweight [K, N / 8], qzeros [K / G, N / 8], scales [K / G, N].
  nlohmann::json awq = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 8}, {"zero_point", true},
                        {"version", "gemm"}};
  const std::vector<RawTensor> awq_tensors{
      {"m.qweight", "I32", {k, n / 8}, to_bytes(std::vector<int32_t>(static_cast<size_t>(k * n / 8)))},
      {"m.qzeros", "I32", {k / 8, n / 8}, to_bytes(std::vector<int32_t>(static_cast<size_t>(k / 8 * n / 8)))},
      {"m.scales", "F16", {k / 8, n}, to_bytes(std::vector<uint16_t>(static_cast<size_t>(k / 8 * n), 0x3c00))}};
  EXPECT_NO_THROW(open(awq_tensors, awq));
  awq["group_size"] = 3;
  expect_error([&] { open(awq_tensors, awq); }, {"group_size 3", "does not divide K = 16"});
}

TEST(Int4Config, RefusesWhatItCannotLoad) {
  const auto parse = [](const nlohmann::json& q) { return parse_model_config(tiny_config(q)); };
  nlohmann::json q = ct_quantization(true, 32);
  q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  expect_error([&] { parse(q); }, {"config_groups.group_0.weights.num_bits is 8", "only 4-bit"});
  q = ct_quantization(true, 32);
  q["format"] = "int-quantized";  // compressed-tensors' INT8 (W8A8) layout
  expect_error([&] { parse(q); }, {"format 'int-quantized' is not supported"});
  q = ct_quantization(true, 32);
  q["format"] = "float-quantized";  // block FP8 is read; these 4-bit int weights are not FP8
  expect_error([&] { parse(q); }, {"group_0.weights is 4-bit 'int'", "8-bit 'float'"});
  q = ct_quantization(true, 32);
  q["config_groups"]["group_0"]["weights"]["actorder"] = "group";
  expect_error([&] { parse(q); }, {"actorder"});
  for (const char* order : {"weight", "static"}) {  // GPTQ's calibration-time order: the groups stay contiguous
    q["config_groups"]["group_0"]["weights"]["actorder"] = order;
    EXPECT_EQ(parse(q).int4.group_size, 32) << order;
  }
  q = ct_quantization(true, 32);
  q["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  EXPECT_EQ(parse(q).int4.group_size, -1);
  expect_error([&] { parse({{"quant_method", "awq"}, {"bits", 3}}); }, {"quantization_config.bits is 3"});
  expect_error([&] { parse({{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}}); },
               {"version 'gemv' is not supported"});
  expect_error([&] { parse({{"quant_method", "gptq"}}); }, {"quant_method 'gptq' is not supported"});
  const ModelConfig awq = parse({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 64}, {"zero_point", true}});
  EXPECT_EQ(awq.int4.format, Int4Format::kAwq);
  EXPECT_EQ(awq.int4.group_size, 64);
}

TEST(Int4Config, RoundingGroupsMustDivideEveryInputSize) {
  const ModelConfig c = parse_model_config(tiny_config(nullptr));  // K: 16 (hidden), 8 (kv_lora_rank), 8, 24
  EXPECT_NO_THROW(check_int4_rounding(c, {.group_size = 8}));
  EXPECT_NO_THROW(check_int4_rounding(c, {.group_size = -1}));
  expect_error([&] { check_int4_rounding(c, {.group_size = 16}); }, {"group_size 16 does not divide K = 8 of kv_b_proj"});
  expect_error([&] { check_int4_rounding(c, {.group_size = 0}); }, {"group_size must be > 0 or -1"});
}

// ---------------------------------------------------------------------------------------------- packed rows

// Random Int4Rows: codes, positive scales, zero points (asymmetric).
Int4Rows random_rows(std::mt19937& rng, int64_t rows, int64_t cols, int64_t group, bool symmetric) {
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.01f, 1.0f);
  Int4Rows r;
  r.resize(rows, cols, group, symmetric);
  for (uint8_t& q : r.q) q = static_cast<uint8_t>(code(rng));
  for (float& s : r.scales) s = scale(rng);
  for (uint8_t& z : r.zeros) z = static_cast<uint8_t>(code(rng));
  return r;
}

TEST(Int4Packing, TheEnginesWordsHoldTheInterleavedNibbleOrder) {
  // Inputs 0..7 holding codes 0..7: nibble j holds input {0, 2, 4, 6, 1, 3, 5, 7}[j], so the word reads 0x75316420
  // (AutoAWQ's order, which the kernels' unpacking turns into consecutive pairs).
  Int4Rows r;
  r.resize(1, 8, 8, true);
  for (int k = 0; k < 8; ++k) r.q[static_cast<size_t>(k)] = static_cast<uint8_t>(k);
  std::vector<int32_t> word(1);
  pack_int4_codes(r, word);
  EXPECT_EQ(static_cast<uint32_t>(word[0]), 0x75316420u);
  // Zero points in plain order: group g in nibble g % 8.
  r.resize(1, 80, 8, false);
  for (int g = 0; g < 10; ++g) r.zeros[static_cast<size_t>(g)] = static_cast<uint8_t>(g + 1);
  std::vector<int32_t> zeros(2);
  pack_int4_zeros(r, zeros);
  EXPECT_EQ(static_cast<uint32_t>(zeros[0]), 0x87654321u);
  EXPECT_EQ(static_cast<uint32_t>(zeros[1]), 0x000000a9u);
}

TEST(Int4Packing, PackedWeightsDequantizeToTheirRows) {
  std::mt19937 rng(11);
  for (const bool symmetric : {false, true}) {
    for (const int64_t group : {8, 32, 128}) {
      const int64_t rows = 5, cols = 256;
      const Int4Rows r = random_rows(rng, rows, cols, group, symmetric);
      std::vector<int32_t> words(static_cast<size_t>(rows * cols / 8));
      std::vector<int32_t> zeros(symmetric ? 0 : static_cast<size_t>(rows * int4_zero_words(cols / group)));
      pack_int4_codes(r, words);
      if (!symmetric) pack_int4_zeros(r, zeros);
      std::vector<float> expected(static_cast<size_t>(rows * cols)), got(expected.size());
      r.dequantize(expected);
      dequantize_packed_int4(words, r.scales, zeros, rows, cols, group, got);
      EXPECT_EQ(got, expected) << "group " << group << (symmetric ? " symmetric" : "");
      // The same weight as a host WeightView, as the CPU ops read it.
      const ConstTensorView codes(words.data(), DType::kU4, {rows, cols}, Device::kCpu);
      const ConstTensorView scales(r.scales.data(), DType::kF32, {rows, cols / group}, Device::kCpu);
      const ConstTensorView zero_view = symmetric ? ConstTensorView()
          : ConstTensorView(zeros.data(), DType::kI32, {rows, int4_zero_words(cols / group)}, Device::kCpu);
      std::vector<float> scratch;
      const float* values = cpu::weight_values(WeightView(codes, scales, zero_view), scratch);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), values));
      // A column slice on group edges is the same weight's columns.
      const int64_t half = cols / 2;
      const Int4Rows part = r.columns(half, half);
      std::vector<float> part_values(static_cast<size_t>(rows * half));
      part.dequantize(part_values);
      for (int64_t row = 0; row < rows; ++row) {
        EXPECT_TRUE(std::equal(part_values.begin() + row * half, part_values.begin() + (row + 1) * half,
                               expected.begin() + row * cols + half));
      }
    }
  }
  const Int4Rows r = random_rows(rng, 2, 64, 16, false);
  expect_error([&] { (void)r.columns(8, 16); }, {"columns [8, 24)", "groups of 16"});
}

TEST(Int4Packing, StoredWeightsUnpackToWhatTheyDequantizeTo) {
  // compressed-tensors (signed codes, zero points packed along N; and symmetric) and AWQ (transposed words), rows
  // read in a range: unpacked rows dequantize to exactly dequantize_int4_rows' values.
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> value(-8, 7), unsigned_value(0, 15);
  const int64_t n = 16, k = 32, g = 8, groups = k / g;
  std::vector<int> q(static_cast<size_t>(n * k));
  for (int& v : q) v = value(rng);
  const std::vector<int32_t> words = pack_ct_rows(q, n, k);
  std::vector<int> z(static_cast<size_t>(groups * n));  // [groups, N]: packed along N
  for (int& v : z) v = value(rng);
  const std::vector<int32_t> zt = pack_ct_rows(z, groups, n);  // [groups, N / 8]
  std::vector<int32_t> z_words(static_cast<size_t>(n / 8 * groups));  // [N / 8, groups]
  for (int64_t c = 0; c < groups; ++c) {
    for (int64_t w = 0; w < n / 8; ++w) z_words[static_cast<size_t>(w * groups + c)] = zt[static_cast<size_t>(c * (n / 8) + w)];
  }
  std::vector<float> scales(static_cast<size_t>(n * groups));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.03f * static_cast<float>(i + 1);
  std::vector<int> awq_q(static_cast<size_t>(k * n)), awq_z(static_cast<size_t>(groups * n));
  for (int& v : awq_q) v = unsigned_value(rng);
  for (int& v : awq_z) v = unsigned_value(rng);
  const std::vector<int32_t> awq_words = pack_awq_rows(awq_q, k, n), awq_zeros = pack_awq_rows(awq_z, groups, n);
  const std::vector<PackedInt4> weights{
      {.layout = Int4Layout::kCompressedTensors, .rows = n, .cols = k, .group_size = g, .qweight = as_bytes(words),
       .zeros = as_bytes(z_words), .scales = scales},
      {.layout = Int4Layout::kCompressedTensors, .rows = n, .cols = k, .group_size = g, .qweight = as_bytes(words),
       .scales = scales},
      {.layout = Int4Layout::kAwq, .rows = n, .cols = k, .group_size = g, .qweight = as_bytes(awq_words),
       .zeros = as_bytes(awq_zeros), .scales = scales}};
  for (size_t i = 0; i < weights.size(); ++i) {
    std::vector<float> expected(static_cast<size_t>(5 * k)), got(expected.size());
    dequantize_int4_rows(weights[i], 9, 5, expected);
    Int4Rows rows;
    unpack_int4_rows(weights[i], 9, 5, rows);
    EXPECT_EQ(rows.symmetric(), i == 1);
    rows.dequantize(got);
    EXPECT_EQ(got, expected) << "weight " << i;
  }
}

TEST(Int4Packing, QuantizedRowsAreRoundInt4sValues) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(4 * 64));
  for (float& v : x) v = normal(rng);
  std::fill_n(x.begin(), 16, 0.0f);  // a group of zeros
  for (const Int4Rounding r : {Int4Rounding{.group_size = 16}, Int4Rounding{.group_size = -1},
                               Int4Rounding{.group_size = 32, .symmetric = true}}) {
    std::vector<float> rounded = x;
    round_int4(rounded, 64, r);
    Int4Rows rows;
    quantize_int4_rows(x, 64, r, rows);
    std::vector<float> got(x.size());
    rows.dequantize(got);
    EXPECT_EQ(got, rounded);
    EXPECT_EQ(rows.symmetric(), r.symmetric);
  }
}

// A V3 model of one dense and one MoE layer (4 routed experts, 2 shared): every projection's K a multiple of 8.
ModelConfig tiny_moe_config() {
  return parse_model_config(nlohmann::json{
      {"architectures", {"DeepseekV3ForCausalLM"}}, {"vocab_size", 64}, {"hidden_size", 32},
      {"intermediate_size", 48}, {"moe_intermediate_size", 16}, {"num_hidden_layers", 2},
      {"first_k_dense_replace", 1}, {"n_routed_experts", 4}, {"n_shared_experts", 2}, {"num_experts_per_tok", 2},
      {"n_group", 1}, {"topk_group", 1}, {"num_attention_heads", 2}, {"q_lora_rank", 16}, {"kv_lora_rank", 16},
      {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8}, {"v_head_dim", 8}});
}

// Every linear weight of `w` (packed INT4 or float32) as float32 values, by a name of its own.
std::vector<std::pair<std::string, std::vector<float>>> linear_values(const ModelWeights& w) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const auto add = [&](const std::string& name, const Weight& weight) {
    const WeightView v = weight.cview();
    const int64_t matrices = v.shape.ndim() == 3 ? v.shape[0] : 1;
    for (int64_t e = 0; e < matrices; ++e) {
      const WeightView m = v.shape.ndim() == 3 ? v.matrix(e) : v;
      std::vector<float> scratch;
      const float* values = cpu::weight_values(m, scratch);
      out.emplace_back(str_cat(name, "[", e, "]"), std::vector<float>(values, values + m.numel()));
    }
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = str_cat("layer", i, ".");
    add(p + "q_a", l.attn.q_a_proj);
    add(p + "q_b", l.attn.q_b_proj);
    add(p + "kv_a", l.attn.kv_a_proj);
    add(p + "o", l.attn.o_proj);
    if (l.mlp) {
      add(p + "gate_up", l.mlp->gate_up);
      add(p + "down", l.mlp->down);
    }
    if (l.moe) {
      add(p + "experts_gate_up", l.moe->experts_gate_up);
      add(p + "experts_down", l.moe->experts_down);
    }
  }
  return out;
}

// Loads `source` (split across `ranks` tensor-parallel ranks) into a float sink and into one that keeps 4-bit weights
// packed: the packed weights are of `dtype` (kU4, kE2M1) and hold exactly the values the float path loads (rows,
// columns on group edges, the shared experts' down_proj split into experts by columns), and the packed words count
// as `dtype` bytes (half a byte a weight).
void expect_packed_weights_hold_the_float_paths_values(const WeightSource& source, DType dtype) {
  const ModelConfig config = tiny_moe_config();
  for (const int32_t ranks : {1, 2}) {
    for (int32_t rank = 0; rank < ranks; ++rank) {
      const ModelShard shard{.rank = rank, .size = ranks};
      const ModelConfig local = local_config(config, shard);
      const std::unique_ptr<WeightSource> sharded = make_sharded_source(source, shard);
      const std::unique_ptr<WeightSink> float_sink = make_host_sink();
      const std::unique_ptr<WeightSink> packed_sink = make_host_sink({.int4 = true});
      const ModelWeights plain = load_weights(local, *sharded, *float_sink, {}, shard);
      const ModelWeights packed = load_weights(local, *sharded, *packed_sink, {}, shard);
      EXPECT_EQ(packed.layers[1].moe->experts_down.dtype(), dtype);
      EXPECT_EQ(packed.layers[0].attn.o_proj.cview().dtype, dtype);
      EXPECT_FALSE(plain.layers[0].attn.o_proj.is_packed4());
      const auto expected = linear_values(plain), got = linear_values(packed);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].second, expected[i].second) << got[i].first << " rank " << rank << " of " << ranks;
      }
      bool has_packed = false;
      for (const auto& [d, bytes] : weight_bytes_by_dtype(packed)) has_packed = has_packed || (d == dtype && bytes > 0);
      EXPECT_TRUE(has_packed);
    }
  }
}

// INT4 rounded at load, asymmetric and symmetric.
TEST(Int4Loader, PackedWeightsHoldTheDequantizedPathsValues) {
  for (const Int4Rounding rounding :
       {Int4Rounding{.group_size = 8}, Int4Rounding{.group_size = 8, .symmetric = true}}) {
    expect_packed_weights_hold_the_float_paths_values(*make_int4_rounding_source(make_dummy_source(5), rounding),
                                                      DType::kU4);
  }
}

// FP4 (e2m1 words, no zero points): random weights rounded to FP4 as they are read (what a benchmark of an FP4
// checkpoint's config loads), in groups of 8 so that the tiny model's K splits across two ranks on group edges.
TEST(Int4Loader, PackedFp4WeightsHoldTheDequantizedPathsValues) {
  const std::unique_ptr<WeightSource> source =
      make_fp4_rounding_source(make_dummy_source(7), {.format = Fp4Format::kNvfp4ModelOpt, .group_size = 8});
  expect_packed_weights_hold_the_float_paths_values(*source, DType::kE2M1);
}

// An FP4 piece goes only into an FP4 weight, an INT4 piece only into an INT4 one.
TEST(Int4Loader, PackedPiecesGoOnlyIntoWeightsOfTheirCodes) {
  const std::unique_ptr<WeightSink> sink = make_host_sink({.int4 = true});
  Weight fp4 = sink->allocate_int4({16, 32}, {.group_size = 16, .symmetric = true, .e2m1 = true});
  Weight int4 = sink->allocate_int4({16, 32}, {.group_size = 16, .symmetric = true});
  EXPECT_TRUE(fp4.is_fp4() && fp4.is_packed4() && !fp4.is_int4());
  EXPECT_TRUE(int4.is_int4() && int4.is_packed4() && !int4.is_fp4());
  Int4Rows rows;
  rows.resize(16, 32, 16, true);
  EXPECT_THROW(sink->write_int4(fp4, 0, 0, rows), Error);
  rows.e2m1 = true;
  EXPECT_NO_THROW(sink->write_int4(fp4, 0, 0, rows));
  EXPECT_THROW(sink->write_int4(int4, 0, 0, rows), Error);
  EXPECT_THROW(sink->allocate_int4({16, 32}, {.group_size = 16, .symmetric = false, .e2m1 = true}), Error);
}

}  // namespace
}  // namespace deepinfer
