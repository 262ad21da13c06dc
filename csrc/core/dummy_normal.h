// The values of dummy weights (load_format="dummy"), the same bits on the host and on the device.
//
// Value i of a tensor is kDummyStd * z, z a standard normal made by Box–Muller from the two 32-bit halves of
// h = mix64(key + i * kGolden), key = mix64(fnv1a64(name) ^ mix64(seed)) (a splitmix64 stream per tensor). Each value
// depends on its index alone, so any range equals the same elements of a whole read, and the device that holds a
// weight can make its values itself instead of receiving them from the host. The logarithm, sine and square root are
// polynomials and Newton steps in exactly rounded float operations (counter_rng.h: spelled out on the device, so that
// nvcc does not contract them into FMAs): the values depend neither on the platform's libm nor on the processor.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/counter_rng.h"

namespace deepinfer::dummy_normal {

inline constexpr float kDummyStd = 0.02f;

// 64-bit FNV-1a: stable across platforms and standard libraries (std::hash is implementation-defined).
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// The stream of tensor `name` of the dummy weights seeded with `seed`.
inline uint64_t tensor_key(uint64_t seed, std::string_view name) {
  return counter_rng::mix64(fnv1a64(name) ^ counter_rng::mix64(seed));
}

// ln(u) for normal u > 0, to about 1e-7: u = 2^e * m with m in [sqrt(1/2), sqrt(2)), and
// ln(m) = 2 atanh(s) = 2 (s + s^3/3 + ... + s^9/9) with s = (m - 1) / (m + 1), |s| < 0.172.
DI_HOST_DEVICE float log_approx(float u) {
  using namespace counter_rng;
  constexpr uint32_t kSqrtHalfBits = 0x3f3504f3u;  // sqrt(1/2)
  const uint32_t shifted = float_bits(u) - kSqrtHalfBits;
  const int32_t e = static_cast<int32_t>(shifted) >> 23;
  const float m = bits_float((shifted & 0x007fffffu) + kSqrtHalfBits);
  const float s = div_rn(sub_rn(m, 1.0f), add_rn(m, 1.0f));
  const float s2 = mul_rn(s, s);
  float p = add_rn(2.0f / 7, mul_rn(s2, 2.0f / 9));
  p = add_rn(2.0f / 5, mul_rn(s2, p));
  p = add_rn(2.0f / 3, mul_rn(s2, p));
  p = add_rn(2.0f, mul_rn(s2, p));
  return add_rn(mul_rn(static_cast<float>(e), 0.693147180559945f), mul_rn(s, p));
}

// sin(2 pi b) for b in [-1/4, 1/4], to about 1e-7 (Taylor series through y^11).
DI_HOST_DEVICE float sin_2pi_approx(float b) {
  using namespace counter_rng;
  const float y = mul_rn(6.283185307179586f, b);
  const float y2 = mul_rn(y, y);
  float p = add_rn(1.0f / 362880, mul_rn(y2, -1.0f / 39916800));
  p = add_rn(-1.0f / 5040, mul_rn(y2, p));
  p = add_rn(1.0f / 120, mul_rn(y2, p));
  p = add_rn(-1.0f / 6, mul_rn(y2, p));
  p = add_rn(1.0f, mul_rn(y2, p));
  return mul_rn(y, p);
}

// sqrt(x) for normal x > 0: three Newton steps on 1/sqrt(x) from the classic bit-level estimate.
DI_HOST_DEVICE float sqrt_approx(float x) {
  using namespace counter_rng;
  float y = bits_float(0x5f3759dfu - (float_bits(x) >> 1));
  for (int k = 0; k < 3; ++k) y = mul_rn(y, sub_rn(1.5f, mul_rn(mul_rn(mul_rn(0.5f, x), y), y)));
  return mul_rn(x, y);
}

// Box–Muller on two 32-bit halves (their top 24 bits, what a float holds): u1 in (0, 1), u2 in [0, 1),
// z = sqrt(-2 ln u1) * cos(2 pi u2), with cos(2 pi u2) = sin(2 pi (|u2 - 1/2| - 1/4)). |z| < 5.9.
DI_HOST_DEVICE float standard_normal(uint32_t hi, uint32_t lo) {
  using namespace counter_rng;
  const float u1 = mul_rn(add_rn(static_cast<float>(static_cast<int32_t>(hi >> 8)), 0.5f), 0x1p-24f);
  const float u2 = mul_rn(static_cast<float>(static_cast<int32_t>(lo >> 8)), 0x1p-24f);
  const float centered = sub_rn(u2, 0.5f);
  const float folded = bits_float(float_bits(centered) & 0x7fffffffu);  // |u2 - 1/2|
  return mul_rn(sqrt_approx(mul_rn(-2.0f, log_approx(u1))), sin_2pi_approx(sub_rn(folded, 0.25f)));
}

// Value `index` of stream `key`.
DI_HOST_DEVICE float value(uint64_t key, uint64_t index) {
  const uint64_t h = counter_rng::mix64(key + index * counter_rng::kGolden);
  return counter_rng::mul_rn(kDummyStd, standard_normal(static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(h)));
}

// Where a tensor's elements lie in a stream: its rows of row_length values, element (r, c) being value
// first + r * row_stride + c of stream `key` (row_stride > row_length: a slice of each row, a shard's columns).
struct StreamRange {
  uint64_t key = 0;
  int64_t first = 0;
  int64_t row_length = 1;
  int64_t row_stride = 1;
};

// Element j (row-major) of a tensor laid out as `range` says.
DI_HOST_DEVICE float value_at(const StreamRange& range, int64_t j) {
  const int64_t r = j / range.row_length, c = j - r * range.row_length;
  return value(range.key, static_cast<uint64_t>(range.first + r * range.row_stride + c));
}

}  // namespace deepinfer::dummy_normal
