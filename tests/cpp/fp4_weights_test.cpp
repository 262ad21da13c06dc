// FP4 weights on the host: the e2m1 code table and the nibble order pinned by hand-written bytes, E8M0 scales, and
// the row ranges of a dequantization equal to the whole. The formats' own libraries check the layouts end to end
// (tests/python/test_fp4.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/e2m1.h"
#include "core/error.h"
#include "core/int4.h"
#include "core/fp8.h"
#include "core/weight.h"
#include "model/fp4.h"
#include "model/fp4_source.h"
#include "model/int4.h"
#include "model/weights.h"

namespace deepinfer {
namespace {

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) { return std::as_bytes(std::span(v)); }

TEST(Fp4Weights, CodesAreSignAndMagnitudeLowNibbleFirst) {
  // One row of 16 values, group 16, scale 1: bytes 0x10, 0x32, ... hold codes 0, 1, 2, 3, ...
  std::vector<uint8_t> codes(8);
  for (int i = 0; i < 8; ++i) codes[i] = static_cast<uint8_t>((2 * i) | ((2 * i + 1) << 4));
  const std::vector<float> scales{1.0f};
  std::vector<float> out(16);
  dequantize_fp4_rows({.rows = 1, .cols = 16, .group_size = 16, .codes = as_bytes(codes), .scales = scales}, 0, 1,
                      out);
  const std::vector<float> want{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  EXPECT_EQ(out, want);
  EXPECT_TRUE(std::signbit(out[8]));
}

TEST(Fp4Weights, EachGroupTakesItsScaleAndRowRangesEqualTheWhole) {
  const int64_t rows = 3, cols = 64, group = 32;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<float> scales;
  for (uint8_t e : {127, 128, 120, 130, 127, 1}) scales.push_back(e8m0_to_float(e));
  const PackedFp4 w{.rows = rows, .cols = cols, .group_size = group, .codes = as_bytes(codes), .scales = scales};
  std::vector<float> whole(static_cast<size_t>(rows * cols));
  dequantize_fp4_rows(w, 0, rows, whole);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t byte = codes[static_cast<size_t>((n * cols + k) / 2)];
      const int code = k % 2 == 0 ? byte & 0xf : byte >> 4;
      EXPECT_EQ(whole[static_cast<size_t>(n * cols + k)],
                kE2m1ToFloat[static_cast<size_t>(code)] * scales[static_cast<size_t>(n * 2 + k / group)]);
    }
  }
  std::vector<float> middle(static_cast<size_t>(cols));
  dequantize_fp4_rows(w, 1, 1, middle);
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), whole.begin() + cols));
}

// The bf16 a GPU kernel builds from a code (core/e2m1.h), as a float.
float scaled_bf16(uint32_t bits16) {
  const uint32_t f32_bits = bits16 << 16;
  float f = 0.0f;
  std::memcpy(&f, &f32_bits, sizeof(f));
  return f;
}

// Every code in both halves of a word, beside every code in the other half: the placed bits are a bf16 of exactly the
// code's value times 2^-126 (one multiplication by 2^126, exact, gives the value), and nothing of the neighbouring
// nibbles leaks in.
TEST(Fp4Weights, KernelBitPlacementIsTheCodesValueTimesTwoToTheMinus126) {
  EXPECT_EQ(scaled_bf16(kBf16x2Of2Pow126 & 0xffffu), std::ldexp(1.0f, 126));
  EXPECT_EQ(scaled_bf16(kBf16x2Of2Pow126 >> 16), std::ldexp(1.0f, 126));
  for (uint32_t lo = 0; lo < 16; ++lo) {
    for (uint32_t hi = 0; hi < 16; ++hi) {
      // Codes in bits 0..3 and 16..19, other nibbles filled with ones (ignored).
      const uint32_t word = lo | (hi << 16) | 0xfff0fff0u;
      const uint32_t bits = e2m1_pair_scaled_bits(word);
      const float lo_value = scaled_bf16(bits & 0xffffu) * std::ldexp(1.0f, 126);
      const float hi_value = scaled_bf16(bits >> 16) * std::ldexp(1.0f, 126);
      EXPECT_EQ(lo_value, kE2m1ToFloat[lo]) << "code " << lo;
      EXPECT_EQ(hi_value, kE2m1ToFloat[hi]) << "code " << hi;
      EXPECT_EQ(std::signbit(lo_value), lo >= 8) << "code " << lo;
    }
  }
}

