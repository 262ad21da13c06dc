// A counter-based random number generator, and the float math derived from it, with the same bits on the host and
// on the device.
//
// uniform01(seed, step, index) is a pure function: no state, so any thread of any backend can draw the number of
// token `index` at decoding step `step` of the request seeded with `seed`, in any order. Its bits come from two
// levels of splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): the
// output function mix64 is a strong 64-bit finalizer, and a Weyl sequence with the golden-ratio increment feeds it.
//   stream(seed, step) = mix64(mix64(seed) + (step + 1) * kGolden)   one stream per (request, step)
//   bits(seed, step, i) = mix64(stream(seed, step) + (i + 1) * kGolden)
// The top 23 bits become the float (2k + 1) / 2^24: exact, uniform on the 2^23 midpoints of (0, 1), never 0 or 1.
//
// Only integer operations and exactly rounded float operations (+ - * / with round-to-nearest) are used, each
// spelled out on the device (__fadd_rn ...) so that nvcc does not contract them into FMAs; on the host the same
// expressions round the same way (x86-64 and AArch64 SSE/NEON arithmetic; do not build the host side with
// -ffp-contract=fast on a target with FMA). The library's logf and expf are not used: the host's and the device's
// differ in the last bit on some inputs. det_log and det_exp below are accurate to about 2 ulp, which is plenty for
// noise and for masses.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DI_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DI_HOST_DEVICE inline
#endif

namespace deepinfer::counter_rng {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// splitmix64's output function (Stafford's "Mix13").
DI_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of one (request, step): hoisted out of the per-token loop.
DI_HOST_DEVICE uint64_t stream_key(uint64_t seed, int32_t step) {
  return mix64(mix64(seed) + (static_cast<uint64_t>(static_cast<uint32_t>(step)) + 1) * kGolden);
}

DI_HOST_DEVICE uint64_t bits_at(uint64_t key, int32_t index) {
  return mix64(key + (static_cast<uint64_t>(static_cast<uint32_t>(index)) + 1) * kGolden);
}

// (2k + 1) / 2^24 for the top 23 bits k: in [2^-24, 1 - 2^-24].
DI_HOST_DEVICE float uniform01_at(uint64_t key, int32_t index) {
  const auto odd = static_cast<uint32_t>((bits_at(key, index) >> 41) << 1 | 1u);  // < 2^24: exact as a float
  return static_cast<float>(odd) * 0x1p-24f;
}

DI_HOST_DEVICE float uniform01(uint64_t seed, int32_t step, int32_t index) {
  return uniform01_at(stream_key(seed, step), index);
}

// ---------------------------------------------------------------------------------------------------------------
// Exactly rounded float operations, the same on both sides.

DI_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DI_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DI_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DI_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DI_HOST_DEVICE float floor_f(float a) {
#if defined(__CUDA_ARCH__)
  return floorf(a);
#else
  return std::floor(a);
#endif
}
DI_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
DI_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

inline constexpr float kLn2Hi = 0.693145751953125f;       // 16 significant bits: n * kLn2Hi is exact for |n| < 256
inline constexpr float kLn2Lo = 1.42860682030941723212e-6f;  // ln 2 - kLn2Hi

// log(x) for a positive normal float: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(z) with
// z = (m - 1) / (m + 1), |z| < 0.172, as an odd series to z^9.
DI_HOST_DEVICE float det_log(float x) {
  uint32_t bits = float_bits(x);
  int32_t e = static_cast<int32_t>(bits >> 23) - 127;
  uint32_t m_bits = (bits & 0x007FFFFFu) | 0x3F800000u;  // m in [1, 2)
  if (m_bits > 0x3FB504F3u) {                            // m > sqrt(2): halve it
    m_bits -= 0x00800000u;
    e += 1;
  }
  const float m = bits_float(m_bits);
  const float z = div_rn(sub_rn(m, 1.0f), add_rn(m, 1.0f));  // m - 1 is exact
  const float z2 = mul_rn(z, z);
  float p = add_rn(2.0f / 7.0f, mul_rn(z2, 2.0f / 9.0f));
  p = add_rn(2.0f / 5.0f, mul_rn(z2, p));
  p = add_rn(2.0f / 3.0f, mul_rn(z2, p));
  const float log_m = add_rn(mul_rn(2.0f, z), mul_rn(mul_rn(z, z2), p));
  const auto ef = static_cast<float>(e);
  return add_rn(mul_rn(ef, kLn2Hi), add_rn(mul_rn(ef, kLn2Lo), log_m));
}

// exp(x) for x in [-87, 0]: x = n ln 2 + r with |r| <= ln(2) / 2, exp(r) by its Taylor series to r^7, times 2^n.
DI_HOST_DEVICE float det_exp(float x) {
  const float n = floor_f(add_rn(mul_rn(x, 1.44269504088896341f), 0.5f));
  const float r = sub_rn(sub_rn(x, mul_rn(n, kLn2Hi)), mul_rn(n, kLn2Lo));  // the first difference is exact
  float p = add_rn(1.0f / 720.0f, mul_rn(r, 1.0f / 5040.0f));
  p = add_rn(1.0f / 120.0f, mul_rn(r, p));
  p = add_rn(1.0f / 24.0f, mul_rn(r, p));
  p = add_rn(1.0f / 6.0f, mul_rn(r, p));
  p = add_rn(0.5f, mul_rn(r, p));
  p = add_rn(1.0f, mul_rn(r, p));
  p = add_rn(1.0f, mul_rn(r, p));
  return mul_rn(p, bits_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23));  // 2^n, n >= -126
}

// Gumbel noise -log(-log(u)) of token `index`: in [-2.8116, 16.6356] (u in [2^-24, 1 - 2^-24]).
DI_HOST_DEVICE float gumbel_at(uint64_t key, int32_t index) {
  return -det_log(-det_log(uniform01_at(key, index)));
}

inline constexpr float kGumbelMin = -2.8116f;  // bounds of gumbel_at, rounded outwards
inline constexpr float kGumbelMax = 16.6356f;

// ---------------------------------------------------------------------------------------------------------------
// The sampler's top-p arithmetic (ops/sample.h), shared by both backends so their kept sets agree bit for bit:
// masses are exp(s - max s) in 32-bit fixed point, whose sums are exact and independent of the summation order.

inline constexpr float kMassCutoff = -23.0f;  // exp(x) * 2^32 < 1 below this: the mass is 0

// floor(exp(x) * 2^32) for x = s - max(s) <= 0, computed as a float.
DI_HOST_DEVICE uint64_t softmax_mass(float x) {
  if (!(x >= kMassCutoff)) return 0;  // and -inf, NaN
  return static_cast<uint64_t>(mul_rn(det_exp(x), 0x1p32f));
}

// The smallest integer mass that holds top_p of `total` (total < 2^53, so both conversions are exact).
DI_HOST_DEVICE uint64_t top_p_target(float top_p, uint64_t total) {
  const double t = static_cast<double>(top_p) * static_cast<double>(total);
  const auto whole = static_cast<uint64_t>(t);
  return static_cast<double>(whole) < t ? whole + 1 : whole;
}

}  // namespace deepinfer::counter_rng
