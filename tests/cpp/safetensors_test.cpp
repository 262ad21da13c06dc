// SafetensorsFile (mapping, header validation), the 16-bit float conversions and FP8 E4M3 decoding.
#include "model/safetensors.h"

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

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// --- 16-bit floats ---

TEST(Half, AllHalfCodesMatchFormula) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto bits = static_cast<uint16_t>(code);
    const int sign = (code >> 15) & 1;
    const int exponent = (code >> 10) & 0x1f;
    const int mantissa = code & 0x3ff;
    const float got = half_to_float(bits);
    if (exponent == 31) {
      if (mantissa == 0) {
        EXPECT_TRUE(std::isinf(got)) << code;
      } else {
        EXPECT_TRUE(std::isnan(got)) << code;
      }
      EXPECT_EQ(std::signbit(got), sign == 1) << code;
      continue;
    }
    const double magnitude = exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -24)
                                           : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    const auto expected = static_cast<float>(sign ? -magnitude : magnitude);
    ASSERT_TRUE(same_bits(got, expected)) << "code " << code << ": " << got << " vs " << expected;
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  // NaN payload survives.
  EXPECT_EQ(std::bit_cast<uint32_t>(half_to_float(0x7e01)), 0x7fc02000u);
}

TEST(Half, Bf16) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = bf16_to_float(static_cast<uint16_t>(code));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), code << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), code) << code;  // exact values round-trip
    }
  }
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));
  // Round to nearest, ties to even.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // overflow to infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
}

// --- FP8 E4M3 ---

TEST(E4m3, AllCodesMatchFormula) {
  for (uint32_t code = 0; code < 256; ++code) {
    const int sign = (code >> 7) & 1;
    const int exponent = (code >> 3) & 0xf;
    const int mantissa = code & 0x7;
    const float got = e4m3_to_float(static_cast<uint8_t>(code));
    if (exponent == 15 && mantissa == 7) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - 7)
                                           : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
    const auto expected = static_cast<float>(sign ? -magnitude : magnitude);
    EXPECT_TRUE(same_bits(got, expected)) << "code " << code << ": " << got << " vs " << expected;
    EXPECT_FALSE(std::isinf(got)) << code;
  }
}

TEST(E4m3, KnownValues) {
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);
  EXPECT_TRUE(same_bits(e4m3_to_float(0x80), -0.0f));
  EXPECT_TRUE(same_bits(e4m3_to_float(0x00), 0.0f));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  static_assert(e4m3_to_float(0x38) == 1.0f);  // the table is usable at compile time
}

TEST(E4m3, DequantizeBlocksDirect) {
  const int64_t rows = 5, cols = 7;
  const std::array<int64_t, 2> block = {2, 3};  // scale grid 3 x 3
  std::vector<uint8_t> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>((i * 37 + 11) % 126);
  std::vector<float> scale(9);
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = 0.5f + static_cast<float>(i);
  std::vector<float> out(rows * cols);
  dequantize_fp8_blocks(w, rows, cols, scale, block, out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(out[r * cols + c], e4m3_to_float(w[r * cols + c]) * scale[(r / 2) * 3 + c / 3]);
    }
  }
  std::vector<float> small_scale(4);
  expect_error([&] { dequantize_fp8_blocks(w, rows, cols, small_scale, block, out); }, {"scale_inv", "9"});
}

// --- SafetensorsFile ---

TEST(Safetensors, ReadsTensorsAndMetadata) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "model.safetensors";
  const std::vector<float> f32 = {1.0f, -2.5f, std::numeric_limits<float>::infinity(), std::ldexp(1.0f, -149),
                                  -0.0f, std::bit_cast<float>(0x7fc00123u)};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc049, 0x7f80};
  const std::vector<uint16_t> f16 = {0x3c00, 0x0001, 0xfc00, 0x7e00};
  const std::vector<int64_t> i64 = {-1, 1LL << 40};
  write_safetensors(path,
                    {{"b.weight", "F32", {2, 3}, to_bytes(f32)},
                     {"a.bias", "BF16", {3}, to_bytes(bf16)},
                     {"c", "F16", {2, 1, 2}, to_bytes(f16)},
                     {"d", "I64", {2}, to_bytes(i64)},
                     {"e", "F8_E4M3", {1, 3}, {0x38, 0x7e, 0x01}},
                     {"scalar", "I32", {}, to_bytes(std::vector<int32_t>{7})},
                     {"empty", "F32", {0, 4}, {}}},
                    {{"format", "pt"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.size(), 7u);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a.bias", "b.weight", "c", "d", "e", "empty", "scalar"}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.find("__metadata__"), nullptr);
  EXPECT_EQ(file.find("missing"), nullptr);
  expect_error([&] { (void)file.get("missing"); }, {"missing", "not found", path.string()});

  const TensorInfo& b = file.get("b.weight");
  EXPECT_EQ(b.dtype, DType::kF32);
  EXPECT_EQ(b.dtype_tag, "F32");
  EXPECT_TRUE(b.supported);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.numel(), 6);
  ASSERT_EQ(b.bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(b.bytes.data(), f32.data(), 24), 0);

  const TensorInfo& a = file.get("a.bias");
  EXPECT_EQ(a.dtype, DType::kBF16);
  ASSERT_EQ(a.bytes.size(), 6u);
  EXPECT_EQ(std::memcmp(a.bytes.data(), bf16.data(), 6), 0);

  EXPECT_EQ(file.get("c").dtype, DType::kF16);
  EXPECT_EQ(file.get("c").shape, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(file.get("d").dtype, DType::kI64);
  EXPECT_EQ(file.get("e").dtype, DType::kF8E4M3);
  EXPECT_EQ(std::to_integer<uint8_t>(file.get("e").bytes[1]), 0x7e);
  EXPECT_EQ(file.get("scalar").numel(), 1);
  EXPECT_TRUE(file.get("scalar").shape.empty());
  EXPECT_EQ(file.get("empty").numel(), 0);
  EXPECT_TRUE(file.get("empty").bytes.empty());

  // Views into one mapping: tensors packed back to back in the order written.
  EXPECT_EQ(file.get("a.bias").bytes.data(), file.get("b.weight").bytes.data() + 24);
  EXPECT_EQ(file.file_bytes(), fs::file_size(path));
}

TEST(Safetensors, MoveKeepsViewsValid) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "x.safetensors";
  write_safetensors(path, {{"t", "F32", {2}, to_bytes(std::vector<float>{3.0f, 4.0f})}});
  SafetensorsFile first = SafetensorsFile::open(path);
  const std::byte* data = first.get("t").bytes.data();
  SafetensorsFile second = std::move(first);
  EXPECT_EQ(second.get("t").bytes.data(), data);
  SafetensorsFile third = SafetensorsFile::open(path);
  third = std::move(second);
  float v[2];
  std::memcpy(v, third.get("t").bytes.data(), sizeof(v));
  EXPECT_EQ(v[0], 3.0f);
  EXPECT_EQ(v[1], 4.0f);
}

