// FP8 skinny GEMM kernel: block-scaled e4m3 weights streamed once, widened to fp16 in registers, through mma.sync
// with the tokens as the MMA's 8-wide N side (1, 2, 4 or 8 column tiles: up to 64 tokens share each weight read).
//
// The layout follows the bf16 skinny GEMM (skinny_gemm.cu): the grid's CTAs are split between the problems, a CTA of
// 8 warps computes `tiles` tiles of 16 weight rows, and 8 / tiles warps share a tile and split its K range. A warp
// walks its range in 64-wide steps: a lane loads 16 contiguous codes (one 16-byte vector) of weight row r and of row
// r + 8 (r = lane / 4), which feed four m16n8k16 MMAs. As in the bf16 kernel the MMA's K slots are a free
// permutation of the physical k: lane q (= lane % 4) gives physical k 16q + 4j .. 16q + 4j + 3 to MMA j's slots
// {2q, 2q+1, 2q+8, 2q+9}, for the weights and the activations alike, so every weight load is one vector and every
// activation load two (16 fp16 values of one token).
//
// Block scales: a 64-wide step lies inside one 128-wide K block, so each step's four MMAs start from zero and their
// sum is added to the accumulators times the step's scale (row r's and row r + 8's: a 16-row tile may straddle a
// 128-row block edge only in a gated projection whose halves are not multiples of 16 rows, and one scale per
// accumulator row keeps that right too). The scales are weights as well: loaded with the codes, before the wait.
//
// Why fp16: e4m3 -> fp16 is one exact instruction for two codes (every e4m3 value is an fp16 value), where e4m3 ->
// bf16 takes about five (bit shuffles and a rebias multiply); with half the instructions between its loads the kernel
// is faster at 64 tokens and even at fewer (at those it waits on its loads, not on its instructions: benchmarks/
// results/fp8_h200.md). The activations come rescaled into fp16 by a power of two per token (fp8_convert.cuh), which keeps
// every bf16 value the products can notice exact; the accumulators are multiplied back before the epilogue, so the
// result is the W8A16 product of the bf16 activations.
#include "backend/cuda/gemm/fp8_skinny_gemm.cuh"
#include "backend/cuda/gemm/fp8_convert.cuh"
#include "backend/cuda/gemm/skinny_epilogue.cuh"
#include "backend/cuda/gemm/skinny_tile_layout.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

using ptx::e4m3x4_to_f16x4;
using ptx::ld_stream_16_if;
using ptx::mma_f16_16816;

constexpr int kWarps = kSkinnyWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kStepK = 64;  // K elements one warp consumes per step (four MMAs)
constexpr int kScaleBlock = 128;

struct Fp8SkinnyKernelArgs {
  Fp8SkinnyGemmParams p;
  int tiles[kFp8SkinnyMaxProblems] = {};
  int block_begin[kFp8SkinnyMaxProblems + 1] = {};
};

