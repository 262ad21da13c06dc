// Exact conversions between the 16-bit float formats and fp32, on the host.
//
// Every bf16 and fp16 value is exactly representable in fp32, so widening is exact (subnormals,
// infinities and NaN payloads included). Narrowing rounds to nearest, ties to even.
#pragma once

#include <bit>
#include <cstdint>

namespace deepinfer {

// bfloat16 is the upper half of an fp32: widening is a shift.
constexpr float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// fp32 -> bfloat16, round to nearest even. NaN stays NaN (quiet), infinities stay infinite.
constexpr uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign and set the quiet bit
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

// IEEE binary16 (1 sign, 5 exponent bits with bias 15, 10 mantissa bits) -> fp32.
constexpr float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // infinity (mantissa 0) or NaN (payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) {  // signed zero
    return std::bit_cast<float>(sign);
  }
  // Subnormal: value = mantissa * 2^-24. Shift the leading one into the implicit position; each
  // shift lowers the exponent by one. The fp32 result is normal.
  int32_t fp32_exponent = 127 - 15 + 1;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --fp32_exponent;
  }
  mantissa &= 0x3ffu;
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(fp32_exponent) << 23) | (mantissa << 13));
}

}  // namespace deepinfer
