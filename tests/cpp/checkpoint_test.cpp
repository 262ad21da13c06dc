// Checkpoint: directories of safetensors files, index.json sharding, read_f32 and FP8 block dequantization.
#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/fp8.h"
#include "safetensors_writer.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using namespace test;  // NOLINT: the shared test helpers

void write_index(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, shard] : weight_map) index["weight_map"][name] = shard;
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
}


void expect_same(std::span<const float> got, std::span<const float> expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(expected[i]))
          << "element " << i << ": " << got[i] << " vs " << expected[i];
    }
  }
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(Checkpoint, ReadF32WidensExactly) {
  TempDir dir("deepinfer_checkpoint_test");
  const std::vector<float> f32 = {1.0f, -2.5f, kInf, std::ldexp(1.0f, -149), -0.0f, 3.4028235e38f};
  // F16: 1, 2^-24 (smallest subnormal), 1023 * 2^-24 (largest subnormal), 65504, -inf, NaN, -0, -2, 2^-14.
  const std::vector<uint16_t> f16 = {0x3c00, 0x0001, 0x03ff, 0x7bff, 0xfc00, 0x7e00, 0x8000, 0xc000, 0x0400};
  const std::vector<float> f16_expected = {1.0f,  std::ldexp(1.0f, -24), 1023 * std::ldexp(1.0f, -24),
                                           65504, -kInf,                 kNaN,
                                           -0.0f, -2.0f,                 std::ldexp(1.0f, -14)};
  // BF16: 1, -3.140625, 2^-133 (subnormal), the largest finite, inf, NaN, -0, 2^-126.
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc049, 0x0001, 0x7f7f, 0x7f80, 0x7fc0, 0x8000, 0x0080};
  const std::vector<float> bf16_expected = {1.0f, -3.140625f, std::ldexp(1.0f, -133),
                                            std::ldexp(255.0f / 128.0f, 127), kInf, kNaN, -0.0f,
                                            std::ldexp(1.0f, -126)};
  write_safetensors(dir.path() / "model.safetensors", {{"a", "F32", {2, 3}, to_bytes(f32)},
                                                      {"b", "F16", {9}, to_bytes(f16)},
                                                      {"c", "BF16", {2, 2, 2}, to_bytes(bf16)}}, nullptr, HeaderPadding::kOdd);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ckpt.file_of("b"), dir.path() / "model.safetensors");

  std::vector<float> out(6);
  ckpt.read_f32("a", {2, 3}, out);
  expect_same(out, f32);
  out.resize(9);
  const std::vector<int64_t> b_shape = {9};
  ckpt.read_f32("b", b_shape, out);
  expect_same(out, f16_expected);
  out.resize(8);
  ckpt.read_f32("c", {2, 2, 2}, out);
  expect_same(out, bf16_expected);
}

TEST(Checkpoint, LargeTensorsWidenInParallel) {
  TempDir dir("deepinfer_checkpoint_test");
  const size_t n = 1 << 20;  // above the OpenMP threshold
  std::vector<uint16_t> bf16(n);
  std::vector<uint16_t> f16(n);
  for (size_t i = 0; i < n; ++i) {
    bf16[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
    f16[i] = static_cast<uint16_t>(i * 40503u);
  }
  write_safetensors(dir.path() / "big.safetensors",
                    {{"bf16", "BF16", {1024, 1024}, to_bytes(bf16)}, {"f16", "F16", {1024, 1024}, to_bytes(f16)}}, nullptr, HeaderPadding::kOdd);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  std::vector<float> out(n);
  ckpt.read_f32("bf16", {1024, 1024}, out);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), static_cast<uint32_t>(bf16[i]) << 16) << i;
  }
  ckpt.read_f32("f16", {1024, 1024}, out);
  for (size_t i = 0; i < n; ++i) {
    const float expected = half_to_float(f16[i]);
    ASSERT_TRUE(std::isnan(expected) ? std::isnan(out[i]) : out[i] == expected) << i;
  }
}

TEST(Checkpoint, ReadF32Errors) {
  TempDir dir("deepinfer_checkpoint_test");
  write_safetensors(dir.path() / "m.safetensors",
                    {{"w", "F32", {2, 3}, std::vector<uint8_t>(24, 0)},
                     {"ids", "I32", {2}, std::vector<uint8_t>(8, 0)},
                     {"e5m2", "F8_E5M2", {2}, {1, 2}}}, nullptr, HeaderPadding::kOdd);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  std::vector<float> out(6);
  expect_error([&] { ckpt.read_f32("w", {3, 2}, out); },
               {"tensor w in ", "m.safetensors", "has shape [2, 3], expected [3, 2]"});
  expect_error([&] { ckpt.read_f32("w", {2, 3, 1}, out); }, {"expected [2, 3, 1]"});
  std::vector<float> small(5);
  expect_error([&] { ckpt.read_f32("w", {2, 3}, small); }, {"holds 5 floats", "6 elements"});
  expect_error([&] { ckpt.read_f32("nope", {2, 3}, out); },
               {"tensor nope not found in checkpoint", dir.path().string()});
  expect_error([&] { (void)ckpt.get("nope"); }, {"tensor nope not found in checkpoint"});
  expect_error([&] { (void)ckpt.file_of("nope"); }, {"tensor nope not found in checkpoint"});
  EXPECT_FALSE(ckpt.contains("nope"));
  EXPECT_TRUE(ckpt.contains("ids"));
  std::vector<float> two(2);
  expect_error([&] { ckpt.read_f32("ids", {2}, two); }, {"tensor ids", "int32", "floating-point"});
  expect_error([&] { ckpt.read_f32("e5m2", {2}, two); },
               {"tensor e5m2 in file", "m.safetensors", "unsupported dtype F8_E5M2"});
}

