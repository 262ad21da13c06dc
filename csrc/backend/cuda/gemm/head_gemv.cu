// Per-head GEMV kernel. A warp computes kRowsPerWarp consecutive weight rows (h, n .. n + kRowsPerWarp) of one head
// for every token: kLanesPerRow lanes share a row, each holding kChunksPerLane 16-byte chunks (8 elements) of it, and
// 32 / kLanesPerRow rows sit side by side, kIters such groups a warp. The weight chunks are loaded before
// griddep_wait (weights are never written during a step, so the loads overlap the previous kernel), then the x
// chunks (one set per token: the warp's rows share a head), the dot products in fp32, and a shuffle reduction over
// each row's lanes in a fixed order (the same bits every run). When x is known to be complete before the previous
// kernel (HeadGemvParams::before_wait) all of it runs before the wait, beside that kernel.
// With x_partials (the kFromPartials variant) the CTA first combines its head's rows of x from MLA decode's split
// partials into shared memory, which folds the split combine into W_UV and spares the step one dependent launch.
#include "backend/cuda/gemm/head_gemv.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/mla/mla_split_weights.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kIters = 4;  // row groups a warp: 4 x 16 B of weights a lane in flight per chunk

template <int kLanesPerRowValue, int kChunksPerLaneValue>
struct HeadGemvTraits {
  static constexpr int kLanesPerRow = kLanesPerRowValue;
  static constexpr int kChunksPerLane = kChunksPerLaneValue;
  static constexpr int kRowsPerIter = 32 / kLanesPerRow;
  static constexpr int kRowsPerWarp = kIters * kRowsPerIter;
  static constexpr int kK = 8 * kLanesPerRow * kChunksPerLane;
  static_assert(32 % kLanesPerRow == 0, "a row's lanes sit inside one warp");
};

// acc + the dot product of 8 bf16 weights and 8 bf16 activations, in element order.
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(xs[i] & 0xffff0000u), acc);
  }
  return acc;
}

// x rows combined from split partials (HeadGemvParams::x_partials): the splits' weights, then the rows in bf16.
template <typename T>
struct PartialsShared {
  float weight[kHeadGemvMaxTokens][kHeadGemvMaxSplits];  // log-sum-exps, then 2^(lse - max)
  float inv_sum[kHeadGemvMaxTokens];
  uint4 x[kHeadGemvMaxTokens][T::kK / 8];
};

// Splits of partials a thread loads together with the log-sum-exps, before the weights are known: 18 at batch 1
// and context 1k. The weights are the split combine's only dependency, so with them in flight too the combine costs
// one global round trip after the wait instead of one for the weights and one or more for the partials.
inline constexpr int kSplitsAhead = 24;

// Combines rows (t, head) of x for every token into s.x; every thread of the CTA calls it, after griddep_wait.
// The arithmetic is the split combine's (mla_decode.cu): the same weights (mla_split_weights.cuh), splits summed in
// order, the same rounding.
template <typename T>
__device__ void combine_partials(const HeadGemvParams& p, int64_t head, PartialsShared<T>& s) {
  constexpr int kK = T::kK;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int splits = p.x_splits, tokens = static_cast<int>(p.tokens);
  const int64_t rows = p.tokens * p.heads;
  const float* lse = p.x_partials + static_cast<int64_t>(splits) * rows * kK;
  // Element pair i of the combined rows: token i / (K / 2), columns 2 (i % (K / 2)) and the next; its partials are
  // rows * K floats apart from one split to the next.
  const auto pair_src = [&](int i) {
    return p.x_partials + (static_cast<int64_t>(i / (kK / 2)) * p.heads + head) * kK + 2 * (i % (kK / 2));
  };
  const int first = static_cast<int>(threadIdx.x);  // the thread's first pair
  const bool has_first = first < tokens * (kK / 2);
  float2 ahead[kSplitsAhead];
#pragma unroll
  for (int k = 0; k < kSplitsAhead; ++k) {
    ahead[k] = has_first && k < splits ? __ldcg(reinterpret_cast<const float2*>(pair_src(first) + k * rows * kK))
                                       : make_float2(0.0f, 0.0f);
  }
  for (int i = static_cast<int>(threadIdx.x); i < tokens * splits; i += kThreads) {
    const int t = i / splits, k = i % splits;
    s.weight[t][k] = __ldcg(lse + k * rows + t * p.heads + head);
  }
  __syncthreads();
  if (warp < tokens) {  // warp t: token t's weights and their sum
    float* weight = s.weight[warp];  // the log-sum-exps, turned into weights in place
    const auto lse = [&](int k) { return weight[k]; };
    float m = mla_detail::splits_lse_max(lane, 32, splits, lse);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float sum = mla_detail::split_weights(lane, 32, splits, m, lse, [&](int k, float w) { weight[k] = w; });
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) s.inv_sum[warp] = mla_detail::inverse_weight_sum(sum);
  }
  __syncthreads();
  for (int i = first; i < tokens * (kK / 2); i += kThreads) {
    const int t = i / (kK / 2), col = 2 * (i % (kK / 2));
    const float* src = pair_src(i);
    float acc0 = 0.0f, acc1 = 0.0f;
    const auto add = [&](int k, float2 v) {
      const float w = s.weight[t][k];
      if (w > 0.0f) {  // an empty split wrote no partial: never multiply what it left there
        acc0 += w * v.x;
        acc1 += w * v.y;
      }
    };
    int k = 0;
    if (i == first) {
#pragma unroll
      for (; k < kSplitsAhead; ++k) {
        if (k < splits) add(k, ahead[k]);
      }
    }
#pragma unroll 8
    for (; k < splits; ++k) add(k, __ldcg(reinterpret_cast<const float2*>(src + k * rows * kK)));
    const float inv = s.inv_sum[t];
    const __nv_bfloat162 pair = __floats2bfloat162_rn(acc0 * inv, acc1 * inv);
    reinterpret_cast<uint32_t*>(&s.x[t][0])[col / 2] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  __syncthreads();
}

