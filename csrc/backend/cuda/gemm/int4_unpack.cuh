// INT4 weights in registers (the packing is core/weight.h's): a packed word of eight inputs, unsigned codes in
// AutoAWQ's interleaved nibble order, becomes four bf16x2 registers holding (q - z) of inputs (0, 1), (2, 3), (4, 5)
// and (6, 7), the first input of a pair in the low half, which is the order the mma.sync fragments take.
//
// Each pair is one mask-and-or: (word >> 4j) & 0x000f000f puts nibble j in the low half and nibble j + 4 in the high
// half, and or-ing 0x4300 (bf16 128.0, whose unit in the last place is 1) makes the bf16 value 128 + q exactly; one
// bf16x2 subtraction of 128 + z leaves the small integer q - z, also exact. The group's scale is applied by the caller:
// to the fp32 partial sums where a K step lies inside one group, or in registers (int4_scale) where groups are
// narrower than a step.
//
// FP4 words (e2m1 codes in the same nibble order, core/weight.h) unpack the same way into the pairs' exact e2m1
// values (unpack8_e2m1, core/e2m1.h's placement and one multiplication by 2^126); their group scales (16 or 32
// inputs) are always applied in registers, a word's eight inputs lying inside one group.
#pragma once

#include <cstdint>

#include "core/e2m1.h"

namespace deepinfer::cuda::int4 {

inline constexpr uint32_t kBf16x2Of128 = 0x43004300u;  // bf16x2 {128, 128}

// bf16x2 {128 + z, 128 + z} for a zero point z in [0, 15].
__device__ __forceinline__ uint32_t zero_pair(uint32_t z) { return kBf16x2Of128 | z | (z << 16); }

// Zero point of group `g` from a row's packed zero-point words (nibble g % 8 of word g / 8); symmetric: 8.
__device__ __forceinline__ uint32_t zero_of_group(const int32_t* row_zeros, int64_t g) {
  if (row_zeros == nullptr) return 8u;
  return (static_cast<uint32_t>(__ldg(row_zeros + g / 8)) >> (4 * (g % 8))) & 0xfu;
}

__device__ __forceinline__ uint32_t sub_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The eight inputs of `word` as (q - z) pairs; `zero` is zero_pair(z).
__device__ __forceinline__ void unpack8(uint32_t word, uint32_t zero, uint32_t (&pairs)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t biased;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n"  // (a & b) | c
        : "=r"(biased)
        : "r"(word >> (4 * j)), "r"(0x000f000fu), "r"(kBf16x2Of128));
    pairs[j] = sub_bf16x2(biased, zero);
  }
}

// The eight e2m1 codes of `word` as their exact bf16 values, in unpack8's pairs.
__device__ __forceinline__ void unpack8_e2m1(uint32_t word, uint32_t (&pairs)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) pairs[j] = mul_bf16x2(e2m1_pair_scaled_bits(word >> (4 * j)), kBf16x2Of2Pow126);
}

// The codes of a word as dequantized pairs: INT4 (q - z, exact) or FP4 (e2m1, exact); `zero` is unused for FP4.
template <bool kE2m1>
__device__ __forceinline__ void unpack8_codes(uint32_t word, uint32_t zero, uint32_t (&pairs)[4]) {
  if constexpr (kE2m1) {
    unpack8_e2m1(word, pairs);
  } else {
    unpack8(word, zero, pairs);
  }
}

// bf16x2 {s, s} of a float scale, rounded to nearest.
__device__ __forceinline__ uint32_t scale_pair(float s) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %1;\n" : "=r"(d) : "f"(s));
  return d;
}

// The four pairs times the group's scale, in registers: (q - z) * s rounded to bf16 (groups narrower than a step).
__device__ __forceinline__ void scale4(uint32_t (&pairs)[4], uint32_t scale) {
#pragma unroll
  for (int j = 0; j < 4; ++j) pairs[j] = mul_bf16x2(pairs[j], scale);
}

}  // namespace deepinfer::cuda::int4
