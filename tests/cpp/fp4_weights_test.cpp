// FP4 weights on the host: the e2m1 code table and the nibble order pinned by hand-written bytes, E8M0 scales, and
// the row ranges of a dequantization equal to the whole. The formats' own libraries check the layouts end to end
// (tests/python/test_fp4.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/fp4.h"

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