// kTokenTiles 8-token MMA column tiles; kUnroll K steps of weight loads in flight per warp (the next group loads
// while the current one multiplies). Up to two token tiles and four steps the kernel is held to 128 registers, two
// CTAs an SM; the deeper and wider variants run one CTA an SM.
template <int kTokenTiles, int kUnroll>
__global__ void __launch_bounds__(kThreads, (kTokenTiles <= 2 && kUnroll <= 4) ? 2 : 1)
    fp8_skinny_gemm_kernel(const __grid_constant__ Fp8SkinnyKernelArgs args) {
  static_assert(kUnroll % 2 == 0, "x's two slots alternate within a group");
  const Fp8SkinnyGemmParams& p = args.p;
  __shared__ float partial[kWarps][kTokenTiles][32][4];
  const int block_id = static_cast<int>(blockIdx.x);
  int problem = 0;
  while (problem + 1 < p.num_problems && block_id >= args.block_begin[problem + 1]) ++problem;
  const Fp8SkinnyProblem& q = p.problems[problem];
  const int block = block_id - args.block_begin[problem];
  const int tiles = args.tiles[problem];
  const bool silu_mul = q.epilogue == SkinnyEpilogue::kSiluMul;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_tile = kWarps / tiles, tile = warp / warps_per_tile, slice = warp % warps_per_tile;
  // kSiluMul pairs gate tile g with up tile g (n_out rows further): the first half of the tiles are gates.
  const int groups = silu_mul ? tiles / 2 : tiles;
  const int64_t group_row = (static_cast<int64_t>(block) * groups + tile % groups) * 16;  // output column
  const int64_t row_offset = tile < groups ? 0 : q.n_out;
  const int r = lane / 4, lane_k = lane % 4;

  const bool valid_a = group_row + r < q.n_out, valid_b = group_row + r + 8 < q.n_out;
  const int64_t row_a = row_offset + group_row + r, row_b = row_a + 8;
  const int64_t k_blocks = p.k_dim / kScaleBlock;
  const uint8_t* w_a = q.w + row_a * p.k_dim + lane_k * 16;
  const uint8_t* w_b = w_a + 8 * p.k_dim;
  // Rows past the matrix read no scale that matters (their codes load as zeros); row 0's keeps the address valid.
  const float* s_a = q.scale_inv + (valid_a ? row_a / kScaleBlock : 0) * k_blocks;
  const float* s_b = q.scale_inv + (valid_b ? row_b / kScaleBlock : 0) * k_blocks;

  const int steps = static_cast<int>(p.k_dim / kStepK);
  const int step_begin = steps * slice / warps_per_tile, step_end = steps * (slice + 1) / warps_per_tile;

  // Weights and scales are never written by a kernel: the first group goes out before the wait on the previous
  // kernel (programmatic dependent launch); x, its output, is read only after it. Steps past the warp's range load
  // zero codes and a zero scale, which add nothing.
  // The loads in flight are a ring of kUnroll slots: slot u holds step s + u of the group at s, and is refilled with
  // step s + kUnroll + u as soon as its codes are widened, so kUnroll loads stay in flight without a second copy of
  // the group in registers. Loads go out in step order, so one pointer a row walks the codes.
  uint4 wa[kUnroll], wb[kUnroll];
  float sa[kUnroll], sb[kUnroll];
  const uint8_t* next_a = w_a + static_cast<int64_t>(step_begin) * kStepK;
  const uint8_t* next_b = w_b + static_cast<int64_t>(step_begin) * kStepK;
  const auto load_slot = [&](int u, int step) {
    const bool in_range = step < step_end;
    wa[u] = ld_stream_16_if(next_a, in_range && valid_a);
    wb[u] = ld_stream_16_if(next_b, in_range && valid_b);
    next_a += kStepK, next_b += kStepK;
    sa[u] = in_range ? __ldg(s_a + step / 2) : 0.0f;  // two 64-wide steps a 128-wide scale block
    sb[u] = in_range ? __ldg(s_b + step / 2) : 0.0f;
  };
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) load_slot(u, step_begin + u);
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  const uint16_t* x_rows[kTokenTiles];
  bool valid_x[kTokenTiles];
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t) {
    const int64_t token = r + 8 * t;  // lane group r carries token r of each column tile
    valid_x[t] = token < p.tokens;
    x_rows[t] = p.x_f16 + (valid_x[t] ? token : 0) * p.k_dim + lane_k * 16 + static_cast<int64_t>(step_begin) * kStepK;
  }

  // One token tile (up to 8 tokens) loads x a step ahead of its MMAs (slot u % 2), so the L1/L2 latency of those
  // loads is off each step's chain: with it, the weights' slots are consumed and refilled sooner, which is what the
  // kernel's speed rests on. Wider tiles load x in the step (the registers for a second copy would spill).
  constexpr bool kXAhead = kTokenTiles == 1;
  uint4 xs[kXAhead ? 2 : 1][kTokenTiles][2];
  const auto load_x_step = [&](uint4 (&dst)[kTokenTiles][2], int step, int offset) {
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t) {
      const bool valid = step < step_end && valid_x[t];
      dst[t][0] = skinny::load_x(x_rows[t] + offset, valid);
      dst[t][1] = skinny::load_x(x_rows[t] + offset + 8, valid);
    }
  };
  if constexpr (kXAhead) load_x_step(xs[0], step_begin, 0);

  float acc[kTokenTiles][4] = {};
  for (int s = step_begin; s < step_end; s += kUnroll) {
    const bool refill = s + kUnroll < step_end;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (kXAhead) {
        load_x_step(xs[(u + 1) % 2], s + u + 1, (u + 1) * kStepK);  // the last u: step 0 of the next group
      }
      const uint32_t codes_a[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w};
      const uint32_t codes_b[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
      const float scale_a = sa[u], scale_b = sb[u];
      uint32_t lo_a[4], hi_a[4], lo_b[4], hi_b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        e4m3x4_to_f16x4(codes_a[j], lo_a[j], hi_a[j]);
        e4m3x4_to_f16x4(codes_b[j], lo_b[j], hi_b[j]);
      }
      if (refill) load_slot(u, s + kUnroll + u);
      if constexpr (!kXAhead) load_x_step(xs[0], s + u, u * kStepK);
#pragma unroll
      for (int t = 0; t < kTokenTiles; ++t) {
        const uint4(&xv)[2] = xs[kXAhead ? u % 2 : 0][t];
        const uint4 x0 = xv[0], x1 = xv[1];
        const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float step_acc[4] = {};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          mma_f16_16816(step_acc, lo_a[j], lo_b[j], hi_a[j], hi_b[j], xw[2 * j], xw[2 * j + 1]);
        }
        // Accumulator registers 0, 1 are row r, registers 2, 3 row r + 8.
        acc[t][0] = fmaf(step_acc[0], scale_a, acc[t][0]);
        acc[t][1] = fmaf(step_acc[1], scale_a, acc[t][1]);
        acc[t][2] = fmaf(step_acc[2], scale_b, acc[t][2]);
        acc[t][3] = fmaf(step_acc[3], scale_b, acc[t][3]);
      }
    }
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t) x_rows[t] += kUnroll * kStepK;
  }

  // Back to x's scale: accumulator registers 0, 2 are token 2q of the column tile, registers 1, 3 token 2q + 1.
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t) {
    const int64_t token = 8 * t + 2 * lane_k;
    const float unscale_even = token < p.tokens ? p.x_unscale[token] : 0.0f;
    const float unscale_odd = token + 1 < p.tokens ? p.x_unscale[token + 1] : 0.0f;
    acc[t][0] *= unscale_even, acc[t][2] *= unscale_even;
    acc[t][1] *= unscale_odd, acc[t][3] *= unscale_odd;
  }
  skinny::write_outputs<kWarps, kTokenTiles>(partial, acc, q, p.tokens, block, groups, warps_per_tile);
}

