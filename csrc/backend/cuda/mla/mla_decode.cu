// MLA decode launcher: parameter checks, the split heuristic, kernel choice (by cache format and head count) and the
// split-combine kernel, which is the same for every kernel: they all write the same partials.
#include "backend/cuda/mla/mla_decode.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/mla_decode_internal.h"
#include "backend/cuda/mla/mla_split_weights.cuh"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

using mla_detail::kBlockN;
using mla_detail::kValueDim;

constexpr int kCombineThreads = 128;  // 4 warps; a lane combines 4 adjacent columns
constexpr int kCombineWarps = kCombineThreads / 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool reads_fp8(const MlaDecodeParams& p) { return p.cache_fp8 != nullptr; }

// The FP8 cache has one kernel (16 heads per CTA: mla_decode_fp8_kernel.cuh); the bf16 cache picks by head count.
MlaDecodeKernel resolve_kernel(const MlaDecodeParams& p) {
  if (p.kernel != MlaDecodeKernel::kAuto) return p.kernel;
  if (reads_fp8(p)) return MlaDecodeKernel::kNarrowFp8;
  return p.num_heads % mla_detail::kWideHeads == 0 ? MlaDecodeKernel::kWideWgmma : MlaDecodeKernel::kNarrow;
}

int heads_per_cta(MlaDecodeKernel kernel) {
  return kernel == MlaDecodeKernel::kNarrow || kernel == MlaDecodeKernel::kNarrowFp8 ? mla_detail::kNarrowHeads
                                                                                      : mla_detail::kWideHeads;
}

const char* kernel_name(MlaDecodeKernel kernel) {
  switch (kernel) {
    case MlaDecodeKernel::kAuto: return "auto";
    case MlaDecodeKernel::kNarrow: return "narrow";
    case MlaDecodeKernel::kWide: return "wide";
    case MlaDecodeKernel::kWideWgmma: return "wide_wgmma";
    case MlaDecodeKernel::kNarrowFp8: return "narrow_fp8";
  }
  return "?";
}

__device__ __forceinline__ float block_reduce(float v, float* scratch, bool is_max) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kCombineWarps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch is reused
  return r;
}

// out[b, h, :] = sum_k w_k * part[k, b, h, :] / sum_k w_k with w_k = 2^(lse_k - max lse), empty splits (lse -inf)
// skipped. Grid (batch * heads, kColGroups): a block combines 512 / kColGroups columns of one row; its warps split
// into kColGroups groups that each take every kColGroups-th split, so many splits are read with more parallelism.
template <int kColGroups>
__global__ void __launch_bounds__(kCombineThreads)
    mla_decode_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
  constexpr int kCols = kValueDim / kColGroups;          // columns of this block
  constexpr int kWarpsPerGroup = kCols / 128;            // a warp covers 128 columns
  constexpr int kGroups = kCombineWarps / kWarpsPerGroup;
  static_assert(kWarpsPerGroup >= 1 && kGroups * kWarpsPerGroup == kCombineWarps, "1 or 4 column groups");
  __shared__ float weights[mla_detail::kMaxForcedSplits];
  __shared__ float scratch[kCombineWarps];
  __shared__ float4 group_acc[kGroups][kCols / 4];
  if (p.trigger_early != 0) ptx::griddep_launch_dependents();  // the next kernel reads only constants before its wait
  ptx::griddep_wait();  // the attention grid's partials are complete and visible
  ptx::griddep_launch_dependents();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  const int64_t row = blockIdx.x;
  const float* part = static_cast<const float*>(p.workspace);
  const float* lse = part + static_cast<int64_t>(p.num_splits) * rows * kValueDim;

  const auto row_lse = [&](int k) { return lse[k * rows + row]; };
  const int first = static_cast<int>(threadIdx.x);
  const float lse_max =
      block_reduce(mla_detail::splits_lse_max(first, kCombineThreads, p.num_splits, row_lse), scratch, true);
  const float weight_sum = block_reduce(  // its barriers also publish `weights`
      mla_detail::split_weights(first, kCombineThreads, p.num_splits, lse_max, row_lse,
                                [&](int k, float w) { weights[k] = w; }),
      scratch, false);

  const int group = warp / kWarpsPerGroup;
  const int col_in_block = (warp % kWarpsPerGroup) * 128 + lane * 4;
  const float* src = part + row * kValueDim + blockIdx.y * kCols + col_in_block;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int k = group; k < p.num_splits; k += kGroups) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src + k * rows * kValueDim));
    const float w = weights[k];
    if (w > 0.0f) {  // an empty split wrote no partial: never multiply what it left there
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
  }
  if constexpr (kGroups > 1) {
    group_acc[group][col_in_block / 4] = acc;
    __syncthreads();
    if (group != 0) return;
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      const float4 v = group_acc[g][col_in_block / 4];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
  }
  const float inv = mla_detail::inverse_weight_sum(weight_sum);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p.out + row * kValueDim + blockIdx.y * kCols + col_in_block) = packed;
}

// The combine may start launching while the attention grid drains (each attention CTA allows it once its main loop
// is done) and waits for that grid's memory at griddep_wait.
template <int kColGroups>
void launch_combine(const MlaDecodeParams& p, LaunchStream stream) {
  launch_pdl(mla_decode_combine_kernel<kColGroups>,
             {.grid = dim3(static_cast<unsigned>(static_cast<int64_t>(p.batch) * p.num_heads), kColGroups),
              .block = dim3(kCombineThreads)},
             stream, p);
}

}  // namespace

