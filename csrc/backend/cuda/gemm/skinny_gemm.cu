// Skinny GEMM kernel: weights streamed once through mma.sync, tokens as the MMA's 8-wide N side.
//
// The grid's CTAs are split between the problems (consecutive block ranges). A CTA has 8 warps and computes `tiles`
// tiles of 16 weight rows of its problem (1, 2, 4 or 8; 8 / tiles warps share a tile and split its K range). Each
// warp walks its K range in 32-wide steps; a lane loads 16 contiguous bytes of weight row r and of row r + 8
// (r = lane / 4) and 16 bytes of x for token lane / 4, which feed two m16n8k16 MMAs. An MMA's K order is fixed by the
// fragment layout, but a dot product does not care in which order its terms come: lane q (= lane % 4) gives physical
// k 8q..8q+3 to the first MMA's k slots {2q, 2q+1, 2q+8, 2q+9} and 8q+4..8q+7 to the second's, so A and B agree and
// every load is one 16-byte vector. Loads go out four steps at a time, the next four while the current four
// multiply, so a CTA has up to 64 KB of weights in flight. When no warp has more than eight steps (K = 2048 at 8
// warps a tile: q_proj with kv_a, o_proj), a warp loads its whole range at once, before the wait on the previous
// kernel: the weights are then in registers when x arrives, and no load round is left after the wait. The warps of
// a tile add their fp32 partial tiles through shared memory in a fixed order (deterministic) and the epilogue writes
// the tokens that exist.
//
// Split K: a grid that fills few SMs (the router: 64 rows) would leave each warp a long chain of dependent load
// rounds. The launch then makes each block of tiles a thread-block cluster of 2, 4 or 8 CTAs (consecutive
// blockIdx.x) that take consecutive slices of K with the same tile layout; after a cluster barrier, rank 0 adds the
// ranks' partial tiles through distributed shared memory in rank order (the same bits every run) and runs the
// epilogue once.
#include "backend/cuda/gemm/skinny_gemm.cuh"
#include "backend/cuda/gemm/skinny_tile_layout.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

namespace cg = cooperative_groups;

using ptx::ld_stream_16;
using ptx::mma_bf16_16816;
using ptx::silu;

constexpr int kWarps = kSkinnyWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kStepK = 32;    // K elements one warp consumes per step (two MMAs)
constexpr int kPipelinedUnroll = 4;   // steps whose loads are in flight together (a group multiplies, the next loads)
constexpr int kWholeRangeUnroll = 8;  // a warp's whole K range, when it has at most this many steps
constexpr int kMinStepsPerWarp = kSkinnyMinStepsPerWarp;

// The kernel's argument: the operands, and per problem the 16-row tiles a CTA computes and its first block of tiles
// (with a split, the index of its first cluster).
struct SkinnyKernelArgs {
  SkinnyGemmParams p;
  int tiles[kSkinnyMaxProblems] = {};
  int block_begin[kSkinnyMaxProblems + 1] = {};
};

__device__ __forceinline__ uint4 load_or_zero(const uint16_t* ptr, bool valid) {
  return valid ? ld_stream_16(ptr) : make_uint4(0u, 0u, 0u, 0u);
}

// x is small and read by every CTA: a plain read-only load keeps it in L1/L2.
__device__ __forceinline__ uint4 load_x(const uint16_t* ptr, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint4*>(ptr)) : make_uint4(0u, 0u, 0u, 0u);
}