struct TileLayout {
  Fp8SkinnyKernelArgs args;
  int64_t blocks = 0;
};

TileLayout tile_layout(const Fp8SkinnyGemmParams& p) {
  TileLayout layout{.args = {.p = p}};
  layout.blocks =
      lay_out_skinny_tiles(p, p.k_dim / kStepK, layout.args.tiles, layout.args.block_begin, "fp8_skinny_gemm");
  return layout;
}

int unroll_for(const TileLayout& layout, int tiles) {
  return skinny::loads_in_flight(layout.blocks, layout.args.p.num_sms, tiles);
}

template <int kTokenTiles, int kUnroll>
void launch(const TileLayout& layout, LaunchStream stream) {
  launch_pdl(fp8_skinny_gemm_kernel<kTokenTiles, kUnroll>,
             {.grid = dim3(static_cast<unsigned>(layout.blocks)), .block = dim3(kThreads)}, stream, layout.args);
}

template <int kTokenTiles>
void launch_tiles(const TileLayout& layout, LaunchStream stream) {
  if constexpr (kTokenTiles > 2) {
    launch<kTokenTiles, 2>(layout, stream);
  } else if (unroll_for(layout, kTokenTiles) == 8) {
    launch<kTokenTiles, 8>(layout, stream);
  } else {
    launch<kTokenTiles, 4>(layout, stream);
  }
}

}  // namespace

bool fp8_skinny_gemm_fits(const Fp8SkinnyGemmParams& p) {
  if (p.tokens < 1 || p.tokens > kFp8SkinnyMaxTokens || p.k_dim <= 0 || p.k_dim % kScaleBlock != 0 ||
      !skinny::aligned(p.x, 16) || p.x_row_stride % 8 != 0 || p.num_problems < 1 ||
      p.num_problems > kFp8SkinnyMaxProblems) {
    return false;
  }
  for (int i = 0; i < p.num_problems; ++i) {
    const Fp8SkinnyProblem& q = p.problems[i];
    if (q.n_out < 1 || !skinny::aligned(q.w, 16) || q.scale_inv == nullptr || !skinny::aligned(q.scale_inv, 4)) {
      return false;
    }
  }
  return true;
}

int fp8_skinny_gemm_loads_in_flight(const Fp8SkinnyGemmParams& p) {
  DI_CHECK(fp8_skinny_gemm_fits(p), "fp8_skinny_gemm_loads_in_flight: the kernel does not take these operands");
  return unroll_for(tile_layout(p), skinny::token_tiles(p.tokens));
}

void fp8_skinny_gemm(const Fp8SkinnyGemmParams& p, LaunchStream stream) {
  DI_CHECK(fp8_skinny_gemm_fits(p), "fp8_skinny_gemm: ", p.tokens, " tokens, K ", p.k_dim, ", ", p.num_problems,
           " problems: needs 1..", kFp8SkinnyMaxTokens, " tokens, K a multiple of ", kScaleBlock, ", 1..",
           kFp8SkinnyMaxProblems, " problems and 16-byte aligned rows");
  DI_CHECK(p.x_f16 != nullptr && skinny::aligned(p.x_f16, 16) && p.x_unscale != nullptr,
           "fp8_skinny_gemm: needs 16-byte aligned buffers for the rescaled activations");
  rescale_activations_to_f16(p.x, p.tokens, p.k_dim, p.x_row_stride, p.x_f16, p.x_unscale, stream);
  const TileLayout layout = tile_layout(p);
  switch (skinny::token_tiles(p.tokens)) {
    case 1: launch_tiles<1>(layout, stream); break;
    case 2: launch_tiles<2>(layout, stream); break;
    case 4: launch_tiles<4>(layout, stream); break;
    default: launch_tiles<8>(layout, stream); break;
  }
}

}  // namespace deepinfer::cuda
