// INT4 skinny GEMM kernel: packed 4-bit weights streamed once, unpacked to bf16 in registers (int4_unpack.cuh),
// through mma.sync with the tokens as the MMA's 8-wide N side (1, 2, 4 or 8 column tiles: up to 64 tokens share each
// weight read).
//
// The layout is the FP8 skinny GEMM's (fp8_skinny_gemm.cu): the grid's CTAs are split between the problems, a CTA of 8
// warps computes `tiles` tiles of 16 weight rows, and 8 / tiles warps share a tile and split its K range. A warp walks
// its range in 128-wide steps: a lane loads 16 bytes (four packed words, 32 inputs) of weight row r and of row r + 8
// (r = lane / 4), which feed eight m16n8k16 MMAs. The MMA's K slots are a free permutation of the physical k, the same
// for weights and activations: lane q (= lane % 4) gives physical k 32q + 4j .. 32q + 4j + 3 to MMA j's slots
// {2q, 2q+1, 2q+8, 2q+9}, so a word's four unpacked pairs are two MMAs' fragments as they come, and the activations
// are four 16-byte loads (32 bf16 values of one token) a lane and step.
//
// Group scales, two ways (kScaleAfter):
//   G a multiple of 128: a step lies inside one group of each row, so its eight MMAs run on the exact integers q - z
//   into a zeroed fp32 partial sum, added to the accumulators times row r's and row r + 8's scale: the dequantized
//   product with no rounding of the weight (as the FP8 kernel applies its block scales).
//   G = 32, 64, 96, ...: a lane's 32 inputs still lie in one group (32-aligned), but the lanes of an MMA do not share
//   it, so each lane multiplies its unpacked pairs by its group's scale in registers (rounded to bf16) first.
// The scales and zero points are weights as well: loaded with the codes, before the wait on the previous kernel.
//
// FP4 weights (kE2m1: e2m1 codes in the same words, no zero points) unpack to their exact values and always take the
// second way, their groups (16 or 32 inputs, NVFP4 / MXFP4) narrower than a step: a lane's 32 inputs are two halves
// of 16, each inside one group, so it loads the scale of each half (the same one for groups of 32).
#include "backend/cuda/gemm/int4_skinny_gemm.cuh"
#include "backend/cuda/gemm/skinny_epilogue.cuh"
#include "backend/cuda/gemm/skinny_tile_layout.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/gemm/int4_unpack.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

using ptx::ld_stream_16;
using ptx::mma_bf16_16816;

constexpr int kWarps = kSkinnyWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kStepK = 128;  // K elements one warp consumes per step (eight MMAs)

struct Int4SkinnyKernelArgs {
  Int4SkinnyGemmParams p;
  int tiles[kInt4SkinnyMaxProblems] = {};
  int block_begin[kInt4SkinnyMaxProblems + 1] = {};
};

// One row's operands of a step, as loaded: four packed words, the group's scale and its zero-point word (FP4: the
// scales of the two halves, no zero points).
struct RowStep {
  uint4 words;
  float scale;
  float scale_hi;  // FP4: the scale of words 2 and 3 (scale is words 0 and 1's)
  uint32_t zero_word;
};

// The row's 32 inputs of the step as sixteen bf16x2 pairs: pairs[w][j] holds inputs 8w + 2j, 8w + 2j + 1 of the lane's
// 32, (q - z) or e2m1(q), times the scale in registers unless kScaleAfter.
template <bool kScaleAfter, bool kE2m1>
__device__ __forceinline__ void unpack_row(const RowStep& s, uint32_t zero_nibble_shift, uint32_t (&pairs)[4][4]) {
  const uint32_t z = (s.zero_word >> zero_nibble_shift) & 0xfu;
  const uint32_t zero = int4::zero_pair(z);
  const uint32_t words[4] = {s.words.x, s.words.y, s.words.z, s.words.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    int4::unpack8_codes<kE2m1>(words[w], zero, pairs[w]);
    if constexpr (!kScaleAfter) int4::scale4(pairs[w], int4::scale_pair(kE2m1 && w >= 2 ? s.scale_hi : s.scale));
  }
}

