// The rotary-embedding math of every CUDA kernel that rotates (rope, mla_prepare), in one place so that they round
// alike: the angle, its scaled cos and sin, and the rotation of one pair of a rope slice, read and written in the
// slice's element type with fp32 math.
#pragma once

#include <cstdint>

#include "backend/cuda/elementwise/elementwise_vec.cuh"

namespace deepinfer::cuda {

// The two elements of a pair as one 4-byte (bfloat16) or 8-byte (float) access.
template <typename T>
struct alignas(2 * sizeof(T)) RopePairBits {
  T first, second;
};

struct RopePair {
  float x0, x1;
};

// cos and sin of pair i's angle position * inv_freq[i], scaled by attention_scaling (YaRN). The angle is rounded to
// fp32 before cos and sin, like the CPU reference (no contraction into a later op); sincosf is the precise one, as
// positions reach 10^5 radians.
__device__ __forceinline__ void rope_cos_sin(int32_t position, float inv_freq, float attention_scaling, float& cos_a,
                                             float& sin_a) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq);
  sincosf(angle, &sin_a, &cos_a);
  cos_a *= attention_scaling;
  sin_a *= attention_scaling;
}

// x0' = x0 * cos - x1 * sin,  x1' = x1 * cos + x0 * sin
__device__ __forceinline__ RopePair rope_rotate(RopePair x, float cos_a, float sin_a) {
  return {x.x0 * cos_a - x.x1 * sin_a, x.x1 * cos_a + x.x0 * sin_a};
}

// Pair i of the rope slice at `slice` (rot_dim = 2 * half elements): (2i, 2i + 1) when interleaved, else (i, i + half).
// An interleaved pair moves as one access when its address allows.
template <typename T>
__device__ __forceinline__ RopePair load_rope_pair(const T* slice, int64_t i, int64_t half, bool interleaved) {
  const T* p0 = interleaved ? slice + 2 * i : slice + i;
  if (interleaved && is_aligned(p0, sizeof(RopePairBits<T>))) {
    const RopePairBits<T> v = *reinterpret_cast<const RopePairBits<T>*>(p0);
    return {to_float(v.first), to_float(v.second)};
  }
  const T* p1 = interleaved ? p0 + 1 : p0 + half;
  return {to_float(*p0), to_float(*p1)};
}

template <typename T>
__device__ __forceinline__ void store_rope_pair(T* slice, int64_t i, int64_t half, bool interleaved, RopePair r) {
  T* p0 = interleaved ? slice + 2 * i : slice + i;
  if (interleaved && is_aligned(p0, sizeof(RopePairBits<T>))) {
    *reinterpret_cast<RopePairBits<T>*>(p0) = RopePairBits<T>{from_float<T>(r.x0), from_float<T>(r.x1)};
    return;
  }
  T* p1 = interleaved ? p0 + 1 : p0 + half;
  *p0 = from_float<T>(r.x0);
  *p1 = from_float<T>(r.x1);
}

}  // namespace deepinfer::cuda
