// The arithmetic of the FP8 latent cache row (backend/ops/latent_fp8.h) as the CUDA kernels do it, on the host and on
// the device from one source: the group scale, the e4m3 code, the bf16 bits of k_pe, and the widening of two codes.
// Each function returns the bits of its host reference (latent_fp8_scale, float_to_e4m3, float_to_bf16,
// e4m3_to_float); the host-only tests check that on the host compilation, the GPU tests on the device.
//
// Only exactly rounded operations are used (a division with round-to-nearest, spelled __fdiv_rn on the device so that
// no fast-math flag can turn it into an approximate one; multiplies by powers of two; conversions with
// round-to-nearest-even), so the device and the host give the same bits.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DI_LATENT_FP8_FN __host__ __device__ __forceinline__
#else
#define DI_LATENT_FP8_FN inline
#endif

namespace deepinfer::cuda {

inline constexpr int kLatentFp8Group = 128;    // c_kv values a scale covers (LatentFp8Layout::kGroup)
inline constexpr int kLatentFp8MaxGroups = 16;  // the groups a kernel's shared amax array holds: kv_lora_rank <= 2048

namespace latent_fp8_detail {

DI_LATENT_FP8_FN uint32_t bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
#endif
}

DI_LATENT_FP8_FN float float_of(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
#endif
}

DI_LATENT_FP8_FN float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace latent_fp8_detail

// The scale of a group whose largest magnitude is `amax`: the smallest power of two 2^k with amax / 2^k <= 448, with
// amax / 448 rounded to nearest first, as latent_fp8_scale does; 1 for 0 and for a non-finite amax; 2^-126 at least.
DI_LATENT_FP8_FN float latent_fp8_group_scale(float amax) {
  if (!(amax > 0.0f) || !(amax <= 0x1.fffffep127f)) return 1.0f;  // 0, NaN, infinity
  const float x = latent_fp8_detail::divide_rn(amax, 448.0f);
  if (x < 0x1p-126f) return 0x1p-126f;
  const uint32_t bits = latent_fp8_detail::bits_of(x);
  const uint32_t exponent = bits & 0x7f800000u;
  // x itself when its mantissa is zero, else the next binade (x <= 2^128 / 448: never past the largest exponent).
  return latent_fp8_detail::float_of((bits & 0x007fffffu) == 0 ? exponent : exponent + 0x00800000u);
}

// 1 / scale for a power-of-two scale from latent_fp8_group_scale: exact.
DI_LATENT_FP8_FN float latent_fp8_inverse_scale(float scale) { return latent_fp8_detail::divide_rn(1.0f, scale); }

// The e4m3 code of `v` (a c_kv value times its group's inverse scale): nearest, ties to even, saturating at +-448;
// any NaN gives 0x7f (the hardware conversion's NaN need not be that one, so it is not asked).
DI_LATENT_FP8_FN uint8_t latent_fp8_code(float v) {
  if (v != v) return 0x7f;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// The bfloat16 bits of `v`, nearest even; a NaN keeps its sign and gets the quiet bit (core/half.h's float_to_bf16,
// whose NaN the device conversion would canonicalize).
DI_LATENT_FP8_FN uint16_t latent_fp8_bf16_bits(float v) {
  const uint32_t bits = latent_fp8_detail::bits_of(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

// The values of two e4m3 codes (low byte first), exact: every e4m3 value is a half.
DI_LATENT_FP8_FN float2 latent_fp8_values(uint16_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return __half22float2(__half2(h));
}

}  // namespace deepinfer::cuda