// kTokenTiles 8-token MMA column tiles; kUnroll K steps of weight loads in flight per warp (the next group loads while
// the current one multiplies). Up to two token tiles and four steps the kernel is held to 128 registers, two CTAs an
// SM; the deeper and wider variants run one CTA an SM.
template <int kTokenTiles, int kUnroll, bool kScaleAfter, bool kE2m1>
__global__ void __launch_bounds__(kThreads, (kTokenTiles <= 2 && kUnroll <= 4) ? 2 : 1)
    int4_skinny_gemm_kernel(const __grid_constant__ Int4SkinnyKernelArgs args) {
  static_assert(!(kE2m1 && kScaleAfter), "FP4 groups are narrower than a step: scales in registers");
  const Int4SkinnyGemmParams& p = args.p;
  __shared__ float partial[kWarps][kTokenTiles][32][4];
  const int block_id = static_cast<int>(blockIdx.x);
  int problem = 0;
  while (problem + 1 < p.num_problems && block_id >= args.block_begin[problem + 1]) ++problem;
  const Int4SkinnyProblem& q = p.problems[problem];
  const int block = block_id - args.block_begin[problem];
  const int tiles = args.tiles[problem];
  const bool silu_mul = q.epilogue == SkinnyEpilogue::kSiluMul;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_tile = kWarps / tiles, tile = warp / warps_per_tile, slice = warp % warps_per_tile;
  // kSiluMul pairs gate tile g with up tile g (n_out rows further): the first half of the tiles are gates.
  const int groups_per_cta = silu_mul ? tiles / 2 : tiles;
  const int64_t group_row = (static_cast<int64_t>(block) * groups_per_cta + tile % groups_per_cta) * 16;
  const int64_t row_offset = tile < groups_per_cta ? 0 : q.n_out;
  const int r = lane / 4, lane_k = lane % 4;

  const bool valid_a = group_row + r < q.n_out, valid_b = group_row + r + 8 < q.n_out;
  // Rows past the matrix load nothing (zero codes, a zero scale); row 0's addresses keep the pointers valid.
  const int64_t row_a = valid_a ? row_offset + group_row + r : 0, row_b = valid_b ? row_offset + group_row + r + 8 : 0;
  const int64_t row_words = p.k_dim / 8, k_groups = p.k_dim / q.group_size;
  const int64_t zero_words = (k_groups + 7) / 8;
  const uint32_t* w_a = q.w + row_a * row_words + lane_k * 4;
  const uint32_t* w_b = q.w + row_b * row_words + lane_k * 4;
  const float* s_a = q.scales + row_a * k_groups;
  const float* s_b = q.scales + row_b * k_groups;
  const int32_t* z_a = q.zeros == nullptr ? nullptr : q.zeros + row_a * zero_words;
  const int32_t* z_b = q.zeros == nullptr ? nullptr : q.zeros + row_b * zero_words;

  const int64_t steps = p.k_dim / kStepK;
  const int64_t step_begin = steps * slice / warps_per_tile, step_end = steps * (slice + 1) / warps_per_tile;
  // The group of the lane's 32 inputs of step s: their 32-wide chunk's index over the chunks a group holds, a shift
  // when that is a power of two (a 64-bit division a step cost more than the step's arithmetic).
  const int chunks_per_group = static_cast<int>(q.group_size / 32);
  const int group_shift = (chunks_per_group & (chunks_per_group - 1)) == 0 ? __ffs(chunks_per_group) - 1 : -1;
  const auto group_of = [&](int64_t s) {
    const int chunk = static_cast<int>(s) * (kStepK / 32) + lane_k;
    return group_shift >= 0 ? chunk >> group_shift : chunk / chunks_per_group;
  };
  // FP4: the group of the lane's first 16 inputs of step s (G a power of two; the second half's is (.. + 16) >> ..).
  const int fp4_shift = __ffs(static_cast<int>(q.group_size)) - 1;
  const auto fp4_group_of = [&](int64_t s, int half) {
    return (static_cast<int>(s) * kStepK + lane_k * 32 + 16 * half) >> fp4_shift;
  };

  // Weights are never written by a kernel: the first group goes out before the wait on the previous kernel
  // (programmatic dependent launch); x, its output, is read only after it. Steps past the warp's range load zero codes
  // and a zero scale, which add nothing. The loads in flight are a ring of kUnroll slots: slot u holds step s + u of
  // the group at s, and is refilled with step s + kUnroll + u as soon as its words are unpacked, so kUnroll loads stay
  // in flight without a second copy of the group in registers (which the 128-register variants spilled).
  RowStep a[kUnroll], b[kUnroll];
  const auto load_slot = [&](int u, int64_t s) {
    const bool in_range = s < step_end;
    a[u].words = in_range && valid_a ? ld_stream_16(w_a + s * (kStepK / 8)) : make_uint4(0u, 0u, 0u, 0u);
    b[u].words = in_range && valid_b ? ld_stream_16(w_b + s * (kStepK / 8)) : make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kE2m1) {
      const int64_t g_lo = in_range ? fp4_group_of(s, 0) : 0, g_hi = in_range ? fp4_group_of(s, 1) : 0;
      a[u].scale = in_range && valid_a ? __ldg(s_a + g_lo) : 0.0f;
      a[u].scale_hi = in_range && valid_a ? __ldg(s_a + g_hi) : 0.0f;
      b[u].scale = in_range && valid_b ? __ldg(s_b + g_lo) : 0.0f;
      b[u].scale_hi = in_range && valid_b ? __ldg(s_b + g_hi) : 0.0f;
      a[u].zero_word = b[u].zero_word = 0u;
    } else {
      const int64_t g = in_range ? group_of(s) : 0;
      a[u].scale = in_range && valid_a ? __ldg(s_a + g) : 0.0f;
      b[u].scale = in_range && valid_b ? __ldg(s_b + g) : 0.0f;
      a[u].scale_hi = b[u].scale_hi = 0.0f;
      a[u].zero_word =
          z_a != nullptr && in_range && valid_a ? static_cast<uint32_t>(__ldg(z_a + g / 8)) : 0x88888888u;
      b[u].zero_word =
          z_b != nullptr && in_range && valid_b ? static_cast<uint32_t>(__ldg(z_b + g / 8)) : 0x88888888u;
    }
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
    x_rows[t] = p.x + (valid_x[t] ? token : 0) * p.x_row_stride + lane_k * 32;
  }

  float acc[kTokenTiles][4] = {};
  float acc_odd[kScaleAfter ? 1 : kTokenTiles][4] = {};  // the odd MMAs' chain (scales in registers)
  for (int64_t s = step_begin; s < step_end; s += kUnroll) {
    const bool refill = s + kUnroll < step_end;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = (s + u) * kStepK;
      const bool in_range = s + u < step_end;
      const uint32_t shift = kE2m1 ? 0u : static_cast<uint32_t>(4 * ((in_range ? group_of(s + u) : 0) % 8));
      uint32_t pa[4][4], pb[4][4];
      unpack_row<kScaleAfter, kE2m1>(a[u], shift, pa);
      unpack_row<kScaleAfter, kE2m1>(b[u], shift, pb);
      const float scale_a = a[u].scale, scale_b = b[u].scale;  // kScaleAfter: applied after the MMAs
      if (refill) load_slot(u, s + kUnroll + u);
#pragma unroll
      for (int t = 0; t < kTokenTiles; ++t) {
        uint32_t xw[16];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const uint4 x4 = skinny::load_x(x_rows[t] + k + 8 * v, in_range && valid_x[t]);
          xw[4 * v] = x4.x;
          xw[4 * v + 1] = x4.y;
          xw[4 * v + 2] = x4.z;
          xw[4 * v + 3] = x4.w;
        }
        // MMA j = 2w + h takes word w's pairs 2h (slots 2q, 2q+1) and 2h + 1 (slots 2q+8, 2q+9): inputs 4j .. 4j + 3.
        // Independent accumulators (four here, two across steps below) keep several MMAs in flight: one chain of
        // eight dependent MMAs a step left the kernel waiting on their latency.
        if constexpr (kScaleAfter) {
          float step_acc[4][4] = {};
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int w = j / 2, h = j % 2;
            mma_bf16_16816(step_acc[j % 4], pa[w][2 * h], pb[w][2 * h], pa[w][2 * h + 1], pb[w][2 * h + 1],
                           xw[2 * j], xw[2 * j + 1]);
          }
          // Accumulator registers 0, 1 are row r, registers 2, 3 row r + 8.
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float sum = (step_acc[0][i] + step_acc[1][i]) + (step_acc[2][i] + step_acc[3][i]);
            acc[t][i] = fmaf(sum, i < 2 ? scale_a : scale_b, acc[t][i]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int w = j / 2, h = j % 2;
            mma_bf16_16816(j % 2 == 0 ? acc[t] : acc_odd[t], pa[w][2 * h], pb[w][2 * h], pa[w][2 * h + 1],
                           pb[w][2 * h + 1], xw[2 * j], xw[2 * j + 1]);
          }
        }
      }
    }
  }
  if constexpr (!kScaleAfter) {
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] += acc_odd[t][i];
    }
  }

  skinny::write_outputs<kWarps, kTokenTiles>(partial, acc, q, p.tokens, block, groups_per_cta, warps_per_tile);
}

