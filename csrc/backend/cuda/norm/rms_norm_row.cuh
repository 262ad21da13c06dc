// RMSNorm of one row by one thread block: the reduction and rounding of the rms_norm kernel, shared with
// mla_prepare's kernel so that both normalize c_kv to the same bits. Its pieces (the block sum, and RowSlice and
// RowWeightsAhead, which keep a thread's values and weights in registers between the passes) are also those of the
// fused residual norm (norm_residual.cu).
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

// The elements of a row that thread j of a kThreads-thread block handles: chunks of kVec consecutive elements at
// kVec (j + c kThreads), c = 0, 1, ... The first kKept chunks are visited in an unrolled loop, so what one pass computes
// for them can stay in registers (arrays indexed by c) until the next; later chunks are visited in a plain loop.
// Every pass visits the same elements from the same thread, so a pass may write what an earlier one read.
template <int kThreads, int kVec, int kKept>
struct RowSlice {
  static constexpr int64_t kStride = int64_t{kThreads} * kVec;  // elements between a thread's chunks
  int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;        // the thread's first element

  // kept(c, i) for the thread's first kKept chunks inside the row (i: the chunk's first element), then rest(i).
  template <typename Kept, typename Rest>
  __device__ __forceinline__ void for_each(const int64_t& dim, Kept&& kept, Rest&& rest) const {
#pragma unroll
    for (int c = 0; c < kKept; ++c) {
      if (first + c * kStride < dim) kept(c, first + c * kStride);
    }
    for (int64_t i = first + kKept * kStride; i < dim; i += kStride) rest(i);
  }
};

// kVec consecutive weights from `weight`, in 16-byte loads when kVec is a multiple of 4 (the caller checked the
// alignment).
template <int kVec>
__device__ __forceinline__ void load_weights(const float* weight, float (&w)[kVec]) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      const float4 f = *reinterpret_cast<const float4*>(weight + j);
      w[j] = f.x;
      w[j + 1] = f.y;
      w[j + 2] = f.z;
      w[j + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) w[j] = weight[j];
  }
}

// The weights of a thread's first kKept chunks of a row (RowSlice's), loaded ahead: a kernel may load them before its
// grid dependency wait, as they are constants. Chunks past the row are left unset (RowSlice never visits them).
template <int kThreads, int kKept, int kVec = 1>
struct RowWeightsAhead {
  using Slice = RowSlice<kThreads, kVec, kKept>;
  float w[kKept][kVec];
  __device__ __forceinline__ void load(const float* weight, int64_t dim, const Slice& slice = {}) {
    slice.for_each(dim, [&](int c, int64_t i) { load_weights(weight + i, w[c]); }, [](int64_t) {});
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
  const RowSlice<kThreads, 1, kCached> slice;
  float kept[kCached];
  float sum_sq = 0.0f;
  slice.for_each(
      dim,
      [&](int c, int64_t i) {
        kept[c] = to_float(x[i]);
        sum_sq = fmaf(kept[c], kept[c], sum_sq);
      },
      [&](int64_t i) {
        const float v = to_float(x[i]);
        sum_sq = fmaf(v, v, sum_sq);
      });
  const float inv_rms = rsqrtf(sum_over_block<kThreads>(sum_sq) / static_cast<float>(dim) + eps);
  slice.for_each(
      dim, [&](int c, int64_t i) { store(i, from_float<T>(ahead.w[c][0] * (kept[c] * inv_rms))); },
      [&](int64_t i) { store(i, from_float<T>(weight[i] * (to_float(x[i]) * inv_rms))); });
}

// The same with no weights loaded ahead: the thread's first element is still kept between the passes.
template <int kThreads, typename T, typename Store>
__device__ __forceinline__ void rms_norm_row(const T* x, const float* weight, int64_t dim, float eps, Store&& store) {
  RowWeightsAhead<kThreads, 1> ahead;
  ahead.load(weight, dim);
  rms_norm_row<kThreads>(x, ahead, weight, dim, eps, static_cast<Store&&>(store));
}

}  // namespace deepinfer::cuda
