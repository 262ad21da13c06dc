// e4m3 codes widened to bfloat16 with integer operations, for the FP8 MLA decode kernel (mla_decode_fp8_kernel.cuh);
// host code too, so the host-only tests check every code against core/fp8.h's table.
//
// An e4m3fn code is [s eeee mmm] with exponent bias 7; a bfloat16 is [s eeeeeeee mmmmmmm] with bias 127. Moving the
// code's 7 magnitude bits to bf16 bits 4..10 (the code's exponent into the low 4 exponent bits, its mantissa into the
// top 3 mantissa bits) and its sign to bit 15 gives the bf16 of value * 2^-120, for every code: a subnormal code
// (eeee = 0) lands on the bf16 subnormal with the same mantissa, also 2^-120 of its value. One bf16x2 multiply by
// 2^120 * scale (a power of two: exact) then gives the cache value. The two NaN codes (0x7f, 0xff) come out as
// +-480 * scale, not NaN: the host quantizer writes them only for a NaN latent (backend/ops/latent_fp8.h).
//
// Four codes of a 32-bit word (code k in byte k) become two bf16x2 words without a byte permute: `even` holds codes
// 0 and 2 (low and high half), `odd` codes 1 and 3. Shifts by 4 and by -4 put codes 0, 2 and 1, 3 at bits 4..10 and
// 20..26; the signs come from one mask, shifted by 8 for the even pair. pack_low_halves / pack_high_halves turn a
// query's dimension-order pairs (0, 1), (2, 3) into the (0, 2), (1, 3) order of the even and odd words (the kernel's
// k permutation), and the even and odd words back into dimension order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DEEPINFER_WIDEN_FN __host__ __device__ __forceinline__
#else
#define DEEPINFER_WIDEN_FN inline
#endif

namespace deepinfer::cuda::mla_detail {

// The bf16 value of a widened code is the code's value times 2^-120: the exponent biases differ by 127 - 7.
inline constexpr float kE4m3WidenScale = 0x1p120f;
// Where the magnitudes of the two codes of a bf16x2 word sit after the shift: bits 4..10 and 20..26.
inline constexpr uint32_t kWidenMagnitudeBits = 0x07f007f0u;

struct WidenedE4m3x4 {
  uint32_t even;  // bf16x2: code 0 (low half), code 2 (high half), each times 2^-120
  uint32_t odd;   // bf16x2: code 1, code 3
};

// (a & mask) | (b & ~mask) in one three-input logic instruction. Written as an instruction on the device: the compiler
// rewrites the sign term below with a second constant and then needs two.
DEEPINFER_WIDEN_FN uint32_t select_bits(uint32_t a, uint32_t b, uint32_t mask) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(mask));  // 0xE4 = (F0 & AA) | (CC & ~AA)
  return d;
#else
  return (a & mask) | (b & ~mask);
#endif
}

DEEPINFER_WIDEN_FN WidenedE4m3x4 widen_e4m3x4(uint32_t codes) {
  const uint32_t signs = codes & 0x80808080u;
  // ~mask keeps bits 15 and 31 of the sign words, and nothing else they hold: their other sign bits fall inside mask.
  return {select_bits(codes << 4, signs << 8, kWidenMagnitudeBits),
          select_bits(codes >> 4, signs, kWidenMagnitudeBits)};
}

// The low halves of a and b as one word (a's in the low half).
DEEPINFER_WIDEN_FN uint32_t pack_low_halves(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, 0x5410);
#else
  return (a & 0xffffu) | (b << 16);
#endif
}

// The high halves of a and b as one word (a's in the low half).
DEEPINFER_WIDEN_FN uint32_t pack_high_halves(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, 0x7632);
#else
  return (a >> 16) | (b & 0xffff0000u);
#endif
}

}  // namespace deepinfer::cuda::mla_detail

#undef DEEPINFER_WIDEN_FN