struct TileLayout {
  Int4SkinnyKernelArgs args;
  int64_t blocks = 0;
};

TileLayout tile_layout(const Int4SkinnyGemmParams& p) {
  TileLayout layout{.args = {.p = p}};
  layout.blocks =
      lay_out_skinny_tiles(p, p.k_dim / kStepK, layout.args.tiles, layout.args.block_begin, "int4_skinny_gemm");
  return layout;
}

int unroll_for(const TileLayout& layout, int tiles) {
  return skinny::loads_in_flight(layout.blocks, layout.args.p.num_sms, tiles);
}

template <int kTokenTiles, int kUnroll, bool kScaleAfter, bool kE2m1>
void launch(const TileLayout& layout, LaunchStream stream) {
  launch_pdl(int4_skinny_gemm_kernel<kTokenTiles, kUnroll, kScaleAfter, kE2m1>,
             {.grid = dim3(static_cast<unsigned>(layout.blocks)), .block = dim3(kThreads)}, stream, layout.args);
}

template <int kTokenTiles, bool kScaleAfter, bool kE2m1>
void launch_tiles(const TileLayout& layout, LaunchStream stream) {
  if constexpr (kTokenTiles > 2) {
    launch<kTokenTiles, 2, kScaleAfter, kE2m1>(layout, stream);
  } else if (unroll_for(layout, kTokenTiles) == 8) {
    launch<kTokenTiles, 8, kScaleAfter, kE2m1>(layout, stream);
  } else {
    launch<kTokenTiles, 4, kScaleAfter, kE2m1>(layout, stream);
  }
}