// One 32-wide K step: weight rows r and r + 8 (wa, wb) against the 8 tokens' x (xv), two MMAs.
__device__ __forceinline__ void mma_step(float (&acc)[4], const uint4& wa, const uint4& wb, const uint4& xv) {
  mma_bf16_16816(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
  mma_bf16_16816(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
}

__device__ __forceinline__ float load_out(const SkinnyProblem& q, int64_t i) {
  return q.out_f32 ? static_cast<const float*>(q.out)[i]
                   : __bfloat162float(static_cast<const __nv_bfloat16*>(q.out)[i]);
}

__device__ __forceinline__ void store_out(const SkinnyProblem& q, int64_t i, float v) {
  if (q.out_f32) {
    static_cast<float*>(q.out)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(q.out)[i] = __float2bfloat16_rn(v);
  }
}

// Grid: the problems' block ranges, one after the other, kSplit CTAs per block (a cluster; 1: no cluster). The tokens
// are one 8-column MMA tile. A warp keeps kUnroll K steps of loads in flight; the whole-range kernel is held to 128
// registers, two CTAs an SM, so q_proj with kv_a (228 CTAs) runs in one wave.
template <int kSplit, int kUnroll>
__global__ void __launch_bounds__(kThreads, kUnroll == kWholeRangeUnroll ? 2 : 1)
    skinny_gemm_kernel(const __grid_constant__ SkinnyKernelArgs args) {
  static_assert(kSplit == 1 || kSplit == 2 || kSplit == 4 || kSplit == 8, "a portable cluster size");
  static_assert(kUnroll == kPipelinedUnroll || kUnroll == kWholeRangeUnroll, "one of the two depths");
  const SkinnyGemmParams& p = args.p;
  __shared__ float partial[kWarps][32][4];
  // A cluster is kSplit consecutive CTAs along x, so a CTA's rank in it is blockIdx.x % kSplit (its block_rank()).
  const int tile_block = static_cast<int>(blockIdx.x) / kSplit, rank = static_cast<int>(blockIdx.x) % kSplit;
  int problem = 0;
  while (problem + 1 < p.num_problems && tile_block >= args.block_begin[problem + 1]) ++problem;
  const SkinnyProblem& q = p.problems[problem];
  const int block = tile_block - args.block_begin[problem];
  const int tiles = args.tiles[problem];
  const bool silu_mul = q.epilogue == SkinnyEpilogue::kSiluMul;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_tile = kWarps / tiles, tile = warp / warps_per_tile, slice = warp % warps_per_tile;
  // kSiluMul pairs gate tile g with up tile g (n_out rows further): the first half of the tiles are gates.
  const int groups = silu_mul ? tiles / 2 : tiles;
  const int64_t group_row = (static_cast<int64_t>(block) * groups + tile % groups) * 16;  // output column
  const int64_t row_offset = tile < groups ? 0 : q.n_out;
  const int r = lane / 4, lane_k = lane % 4;

  const uint16_t* w_row = q.w + (row_offset + group_row + r) * p.k_dim + lane_k * 8;
  const bool valid_a = group_row + r < q.n_out, valid_b = group_row + r + 8 < q.n_out;
  const bool valid_x = r < p.tokens;  // lane group r carries token r
  const uint16_t* x_row = p.x + (valid_x ? r : 0) * p.x_row_stride + lane_k * 8;
  const int64_t row_b_offset = 8 * p.k_dim;

  // The CTA's K slice (all of K without a split), then the warp's part of it.
  const int64_t steps = p.k_dim / kStepK;
  const int64_t rank_begin = steps * rank / kSplit, rank_steps = steps * (rank + 1) / kSplit - rank_begin;
  const int64_t step_begin = rank_begin + rank_steps * slice / warps_per_tile;
  const int64_t step_end = rank_begin + rank_steps * (slice + 1) / warps_per_tile;

  // Weights are never written by a kernel, so the first group of weight loads goes out before the wait on the
  // previous kernel (programmatic dependent launch); x, its output, is read only after it. Later groups are
  // software-pipelined: the next group's weights are in flight while the current group multiplies. Steps past the
  // warp's range load zeros, which add nothing.
  uint4 wa[kUnroll], wb[kUnroll];
  const auto load_weights = [&](int64_t first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool in_range = first + u < step_end;
      const int64_t k = (first + u) * kStepK;
      wa[u] = load_or_zero(w_row + k, in_range && valid_a);
      wb[u] = load_or_zero(w_row + row_b_offset + k, in_range && valid_b);
    }
  };
  load_weights(step_begin);
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  float acc[4] = {};
  if constexpr (kUnroll == kWholeRangeUnroll) {
    // Every weight is in flight already: x, then the MMAs, with no copies for a next group.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4 xv = load_x(x_row + (step_begin + u) * kStepK, step_begin + u < step_end && valid_x);
      mma_step(acc, wa[u], wb[u], xv);
    }
  } else {
    for (int64_t s = step_begin; s < step_end; s += kUnroll) {
      uint4 xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) xv[u] = load_x(x_row + (s + u) * kStepK, s + u < step_end && valid_x);
      uint4 cur_a[kUnroll], cur_b[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        cur_a[u] = wa[u];
        cur_b[u] = wb[u];
      }
      if (s + kUnroll < step_end) load_weights(s + kUnroll);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mma_step(acc, cur_a[u], cur_b[u], xv[u]);
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
  if constexpr (kSplit == 1) {
    __syncthreads();
  } else {
    cg::this_cluster().sync();  // also a CTA barrier; every rank's partials are written and visible to rank 0
  }

  // Output element (group, fragment lane, register): register i of lane l holds row l / 4 + 8 * (i / 2) and token
  // 2 * (l % 4) + i % 2 of the tile's 16 x 8 accumulator. With a split, rank 0 writes the cluster's outputs.
  const int outputs = rank == 0 ? groups * 128 : 0;
  for (int idx = threadIdx.x; idx < outputs; idx += kThreads) {
    const int group = idx / 128, l = (idx / 4) % 32, i = idx % 4;
    const int row = l / 4 + 8 * (i / 2), token = 2 * (l % 4) + i % 2;
    const int64_t col = (static_cast<int64_t>(block) * groups + group) * 16 + row;
    if (token >= p.tokens || col >= q.n_out) continue;
    // The same order every run: ranks (K slices) in order, and within a rank the tile's warps in order.
    const auto tile_sum = [&](int t) {
      float sum = 0.0f;
#pragma unroll
      for (int k_rank = 0; k_rank < kSplit; ++k_rank) {
        float(*part)[32][4] = partial;
        if constexpr (kSplit > 1) {
          if (k_rank > 0) part = cg::this_cluster().map_shared_rank(partial, k_rank);
        }
        for (int w = 0; w < warps_per_tile; ++w) sum += part[t * warps_per_tile + w][l][i];
      }
      return sum;
    };
    const int64_t o = token * q.out_row_stride + col;
    switch (q.epilogue) {
      case SkinnyEpilogue::kSiluMul: store_out(q, o, silu(tile_sum(group)) * tile_sum(group + groups)); break;
      case SkinnyEpilogue::kAccumulate: store_out(q, o, load_out(q, o) + tile_sum(group)); break;
      case SkinnyEpilogue::kStore: store_out(q, o, tile_sum(group)); break;
    }
  }
  if constexpr (kSplit > 1) cg::this_cluster().sync();  // no CTA exits while rank 0 may still read its partials
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The launch's layout without a split: per problem the tiles a CTA computes and its first block; `blocks` in all.
struct TileLayout {
  SkinnyKernelArgs args;
  int64_t blocks = 0;
};

TileLayout tile_layout(const SkinnyGemmParams& p) {
  TileLayout layout{.args = {.p = p}};
  layout.blocks = lay_out_skinny_tiles(p, p.k_dim / kStepK, layout.args.tiles, layout.args.block_begin, "skinny_gemm");
  return layout;
}

// CTAs per cluster that split each block's K range. Only a grid that fills less than half the SMs is split (a full
// one already has enough loads in flight, and the cluster barriers would cost it time), into the most slices (8, 4
// or 2) that leave every warp at least kMinStepsPerWarp steps with the unsplit tile layout and keep the grid within
// two waves.
int split_ways(const TileLayout& layout) {
  const SkinnyGemmParams& p = layout.args.p;
  const int64_t ctas = layout.blocks, max_ctas = 2 * int64_t{p.num_sms};
  if (2 * ctas >= p.num_sms) return 1;
  const int64_t steps = p.k_dim / kStepK;
  for (const int ways : {8, 4, 2}) {
    bool enough_steps = true;
    for (int i = 0; i < p.num_problems; ++i) {
      const int warps_per_tile = kWarps / layout.args.tiles[i];
      enough_steps = enough_steps && steps / ways >= int64_t{kMinStepsPerWarp} * warps_per_tile;
    }
    if (enough_steps && ctas * ways <= max_ctas) return ways;
  }
  return 1;
}

// Steps of 32 in the longest warp range of a launch split `ways` ways.
int64_t max_steps_per_warp(const TileLayout& layout, int ways) {
  const SkinnyGemmParams& p = layout.args.p;
  const int64_t rank_steps = (p.k_dim / kStepK + ways - 1) / ways;
  int64_t most = 0;
  for (int i = 0; i < p.num_problems; ++i) {
    const int64_t warps_per_tile = kWarps / layout.args.tiles[i];
    most = std::max(most, (rank_steps + warps_per_tile - 1) / warps_per_tile);
  }
  return most;
}

// Whole range (every load before the wait) where that takes more than one pipelined group and fits the registers
// of kWholeRangeUnroll steps.
int unroll_for(const TileLayout& layout, int ways) {
  const int64_t steps = max_steps_per_warp(layout, ways);
  return steps > kPipelinedUnroll && steps <= kWholeRangeUnroll ? kWholeRangeUnroll : kPipelinedUnroll;
}

template <int kSplit, int kUnroll>
void launch(const TileLayout& layout, LaunchStream stream) {
  const dim3 grid(static_cast<unsigned>(layout.blocks * kSplit));
  launch_pdl(skinny_gemm_kernel<kSplit, kUnroll>, {.grid = grid, .block = dim3(kThreads), .cluster_ctas = kSplit},
             stream, layout.args);
}

template <int kSplit>
void launch(const TileLayout& layout, LaunchStream stream) {
  if (unroll_for(layout, kSplit) == kWholeRangeUnroll) {
    launch<kSplit, kWholeRangeUnroll>(layout, stream);
  } else {
    launch<kSplit, kPipelinedUnroll>(layout, stream);
  }
}

}  // namespace

bool skinny_gemm_fits(const SkinnyGemmParams& p) {
  if (p.tokens < 1 || p.tokens > kSkinnyMaxTokens || p.k_dim <= 0 || p.k_dim % kStepK != 0 || !aligned16(p.x) ||
      p.x_row_stride % 8 != 0 || p.num_problems < 1 || p.num_problems > kSkinnyMaxProblems) {
    return false;
  }
  for (int i = 0; i < p.num_problems; ++i) {
    if (p.problems[i].n_out < 1 || !aligned16(p.problems[i].w)) return false;
  }
  return true;
}

int skinny_gemm_split(const SkinnyGemmParams& p) {
  DI_CHECK(skinny_gemm_fits(p), "skinny_gemm_split: the kernel does not take these operands");
  return split_ways(tile_layout(p));
}

int skinny_gemm_loads_in_flight(const SkinnyGemmParams& p) {
  DI_CHECK(skinny_gemm_fits(p), "skinny_gemm_loads_in_flight: the kernel does not take these operands");
  const TileLayout layout = tile_layout(p);
  return unroll_for(layout, split_ways(layout));
}

void skinny_gemm(const SkinnyGemmParams& p, LaunchStream stream) {
  DI_CHECK(skinny_gemm_fits(p), "skinny_gemm: ", p.tokens, " tokens, K ", p.k_dim, ", ", p.num_problems,
           " problems: needs 1..", kSkinnyMaxTokens, " tokens, K a multiple of ", kStepK, ", 1..",
           kSkinnyMaxProblems, " problems and 16-byte aligned rows (use cuBLAS)");
  static_assert(kSkinnyMaxTokens == 8, "one 8-token MMA column tile");
  const TileLayout layout = tile_layout(p);
  switch (split_ways(layout)) {
    case 8: launch<8>(layout, stream); break;
    case 4: launch<4>(layout, stream); break;
    case 2: launch<2>(layout, stream); break;
    default: launch<1>(layout, stream); break;
  }
}

}  // namespace deepinfer::cuda