// FP4 rows packed as the engine keeps them (INT4's interleaved words, e2m1 codes) dequantize to what the rows hold,
// and to what the checkpoint layout (two codes a byte) dequantizes to.
TEST(Fp4Weights, PackedWordsDequantizeToTheirRowsAndTheCheckpointsValues) {
  const int64_t rows = 4, cols = 64, group = 16;
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols / 2));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 73 + 5);
  std::vector<float> scales;
  for (int64_t g = 0; g < rows * cols / group; ++g) scales.push_back(0.25f * static_cast<float>(g + 1));
  std::vector<float> from_checkpoint(static_cast<size_t>(rows * cols));
  dequantize_fp4_rows({.rows = rows, .cols = cols, .group_size = group, .codes = as_bytes(bytes), .scales = scales}, 0,
                      rows, from_checkpoint);
  Int4Rows r;
  r.resize(rows, cols, group, true);
  r.e2m1 = true;
  for (size_t i = 0; i < bytes.size(); ++i) {
    r.q[2 * i] = bytes[i] & 0xfu;
    r.q[2 * i + 1] = bytes[i] >> 4;
  }
  r.scales = scales;
  std::vector<float> from_rows(static_cast<size_t>(rows * cols));
  r.dequantize(from_rows);
  EXPECT_EQ(from_rows, from_checkpoint);
  std::vector<int32_t> words(static_cast<size_t>(rows * cols / 8));
  pack_int4_codes(r, words);
  std::vector<float> from_words(static_cast<size_t>(rows * cols));
  dequantize_packed_fp4(words, scales, rows, cols, group, from_words);
  EXPECT_EQ(from_words, from_checkpoint);
  // A column range on group edges keeps the codes' kind.
  const Int4Rows right = r.columns(32, 32);
  EXPECT_TRUE(right.e2m1);
  std::vector<float> right_values(static_cast<size_t>(rows * 32));
  right.dequantize(right_values);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < 32; ++k) {
      EXPECT_EQ(right_values[static_cast<size_t>(n * 32 + k)], from_checkpoint[static_cast<size_t>(n * cols + 32 + k)]);
    }
  }
}

TEST(Fp4Rounding, NearestCodeTiesToTheEvenMantissaAndClamps) {
  const std::vector<std::pair<float, float>> cases = {
      {0.2f, 0.0f}, {0.25f, 0.0f}, {0.3f, 0.5f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.3f, 1.5f}, {1.75f, 2.0f},
      {2.5f, 2.0f}, {2.6f, 3.0f}, {3.5f, 4.0f}, {5.0f, 4.0f}, {5.1f, 6.0f}, {100.0f, 6.0f}};
  for (const auto& [v, want] : cases) {
    EXPECT_EQ(kE2m1ToFloat[nearest_e2m1(v)], want) << v;
    EXPECT_EQ(kE2m1ToFloat[nearest_e2m1(-v)], want == 0.0f ? 0.0f : -want) << -v;
  }
  EXPECT_EQ(nearest_e2m1(-0.1f), 0);  // rounds to zero: +0, never the -0 code
}