template <typename T, bool kFromPartials>
__global__ void __launch_bounds__(kThreads) head_gemv_kernel(const __grid_constant__ HeadGemvParams p) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int sub = lane / T::kLanesPerRow, kl = lane % T::kLanesPerRow;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * T::kRowsPerWarp;
  const bool active = row0 < p.heads * p.n;  // the last CTA may have idle warps
  uint4 wv[kIters][T::kChunksPerLane];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const uint16_t* w_row = p.w + (row0 + i * T::kRowsPerIter + sub) * T::kK + kl * 8;
#pragma unroll
    for (int c = 0; c < T::kChunksPerLane; ++c) {
      wv[i][c] = active ? ptx::ld_stream_16(w_row + c * T::kLanesPerRow * 8) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // x comes from the previous kernel, or (p.before_wait) from one before it, complete once this grid has started
  // (ptx.cuh: a grid starts only after every CTA of its predecessor has passed its own wait).
  if (p.trigger_early != 0) ptx::griddep_launch_dependents();  // the next kernel reads only constants before its wait
  if (p.before_wait == 0) {
    ptx::griddep_wait();
    ptx::griddep_launch_dependents();
  }
  [[maybe_unused]] __shared__ std::conditional_t<kFromPartials, PartialsShared<T>, char> partials;
  if constexpr (kFromPartials) {
    // Every row of the CTA is in one head (head_gemv_fits: N a multiple of the CTA's rows).
    combine_partials<T>(p, static_cast<int64_t>(blockIdx.x) * kWarps * T::kRowsPerWarp / p.n, partials);
  }
  if (active) {
    const int64_t head = row0 / p.n, n0 = row0 % p.n;  // the warp's rows are all in this head (n % kRowsPerWarp == 0)
    uint4 xv[kHeadGemvMaxTokens][T::kChunksPerLane];
#pragma unroll
    for (int t = 0; t < kHeadGemvMaxTokens; ++t) {
#pragma unroll
      for (int c = 0; c < T::kChunksPerLane; ++c) {
        if constexpr (kFromPartials) {
          xv[t][c] = t < p.tokens ? partials.x[t][kl + c * T::kLanesPerRow] : make_uint4(0u, 0u, 0u, 0u);
        } else {
          const uint16_t* x_row = p.x + (t * p.heads + head) * p.x_head_stride + kl * 8;
          xv[t][c] = t < p.tokens ? __ldcg(reinterpret_cast<const uint4*>(x_row + c * T::kLanesPerRow * 8))
                                  : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kHeadGemvMaxTokens; ++t) {
      if (t >= p.tokens) break;  // the same for the whole warp
      uint16_t* out_row = p.out + (t * p.heads + head) * p.out_head_stride + n0;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < T::kChunksPerLane; ++c) acc = dot8(wv[i][c], xv[t][c], acc);
#pragma unroll
        for (int offset = T::kLanesPerRow / 2; offset > 0; offset >>= 1) {
          acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        }
        if (kl == 0) out_row[i * T::kRowsPerIter + sub] = __bfloat16_as_ushort(__float2bfloat16_rn(acc));
      }
    }
  }
  if (p.before_wait != 0) {  // no CTA leaves before its wait: the next grid relies on it (ptx.cuh)
    ptx::griddep_wait();
    ptx::griddep_launch_dependents();
  }
}

