#include "core/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"
#include "core/weight.h"

namespace deepinfer {

uint8_t float_to_e4m3(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const float a = std::fabs(v);
  if (std::isnan(a)) return 0x7f;
  if (a >= kE4m3Max) return sign | 0x7e;
  int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xffu) - 127;
  if (exponent < -6) {
    // Subnormal range: multiples of 2^-9, rounded half to even (code 8 is the smallest normal, 2^-6).
    const float q = std::nearbyint(a * 512.0f);
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding the other 20 half to even.
  const uint32_t mantissa = bits & 0x7fffffu;
  uint32_t q = mantissa >> 20;
  const uint32_t rest = mantissa & 0xfffffu, half = 0x80000u;
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  if (q == 8) {
    q = 0;
    ++exponent;
  }
  if (exponent > 8 || (exponent == 8 && q == 7)) return sign | 0x7e;  // 480 would be NaN's code: saturate
  return sign | static_cast<uint8_t>((static_cast<uint32_t>(exponent + 7) << 3) | q);
}

void quantize_fp8_block_rows(std::span<const float> values, int64_t rows, int64_t cols, Fp8ScaleFormat format,
                             std::span<uint8_t> codes, std::span<float> scale_inv) {
  const int64_t block_rows = fp8_blocks(rows), block_cols = fp8_blocks(cols);
  DI_CHECK(rows >= 0 && cols >= 0 && static_cast<int64_t>(values.size()) == rows * cols &&
               static_cast<int64_t>(codes.size()) == rows * cols &&
               static_cast<int64_t>(scale_inv.size()) == block_rows * block_cols,
           "quantize_fp8_block_rows: ", values.size(), " values, ", codes.size(), " codes and ", scale_inv.size(),
           " scales for [", rows, ", ", cols, "] in ", kFp8Block, "x", kFp8Block, " blocks");
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols >= (int64_t{1} << 18))
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t r0 = br * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
      const int64_t c0 = bc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[static_cast<size_t>(r * cols + c)]));
      }
      float scale = amax > 0.0f && std::isfinite(amax) ? amax / kE4m3Max : 1.0f;
      if (format == Fp8ScaleFormat::kUe8m0) scale = std::exp2(std::ceil(std::log2(scale)));
      scale_inv[static_cast<size_t>(br * block_cols + bc)] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const auto i = static_cast<size_t>(r * cols + c);
          codes[i] = float_to_e4m3(values[i] / scale);
        }
      }
    }
  }
}

void dequantize_fp8_rows(const Fp8BlockWeight& w, int64_t first_row, int64_t num_rows, std::span<float> out) {
  const int64_t rows = w.rows, cols = w.cols;
  DI_CHECK(rows >= 0 && cols >= 0, "invalid FP8 weight shape [", rows, ", ", cols, "]");
  DI_CHECK(w.block[0] > 0 && w.block[1] > 0, "invalid FP8 block size [", w.block[0], ", ", w.block[1], "]");
  const int64_t numel = rows * cols;
  const int64_t scale_rows = (rows + w.block[0] - 1) / w.block[0];
  const int64_t scale_cols = (cols + w.block[1] - 1) / w.block[1];
  DI_CHECK(static_cast<int64_t>(w.codes.size()) == numel, "FP8 weight has ", w.codes.size(),
           " elements, expected ", numel, " for shape [", rows, ", ", cols, "]");
  DI_CHECK(static_cast<int64_t>(w.scale_inv.size()) == scale_rows * scale_cols, "FP8 scale_inv has ",
           w.scale_inv.size(), " elements, expected ", scale_rows * scale_cols, " ([", scale_rows, ", ",
           scale_cols, "] blocks of ", w.block[0], "x", w.block[1], ")");
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= rows, "FP8 rows [", first_row, ", ",
           first_row + num_rows, ") out of range for shape [", rows, ", ", cols, "]");
  DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * cols, "FP8 dequantization output has ", out.size(),
           " elements, expected ", num_rows * cols);

  const uint8_t* codes = w.codes.data();
  const float* s = w.scale_inv.data();
  float* o = out.data();
  const int64_t block_rows = w.block[0];
  const int64_t block_cols = w.block[1];
#pragma omp parallel for schedule(static) if (num_rows * cols >= (int64_t{1} << 18))
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t r = first_row + i;
    const float* scale_row = s + (r / block_rows) * scale_cols;
    const uint8_t* w_row = codes + r * cols;
    float* o_row = o + i * cols;
    for (int64_t c = 0; c < cols; ++c) {
      o_row[c] = kE4m3ToFloat[w_row[c]] * scale_row[c / block_cols];
    }
  }
}

void dequantize_fp8_blocks(std::span<const uint8_t> weight, int64_t rows, int64_t cols,
                           std::span<const float> scale_inv, std::array<int64_t, 2> block,
                           std::span<float> out) {
  dequantize_fp8_rows({.codes = weight, .rows = rows, .cols = cols, .scale_inv = scale_inv, .block = block}, 0,
                      rows, out);
}

}  // namespace deepinfer