TEST(Checkpoint, DirectoryErrors) {
  TempDir dir("deepinfer_checkpoint_test");
  expect_error([&] { Checkpoint::open(dir.path() / "absent"); }, {"absent", "does not exist"});
  std::ofstream(dir.path() / "config.json") << "{}";
  expect_error([&] { Checkpoint::open(dir.path()); }, {"no *.safetensors files in", dir.path().string()});
}

TEST(Checkpoint, MultipleFilesWithoutIndex) {
  TempDir dir("deepinfer_checkpoint_test");
  write_safetensors(dir.path() / "b.safetensors", {{"y", "F32", {1}, to_bytes(std::vector<float>{2.0f})}}, nullptr, HeaderPadding::kOdd);
  write_safetensors(dir.path() / "a.safetensors", {{"x", "F32", {1}, to_bytes(std::vector<float>{1.0f})},
                                                   {"z", "F32", {1}, to_bytes(std::vector<float>{3.0f})}}, nullptr, HeaderPadding::kOdd);
  std::ofstream(dir.path() / "notes.txt") << "not a tensor file";
  Checkpoint ckpt = Checkpoint::open(dir.path());
  ASSERT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.files()[0].path().filename(), "a.safetensors");
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(ckpt.size(), 3u);
  EXPECT_EQ(ckpt.file_of("y").filename(), "b.safetensors");
  EXPECT_EQ(ckpt.get("z").dtype, DType::kF32);
  float v = 0;
  ckpt.read_f32("y", {1}, std::span<float>(&v, 1));
  EXPECT_EQ(v, 2.0f);

  // Moving the checkpoint keeps its tensor views valid.
  const Checkpoint moved = std::move(ckpt);
  moved.read_f32("z", {1}, std::span<float>(&v, 1));
  EXPECT_EQ(v, 3.0f);
}

TEST(Checkpoint, DuplicateNamesAcrossFiles) {
  TempDir dir("deepinfer_checkpoint_test");
  write_safetensors(dir.path() / "a.safetensors", {{"x", "F32", {1}, std::vector<uint8_t>(4, 0)}}, nullptr, HeaderPadding::kOdd);
  write_safetensors(dir.path() / "b.safetensors", {{"x", "F32", {1}, std::vector<uint8_t>(4, 0)}}, nullptr, HeaderPadding::kOdd);
  expect_error([&] { Checkpoint::open(dir.path()); }, {"tensor x appears in both", "a.safetensors", "b.safetensors"});
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir("deepinfer_checkpoint_test");
  write_safetensors(dir.path() / "model-00001-of-00002.safetensors",
                    {{"embed", "F32", {2}, to_bytes(std::vector<float>{1.0f, 2.0f})},
                     {"stray", "F32", {1}, to_bytes(std::vector<float>{9.0f})}}, nullptr, HeaderPadding::kOdd);
  write_safetensors(dir.path() / "model-00002-of-00002.safetensors",
                    {{"head", "BF16", {2}, to_bytes(std::vector<uint16_t>{0x4040, 0xc080})}}, nullptr, HeaderPadding::kOdd);
  // A file the index does not mention is ignored, even though it repeats a name.
  write_safetensors(dir.path() / "consolidated.safetensors", {{"embed", "F32", {1}, std::vector<uint8_t>(4, 0)}}, nullptr, HeaderPadding::kOdd);
  write_index(dir.path(), {{"embed", "model-00001-of-00002.safetensors"},
                           {"head", "model-00002-of-00002.safetensors"}});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed", "head"}));
  EXPECT_FALSE(ckpt.contains("stray"));  // the index is authoritative
  EXPECT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.file_of("head").filename(), "model-00002-of-00002.safetensors");
  std::vector<float> out(2);
  ckpt.read_f32("head", {2}, out);
  EXPECT_EQ(out, (std::vector<float>{3.0f, -4.0f}));
  ckpt.read_f32("embed", {2}, out);
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f}));
}