TEST(Safetensors, UnsupportedDtypesAreRecorded) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "x.safetensors";
  write_safetensors(path, {{"e5m2", "F8_E5M2", {4}, {1, 2, 3, 4}},
                           {"u8", "U8", {2}, {1, 2}},
                           {"f64", "F64", {1}, std::vector<uint8_t>(8, 0)},
                           {"future", "F3_NEW", {5}, {1, 2}}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_FALSE(file.get("e5m2").supported);
  EXPECT_EQ(file.get("e5m2").dtype_tag, "F8_E5M2");
  EXPECT_EQ(file.get("e5m2").bytes.size(), 4u);
  EXPECT_FALSE(file.get("u8").supported);
  EXPECT_FALSE(file.get("f64").supported);
  EXPECT_FALSE(file.get("future").supported);  // unknown tag: kept, size not checkable
}

TEST(Safetensors, MissingFile) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "nope.safetensors";
  expect_error([&] { SafetensorsFile::open(path); }, {"does not exist", "nope.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {"not a regular file"});
}

TEST(Safetensors, TooShortForHeader) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "short.safetensors";
  std::ofstream(path, std::ios::binary) << "abc";
  expect_error([&] { SafetensorsFile::open(path); }, {"too short", "short.safetensors", "3 bytes"});
  std::ofstream(path, std::ios::binary | std::ios::trunc).flush();  // empty file
  expect_error([&] { SafetensorsFile::open(path); }, {"too short", "0 bytes"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "bad_len.safetensors";
  write_raw(path, 1000, "{}", {});
  expect_error([&] { SafetensorsFile::open(path); }, {"bad_len.safetensors", "header length of 1000"});
  write_raw(path, ~uint64_t{0}, "{}", {});
  expect_error([&] { SafetensorsFile::open(path); }, {"bad_len.safetensors", "header length"});
}

TEST(Safetensors, InvalidJson) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "bad_json.safetensors";
  const std::string header = R"({"a": {"dtype": "F32", )";
  write_raw(path, header.size(), header, {});
  expect_error([&] { SafetensorsFile::open(path); }, {"bad_json.safetensors", "invalid JSON"});
  const std::string array_header = "[1, 2]";
  write_raw(path, array_header.size(), array_header, {});
  expect_error([&] { SafetensorsFile::open(path); }, {"bad_json.safetensors", "not an object"});
}

TEST(Safetensors, MalformedEntries) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "entries.safetensors";
  const auto check = [&](const std::string& header, const std::string& expected) {
    write_raw(path, header.size(), header, std::vector<uint8_t>(16, 0));
    expect_error([&] { SafetensorsFile::open(path); }, {expected, "entries.safetensors"});
  };
  check(R"({"t": {"shape": [2], "data_offsets": [0, 8]}})", "'dtype'");
  check(R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", "'shape'");
  check(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", "'data_offsets'");
  check(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", "out of order");
  check(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "needs 12 bytes");
  check(R"({"t": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})", "overflows");
  check(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
        R"( "u": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
        "overlap");
  check(R"({"t": 5})", "not an object");
}

TEST(Safetensors, TruncatedFile) {
  TempDir dir("deepinfer_safetensors_test");
  const fs::path path = dir.path() / "cut.safetensors";
  write_safetensors(path, {{"first", "F32", {4}, std::vector<uint8_t>(16, 0)},
                           {"second", "BF16", {8}, std::vector<uint8_t>(16, 0)}});
  SafetensorsFile::open(path);  // intact
  fs::resize_file(path, fs::file_size(path) - 5);
  expect_error([&] { SafetensorsFile::open(path); },
               {"cut.safetensors", "is truncated", "tensor second", "[16, 32)", "data section has 27 bytes"});
}

}  // namespace
}  // namespace deepinfer
