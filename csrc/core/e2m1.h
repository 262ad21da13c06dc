// FP4 (e2m1) codes, the 4-bit floats of NVFP4 and MXFP4: a sign (bit 3) and a magnitude index (bits 0..2) into
// {0, 0.5, 1, 1.5, 2, 3, 4, 6} (2 exponent bits with bias 1, 1 mantissa bit; index 1 is the subnormal 0.5).
//
// The GPU kernels widen codes to bf16 without a table: a code's bits placed into a bf16 (sign to bit 15, the two
// exponent bits to the two lowest of bf16's exponent field, the mantissa bit to its mantissa's highest) make a bf16
// whose value is exactly e2m1 * 2^-126: exponent field e > 0 is 2^(e - 127) (1 + m / 2), and e = 0 the subnormal
// (m / 2) 2^-126. One bf16 multiplication by 2^126 (exact: a power of two, no value overflows) gives the value. The
// placement is plain integer work on both halves of a word at once, shared here with the host tests.
#pragma once

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define DEEPINFER_HOST_DEVICE __host__ __device__
#else
#define DEEPINFER_HOST_DEVICE
#endif

namespace deepinfer {

// The value of each e2m1 code 0..15.
inline constexpr std::array<float, 16> kE2m1ToFloat = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// bf16x2 {2^126, 2^126}: exponent field 253, no mantissa.
inline constexpr uint32_t kBf16x2Of2Pow126 = 0x7e807e80u;

// The codes in bits 0..3 (low half) and 16..19 (high half) of `nibbles` (other bits ignored) as the bf16x2 bits of
// their values times 2^-126.
DEEPINFER_HOST_DEVICE constexpr uint32_t e2m1_pair_scaled_bits(uint32_t nibbles) {
  return ((nibbles << 6) & 0x01c001c0u) | ((nibbles << 12) & 0x80008000u);
}

}  // namespace deepinfer