TEST(Checkpoint, IndexErrors) {
  TempDir dir("deepinfer_checkpoint_test");
  write_safetensors(dir.path() / "s1.safetensors", {{"a", "F32", {1}, std::vector<uint8_t>(4, 0)}}, nullptr, HeaderPadding::kOdd);
  write_index(dir.path(), {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); }, {"shard", "s2.safetensors", "does not exist"});

  write_index(dir.path(), {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"tensor b is listed in", "model.safetensors.index.json", "missing from shard", "s1.safetensors"});

  std::ofstream(dir.path() / "model.safetensors.index.json") << "{\"weight_map\": {";
  expect_error([&] { Checkpoint::open(dir.path()); }, {"model.safetensors.index.json", "not valid JSON"});
  std::ofstream(dir.path() / "model.safetensors.index.json") << "{\"metadata\": {}}";
  expect_error([&] { Checkpoint::open(dir.path()); }, {"model.safetensors.index.json", "weight_map"});
}

// --- FP8 block dequantization ---

struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
};

Fp8Weight make_fp8_weight(int64_t rows, int64_t cols, int64_t scale_rows, int64_t scale_cols) {
  Fp8Weight w;
  w.codes.resize(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.codes.size(); ++i) {
    uint8_t code = static_cast<uint8_t>((i * 2654435761u) >> 13);
    if ((code & 0x7f) == 0x7f) code ^= 1;  // no NaNs
    w.codes[i] = code;
  }
  w.scale_inv.resize(static_cast<size_t>(scale_rows * scale_cols));
  for (size_t i = 0; i < w.scale_inv.size(); ++i) w.scale_inv[i] = std::ldexp(1.0f + 0.125f * i, -static_cast<int>(i % 5));
  return w;
}

TEST(Checkpoint, Fp8BlockDequantization) {
  TempDir dir("deepinfer_checkpoint_test");
  const int64_t rows = 200, cols = 300;  // 2 x 3 blocks of 128 x 128, the last ones partial
  const Fp8Weight w = make_fp8_weight(rows, cols, 2, 3);
  write_safetensors(dir.path() / "model.safetensors",
                    {{"model.layers.0.mlp.down_proj.weight", "F8_E4M3", {rows, cols}, w.codes},
                     {"model.layers.0.mlp.down_proj.weight_scale_inv", "F32", {2, 3}, to_bytes(w.scale_inv)},
                     {"model.layers.0.mlp.up_proj.weight", "F8_E4M3", {rows, cols}, w.codes},
                     {"model.layers.0.mlp.gate_proj.weight", "F8_E4M3", {rows, cols}, w.codes},
                     {"model.layers.0.mlp.gate_proj.weight_scale_inv", "F32", {3, 2}, to_bytes(w.scale_inv)}}, nullptr, HeaderPadding::kOdd);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  std::vector<float> out(rows * cols);
  ckpt.read_f32("model.layers.0.mlp.down_proj.weight", {rows, cols}, out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float expected = e4m3_to_float(w.codes[r * cols + c]) * w.scale_inv[(r / 128) * 3 + c / 128];
      ASSERT_EQ(out[r * cols + c], expected) << r << ", " << c;
    }
  }
  // The scales really are per block: the element at (150, 290) uses scale block (1, 2).
  EXPECT_EQ(out[150 * cols + 290], e4m3_to_float(w.codes[150 * cols + 290]) * w.scale_inv[5]);

  expect_error([&] { ckpt.read_f32("model.layers.0.mlp.up_proj.weight", {rows, cols}, out); },
               {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight_scale_inv", "no scale"});
  expect_error([&] { ckpt.read_f32("model.layers.0.mlp.gate_proj.weight", {rows, cols}, out); },
               {"gate_proj.weight_scale_inv", "has shape [3, 2], expected [2, 3]"});
}

TEST(Checkpoint, Fp8OtherBlockSizes) {
  TempDir dir("deepinfer_checkpoint_test");
  const int64_t rows = 5, cols = 7;
  const Fp8Weight w = make_fp8_weight(rows, cols, 3, 3);  // blocks of 2 x 3
  write_safetensors(dir.path() / "model.safetensors",
                    {{"w.weight", "F8_E4M3", {rows, cols}, w.codes},
                     {"w.weight_scale_inv", "F32", {3, 3}, to_bytes(w.scale_inv)},
                     {"v.weight", "F8_E4M3", {35}, w.codes},
                     {"v.weight_scale_inv", "F32", {1}, to_bytes(std::vector<float>{1.0f})}}, nullptr, HeaderPadding::kOdd);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  std::vector<float> out(rows * cols);
  ckpt.read_f32("w.weight", {rows, cols}, out, {2, 3});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(out[r * cols + c], e4m3_to_float(w.codes[r * cols + c]) * w.scale_inv[(r / 2) * 3 + c / 3]);
    }
  }
  // With the default 128 x 128 blocks the scale grid would be [1, 1].
  expect_error([&] { ckpt.read_f32("w.weight", {rows, cols}, out); }, {"expected [1, 1]"});
  expect_error([&] { ckpt.read_f32("v.weight", {35}, out); }, {"only 2-D"});
}

}  // namespace
}  // namespace deepinfer
