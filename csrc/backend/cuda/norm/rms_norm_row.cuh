// RMSNorm of one row by one thread block: the reduction and rounding of the rms_norm kernel, shared with
// mla_prepare's kernel so that both normalize c_kv to the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/elementwise/elementwise_vec.cuh"

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

// The weights of a thread's first kCached elements of a row (j, j + kThreads, ...; 0 past dim), loaded ahead: a
// kernel may load them before its grid dependency wait, as they are constants.
template <int kThreads, int kCached>
struct RowWeightsAhead {
  float w[kCached];
  __device__ __forceinline__ void load(const float* weight, int64_t dim) {
#pragma unroll
    for (int c = 0; c < kCached; ++c) {
      const int64_t i = threadIdx.x + int64_t{c} * kThreads;
      w[c] = i < dim ? weight[i] : 0.0f;
    }
  }
};

// out[i] = weight[i] * (x[i] * rsqrt(mean(x^2) + eps)) for the `dim` elements of one row, by the block's kThreads
// threads (all of them must call it). Thread j sums the squares of elements j, j + kThreads, ... in fp32, the block
// adds the threads' sums; then thread j hands each of its values, rounded to T, to store(i, value). Its first kCached
// elements stay in registers between the two passes and take their weights from `ahead`; later ones are read again
// (x and weight). Each element is stored by the thread that read it, so `store` may write x in place. Uses
// sum_over_block: once a kernel.
template <int kThreads, int kCached, typename T, typename Store>
__device__ __forceinline__ void rms_norm_row(const T* x, const RowWeightsAhead<kThreads, kCached>& ahead,
                                             const float* weight, int64_t dim, float eps, Store&& store) {
  float kept[kCached];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    const int64_t i = threadIdx.x + int64_t{c} * kThreads;
    kept[c] = i < dim ? to_float(x[i]) : 0.0f;
    if (i < dim) sum_sq = fmaf(kept[c], kept[c], sum_sq);
  }
  for (int64_t i = threadIdx.x + int64_t{kCached} * kThreads; i < dim; i += kThreads) {
    const float v = to_float(x[i]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv_rms = rsqrtf(sum_over_block<kThreads>(sum_sq) / static_cast<float>(dim) + eps);
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    const int64_t i = threadIdx.x + int64_t{c} * kThreads;
    if (i < dim) store(i, from_float<T>(ahead.w[c] * (kept[c] * inv_rms)));
  }
  for (int64_t i = threadIdx.x + int64_t{kCached} * kThreads; i < dim; i += kThreads) {
    store(i, from_float<T>(weight[i] * (to_float(x[i]) * inv_rms)));
  }
}

// The same with no weights loaded ahead: the thread's first element is still kept between the passes.
template <int kThreads, typename T, typename Store>
__device__ __forceinline__ void rms_norm_row(const T* x, const float* weight, int64_t dim, float eps, Store&& store) {
  RowWeightsAhead<kThreads, 1> ahead;
  ahead.load(weight, dim);
  rms_norm_row<kThreads>(x, ahead, weight, dim, eps, static_cast<Store&&>(store));
}

}  // namespace deepinfer::cuda