TEST(Fp4Rounding, EachFormatStoresItsOwnScale) {
  // One group of 16: amax 3 -> NVFP4 scale e4m3(0.5) = 0.5, codes v / 0.5; MXFP4 2^(floor(log2 3) - 2) = 0.5.
  std::vector<float> v(32, 0.0f);
  v[0] = 3.0f;
  v[1] = -1.0f;
  v[2] = 0.6f;
  for (int i = 16; i < 32; ++i) v[static_cast<size_t>(i)] = 0.0f;  // a group of zeros
  std::vector<uint8_t> codes(32);
  std::vector<float> scales(2);
  round_fp4(v, 32, 16, Fp4Scaling::kNvfp4, codes, scales);
  EXPECT_EQ(scales, (std::vector<float>{0.5f, 1.0f}));
  EXPECT_EQ(kE2m1ToFloat[codes[0]], 6.0f);
  EXPECT_EQ(kE2m1ToFloat[codes[1]], -2.0f);
  EXPECT_EQ(kE2m1ToFloat[codes[2]], 1.0f);  // 1.2 -> 1
  EXPECT_EQ(codes[20], 0);
  round_fp4(v, 32, 16, Fp4Scaling::kMxfp4, codes, scales);
  EXPECT_EQ(scales[0], 0.5f);
  // amax 5: MXFP4 2^(2 - 2) = 1 (5 lies halfway between 4 and 6: the even code, 4), NVFP4 e4m3(5 / 6).
  v[0] = 5.0f;
  round_fp4(v, 32, 16, Fp4Scaling::kMxfp4, codes, scales);
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(kE2m1ToFloat[codes[0]], 4.0f);
  round_fp4(v, 32, 16, Fp4Scaling::kNvfp4, codes, scales);
  EXPECT_EQ(scales[0], e4m3_to_float(float_to_e4m3(5.0f / 6.0f)));
  EXPECT_THROW(round_fp4(v, 32, 12, Fp4Scaling::kNvfp4, codes, scales), Error);
}

TEST(Fp4Rounding, TheRoundingSourceReadsPackedRowsAndTheirValuesAlike) {
  const std::unique_ptr<WeightSource> source =
      make_fp4_rounding_source(make_dummy_source(3), {.format = Fp4Format::kMxfp4CompressedTensors, .group_size = 32});
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  ASSERT_TRUE(source->int4_form(name).has_value());
  EXPECT_TRUE(source->int4_form(name)->e2m1 && source->int4_form(name)->symmetric);
  EXPECT_EQ(source->int4_form(name)->group_size, 32);
  EXPECT_FALSE(source->int4_form("model.layers.0.mlp.gate.weight").has_value());  // the router stays as it is
  EXPECT_FALSE(source->int4_form("model.embed_tokens.weight").has_value());
  const std::vector<int64_t> shape{8, 64};
  Int4Rows rows;
  source->read_int4_rows(name, shape, 2, 4, rows);
  EXPECT_TRUE(rows.e2m1);
  std::vector<float> packed_values(4 * 64), values(4 * 64);
  rows.dequantize(packed_values);
  source->read_rows(name, shape, 2, 4, values);
  EXPECT_EQ(values, packed_values);
  for (float s : rows.scales) EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);  // MXFP4: powers of two
}

TEST(Fp4Weights, E8m0IsABiasedPowerOfTwo) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(130), 8.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

TEST(Fp4Weights, SizesThatDisagreeAreRefused) {
  const std::vector<uint8_t> codes(8);
  const std::vector<float> scales(2);
  std::vector<float> out(16);
  EXPECT_THROW(dequantize_fp4_rows({.rows = 1, .cols = 16, .group_size = 16, .codes = as_bytes(codes),
                                    .scales = scales}, 0, 1, out),
               Error);  // two scales for one group
  EXPECT_THROW(dequantize_fp4_rows({.rows = 1, .cols = 16, .group_size = 12, .codes = as_bytes(codes),
                                    .scales = std::span(scales).first(1)}, 0, 1, out),
               Error);  // 12 does not divide 16
}

}  // namespace
}  // namespace deepinfer