// Calls f with the variant (a traits value) for K; false when the kernel has none.
template <typename F>
bool with_variant(int64_t k, F&& f) {
  switch (k) {
    case 64: f(HeadGemvTraits<8, 1>{}); return true;
    case 128: f(HeadGemvTraits<16, 1>{}); return true;
    case 256: f(HeadGemvTraits<32, 1>{}); return true;
    case 512: f(HeadGemvTraits<32, 2>{}); return true;
    default: return false;
  }
}

// CTAs of the grid: one warp per kRowsPerWarp rows, kWarps warps a CTA.
int64_t grid_ctas(const HeadGemvParams& p, int64_t rows_per_warp) {
  return (p.heads * p.n / rows_per_warp + kWarps - 1) / kWarps;
}

// The variant combining x from split partials exists for MLA's 512-wide latent only.
template <typename T>
constexpr bool kHasPartialsVariant = T::kK == 512;

template <typename T, bool kFromPartials>
void launch(const HeadGemvParams& p, LaunchStream stream) {
  const dim3 grid(static_cast<unsigned>(grid_ctas(p, T::kRowsPerWarp)));
  launch_pdl(head_gemv_kernel<T, kFromPartials>, {.grid = grid, .block = dim3(kThreads)}, stream, p);
}

// CTAs of the variant one SM holds at once (its registers and shared memory decide), asked of the runtime once.
template <typename T, bool kFromPartials>
int blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, head_gemv_kernel<T, kFromPartials>, kThreads, 0));
    return n;
  }();
  return blocks;
}

struct Variant {
  int64_t rows_per_warp = 0;  // 0: no variant for this K (and x source)
  int blocks_per_sm = 0;
};

Variant variant(int64_t k, bool from_partials) {
  Variant v;
  with_variant(k, [&](auto traits) {
    using T = decltype(traits);
    if (!from_partials) {
      v = {T::kRowsPerWarp, blocks_per_sm<T, false>()};
    } else if constexpr (kHasPartialsVariant<T>) {
      v = {T::kRowsPerWarp, blocks_per_sm<T, true>()};
    }
  });
  return v;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool head_gemv_fits(const HeadGemvParams& p) {
  const bool from_partials = p.x_partials != nullptr;
  const Variant v = variant(p.k, from_partials);
  if (v.rows_per_warp == 0 || p.tokens < 1 || p.tokens > kHeadGemvMaxTokens || p.heads < 1 || p.n < 1 ||
      p.n % v.rows_per_warp != 0 || p.out_head_stride < p.n || !aligned16(p.w) || p.out == nullptr) {
    return false;
  }
  if (from_partials) {
    // A CTA's rows share one head; the partials come from the kernel right before, so nothing runs before the wait.
    if (p.x_splits < 2 || p.x_splits > kHeadGemvMaxSplits || p.n % (v.rows_per_warp * kWarps) != 0 ||
        p.before_wait != 0 || !aligned16(p.x_partials)) {
      return false;
    }
  } else if (p.x_head_stride < p.k || p.x_head_stride % 8 != 0 || !aligned16(p.x)) {
    return false;
  }
  // One wave only: every CTA resident at once issues its weight loads before the wait. A larger grid (V3's 128
  // heads: 512-1024 CTAs) would load most of its weights after it, and measured slower than cuBLAS there (the
  // v3-slice batch-1 step).
  return grid_ctas(p, v.rows_per_warp) <= int64_t{v.blocks_per_sm} * p.num_sms;
}

void head_gemv(const HeadGemvParams& p, LaunchStream stream) {
  DI_CHECK(head_gemv_fits(p), "head_gemv: ", p.tokens, " tokens x ", p.heads, " heads, K ", p.k, ", N ", p.n,
           ", x head stride ", p.x_head_stride, ", ", p.x_splits,
           " split partials are outside what the kernel takes (1..", kHeadGemvMaxTokens,
           " tokens, K 64/128/256/512, N a multiple of the rows a warp computes, 16-byte aligned x and w rows, one ",
           "wave of CTAs; from partials: K 512, 2..", kHeadGemvMaxSplits, " splits, N a multiple of a CTA's rows)");
  with_variant(p.k, [&](auto traits) {
    using T = decltype(traits);
    if (p.x_partials == nullptr) {
      launch<T, false>(p, stream);
    } else if constexpr (kHasPartialsVariant<T>) {
      launch<T, true>(p, stream);
    }
  });
}

}  // namespace deepinfer::cuda
