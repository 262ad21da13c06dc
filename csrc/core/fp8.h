// FP8 E4M3 ("float8_e4m3fn") encoding and decoding, and DeepSeek's block-scaled weight (de)quantization.
//
// e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. No infinities: exponent 15 is a
// normal binade except for mantissa 7, which is NaN (0x7f, 0xff). Largest finite value 448 (0x7e),
// smallest subnormal 2^-9 (0x01).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <span>

namespace deepinfer {

namespace detail {

constexpr float decode_e4m3(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exponent = (code >> 3) & 0xfu;
  uint32_t mantissa = code & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) {
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()));
  }
  if (exponent != 0) {  // normal: (1 + m/8) * 2^(e-7); rebias 7 -> 127
    return std::bit_cast<float>(sign | ((exponent + 120u) << 23) | (mantissa << 20));
  }
  if (mantissa == 0) {
    return std::bit_cast<float>(sign);  // signed zero
  }
  // Subnormal: m * 2^-9. Normalize the leading one into the implicit position.
  int32_t fp32_exponent = 127 - 7 + 1;
  while ((mantissa & 0x8u) == 0) {
    mantissa <<= 1;
    --fp32_exponent;
  }
  mantissa &= 0x7u;
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(fp32_exponent) << 23) | (mantissa << 20));
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (uint32_t code = 0; code < 256; ++code) {
    table[code] = decode_e4m3(static_cast<uint8_t>(code));
  }
  return table;
}

}  // namespace detail

// fp32 value of every e4m3fn code.
inline constexpr std::array<float, 256> kE4m3ToFloat = detail::make_e4m3_table();

constexpr float e4m3_to_float(uint8_t code) { return kE4m3ToFloat[code]; }

inline constexpr float kE4m3Max = 448.0f;

// The e4m3fn code nearest to `v` (ties to even), saturating: |v| > 448 gives +-448, NaN gives 0x7f.
uint8_t float_to_e4m3(float v);

// How a block's scale is chosen when quantizing: amax / 448 (what DeepSeek-V3's release stores), or that rounded up
// to a power of two ("ue8m0", DeepSeek-V3.1's scale_fmt), which makes the rescaling exact.
enum class Fp8ScaleFormat : uint8_t { kFloat, kUe8m0 };

// Quantizes a slab of whole block rows: values [rows, cols] (rows <= 128 * scale rows, the slab's first row on a
// block boundary) into codes [rows, cols] and scale_inv [ceil(rows / 128), ceil(cols / 128)], each block with its own
// scale so that value ~= e4m3(code) * scale_inv. An all-zero block gets scale 1. Throws on mismatched sizes.
void quantize_fp8_block_rows(std::span<const float> values, int64_t rows, int64_t cols, Fp8ScaleFormat format,
                             std::span<uint8_t> codes, std::span<float> scale_inv);

// A block-scaled FP8 weight as DeepSeek stores it: e4m3 codes and one fp32 scale_inv per block.
struct Fp8BlockWeight {
  std::span<const uint8_t> codes;         // [rows, cols] e4m3 codes, row-major
  int64_t rows = 0;
  int64_t cols = 0;
  std::span<const float> scale_inv;       // [ceil(rows / block[0]), ceil(cols / block[1])], row-major
  std::array<int64_t, 2> block = {128, 128};
};

// Dequantizes rows [first_row, first_row + num_rows) of `w` into `out` ([num_rows, cols]):
//   out[r - first_row][c] = e4m3(codes[r][c]) * scale_inv[r / block[0]][c / block[1]]
// The range need not be aligned to the blocks. Throws deepinfer::Error when the sizes or the range do not match.
void dequantize_fp8_rows(const Fp8BlockWeight& w, int64_t first_row, int64_t num_rows, std::span<float> out);

// Dequantizes a whole block-scaled FP8 weight of shape [rows, cols] (dequantize_fp8_rows over every row).
// weight: [rows, cols] e4m3 codes, row-major.
// scale_inv: [ceil(rows / block[0]), ceil(cols / block[1])], row-major.
// out: [rows, cols].
// Throws like dequantize_fp8_rows.
void dequantize_fp8_blocks(std::span<const uint8_t> weight, int64_t rows, int64_t cols,
                           std::span<const float> scale_inv, std::array<int64_t, 2> block,
                           std::span<float> out);

}  // namespace deepinfer