template <bool kScaleAfter, bool kE2m1 = false>
void launch_scaled(const TileLayout& layout, int64_t tokens, LaunchStream stream) {
  switch (skinny::token_tiles(tokens)) {
    case 1: launch_tiles<1, kScaleAfter, kE2m1>(layout, stream); break;
    case 2: launch_tiles<2, kScaleAfter, kE2m1>(layout, stream); break;
    case 4: launch_tiles<4, kScaleAfter, kE2m1>(layout, stream); break;
    default: launch_tiles<8, kScaleAfter, kE2m1>(layout, stream); break;
  }
}

// FP4 groups: a power of two of at least 16 inputs (a half of a lane's 32 lies in one group).
bool fp4_group_fits(int64_t group_size) { return group_size >= 16 && (group_size & (group_size - 1)) == 0; }

}  // namespace

bool int4_skinny_gemm_fits(const Int4SkinnyGemmParams& p) {
  if (p.tokens < 1 || p.tokens > kInt4SkinnyMaxTokens || p.k_dim <= 0 || p.k_dim % kStepK != 0 ||
      !skinny::aligned(p.x, 16) || p.x_row_stride % 8 != 0 || p.num_problems < 1 ||
      p.num_problems > kInt4SkinnyMaxProblems) {
    return false;
  }
  for (int i = 0; i < p.num_problems; ++i) {
    const Int4SkinnyProblem& q = p.problems[i];
    const bool group_ok = p.e2m1 ? fp4_group_fits(q.group_size) && q.zeros == nullptr
                                 : q.group_size > 0 && q.group_size % 32 == 0;
    if (q.n_out < 1 || !skinny::aligned(q.w, 16) || q.scales == nullptr || !skinny::aligned(q.scales, 4) ||
        (q.zeros != nullptr && !skinny::aligned(q.zeros, 4)) || !group_ok || p.k_dim % q.group_size != 0) {
      return false;
    }
  }
  return true;
}

void int4_skinny_gemm(const Int4SkinnyGemmParams& p, LaunchStream stream) {
  DI_CHECK(int4_skinny_gemm_fits(p), "int4_skinny_gemm: ", p.tokens, " tokens, K ", p.k_dim, ", ", p.num_problems,
           " problems: needs 1..", kInt4SkinnyMaxTokens, " tokens, K a multiple of ", kStepK,
           ", groups dividing K (INT4: a multiple of 32 inputs; FP4: a power of two >= 16, no zero points), 1..",
           kInt4SkinnyMaxProblems, " problems and 16-byte aligned rows");
  const TileLayout layout = tile_layout(p);
  if (p.e2m1) {
    launch_scaled<false, true>(layout, p.tokens, stream);
    return;
  }
  bool scale_after = true;
  for (int i = 0; i < p.num_problems; ++i) scale_after = scale_after && p.problems[i].group_size % kStepK == 0;
  if (scale_after) {
    launch_scaled<true>(layout, p.tokens, stream);
  } else {
    launch_scaled<false>(layout, p.tokens, stream);
  }
}

}  // namespace deepinfer::cuda
