// RMSNorm of one row by one thread block: the reduction and rounding of the rms_norm kernel, shared with
// mla_prepare's kernel so that both normalize c_kv to the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/elementwise_vec.cuh"

namespace deepinfer::cuda {

// Threads per block for rows of `dim` elements: short rows get a small block; hidden-size rows (2048..7168) enough
// threads to keep the loads in flight. The reduction order depends on it, so every user picks it here.
constexpr int rms_norm_block_threads(int64_t dim) { return dim <= 1024 ? 128 : 512; }

__device__ __forceinline__ float sum_over_warp(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of `v` over the block, returned to every thread. Its shared array is written once: call it once a kernel.
template <int kThreads>
__device__ __forceinline__ float sum_over_block(float v) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, 32..1024 threads");
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_totals[kWarps];
  v = sum_over_warp(v);
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_totals[w];
  return total;
}

// out[i] = weight[i] * (x[i] * rsqrt(mean(x^2) + eps)) for the `dim` elements of one row, by the block's kThreads
// threads (all of them must call it). Thread j sums the squares of elements j, j + kThreads, ... in fp32, the block
// adds the threads' sums; then thread j re-reads its own elements and hands each value, rounded to T, to
// store(i, value). Each element is stored by the thread that re-reads it, so `store` may write x in place. Uses
// sum_over_block: once a kernel.
template <int kThreads, typename T, typename Store>
__device__ __forceinline__ void rms_norm_row(const T* x, const float* weight, int64_t dim, float eps, Store&& store) {
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = to_float(x[i]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv_rms = rsqrtf(sum_over_block<kThreads>(sum_sq) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    store(i, from_float<T>(weight[i] * (to_float(x[i]) * inv_rms)));
  }
}

}  // namespace deepinfer::cuda