int mla_decode_num_splits(const MlaDecodeParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  const int64_t ctas = static_cast<int64_t>(p.batch) * (p.num_heads / heads_per_cta(resolve_kernel(p)));
  const int64_t max_tiles = ceil_div(std::max(p.max_context_len, 1), kBlockN);
  if (ctas <= 0 || max_tiles <= 1) return 1;
  if (p.forced_splits > 0) return static_cast<int>(std::min<int64_t>(p.forced_splits, max_tiles));
  // Time ~ waves * (tiles per split + fixed cost of a CTA: query load, pipeline fill) + splits * (a partial written
  // and read back by the combine), one CTA per SM (both kernels use most of the shared memory). Ties go to fewer
  // splits. The split cost is fitted to the v2-lite step at batch 1 on an H200 (docs/experiments/mla_decode_splits/):
  // at 1k one-tile splits beat fewer, longer ones, and at 8k splits of 4-5 tiles beat twice as many of 2.
  // The FP8 kernel takes the same costs in its own tiles, unmeasured: where splits matter (few CTAs, each latency-
  // bound), both kernels keep two 64-token tiles in flight, so a tile costs about the same time in either format;
  // with enough CTAs to fill the GPU (bandwidth-bound) the heuristic chooses one split for both.
  constexpr double kCtaOverheadTiles = 1.0;
  constexpr double kSplitCostTiles = 0.1;
  const int64_t sms = std::max(p.num_sms, 1);
  const int64_t limit = std::min<int64_t>(mla_detail::kMaxSplits, max_tiles);
  int best = 1;
  double best_cost = 0.0;
  for (int64_t s = 1; s <= limit; ++s) {
    const double waves = static_cast<double>(ceil_div(ctas * s, sms));
    const double cost = waves * (static_cast<double>(ceil_div(max_tiles, s)) + kCtaOverheadTiles) +
                        kSplitCostTiles * static_cast<double>(s);
    if (s == 1 || cost < best_cost - 1e-9) {
      best = static_cast<int>(s);
      best_cost = cost;
    }
  }
  return best;
}

size_t mla_decode_workspace_bytes(const MlaDecodeParams& p) {
  const int splits = mla_decode_num_splits(p);
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.batch) * static_cast<size_t>(p.num_heads);
  return static_cast<size_t>(splits) * rows * (kValueDim + 1) * sizeof(float);
}

void mla_decode(const MlaDecodeParams& p, LaunchStream stream) {
  DI_CHECK(p.batch >= 0 && p.batch <= 65535, "mla_decode: batch ", p.batch, " outside [0, 65535]");
  if (p.batch == 0) return;
  const MlaDecodeKernel kernel = resolve_kernel(p);
  DI_CHECK(p.num_heads > 0 && p.num_heads % heads_per_cta(kernel) == 0, "mla_decode: ", p.num_heads,
           " heads is not a positive multiple of ", heads_per_cta(kernel), " (heads per CTA of the chosen kernel)");
  DI_CHECK(p.page_size > 0 && p.max_pages_per_seq > 0, "mla_decode: page_size ", p.page_size,
           ", max_pages_per_seq ", p.max_pages_per_seq);
  DI_CHECK((p.cache != nullptr) != (p.cache_fp8 != nullptr), "mla_decode: exactly one of cache (bf16) and cache_fp8 ",
           "is given (got ", p.cache != nullptr ? "cache" : "no cache", " and ",
           p.cache_fp8 != nullptr ? "cache_fp8" : "no cache_fp8", ")");
  DI_CHECK((kernel == MlaDecodeKernel::kNarrowFp8) == reads_fp8(p), "mla_decode: kernel ", kernel_name(kernel),
           " does not read the ", reads_fp8(p) ? "FP8 cache (narrow_fp8 does)" : "bf16 cache (narrow_fp8 reads FP8)");
  const void* cache = reads_fp8(p) ? static_cast<const void*>(p.cache_fp8) : static_cast<const void*>(p.cache);
  DI_CHECK(p.q != nullptr && p.page_table != nullptr && p.context_lens != nullptr && p.out != nullptr,
           "mla_decode: null tensor pointer");
  DI_CHECK(reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && reinterpret_cast<uintptr_t>(cache) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(p.out) % 16 == 0,
           "mla_decode: q, cache and out must be 16-byte aligned");
  DI_CHECK(p.fresh_rows >= -1, "mla_decode: fresh_rows ", p.fresh_rows, " (-1: unknown, else >= 0)");
  MlaDecodeParams kp = p;
  kp.kernel = kernel;
  kp.num_splits = mla_decode_num_splits(p);
  DI_CHECK(kp.num_splits >= 1 && kp.num_splits <= mla_detail::kMaxForcedSplits, "mla_decode: ", kp.num_splits,
           " splits outside [1, ", mla_detail::kMaxForcedSplits, "]");
  if (kp.num_splits > 1) {
    DI_CHECK(p.workspace != nullptr && reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0,
             "mla_decode: ", kp.num_splits, " splits need a 16-byte aligned workspace of ",
             mla_decode_workspace_bytes(kp), " bytes");
  }
  switch (kernel) {
    case MlaDecodeKernel::kNarrow: mla_detail::launch_mla_decode_narrow(kp, stream); break;
    case MlaDecodeKernel::kWideWgmma: mla_detail::launch_mla_decode_wide_wgmma(kp, stream); break;
    case MlaDecodeKernel::kNarrowFp8: mla_detail::launch_mla_decode_narrow_fp8(kp, stream); break;
    default: mla_detail::launch_mla_decode_wide(kp, stream); break;
  }
  if (kp.defer_combine != 0) return;  // the next kernel reads the partials
  if (kp.num_splits > 8) {
    launch_combine<4>(kp, stream);  // many splits: four blocks a row, four split groups a block
  } else if (kp.num_splits > 1) {
    launch_combine<1>(kp, stream);
  }
}

}  // namespace deepinfer::cuda
