// How the skinny GEMM kernels (bf16 weights: skinny_gemm.cu; FP8 weights: fp8_skinny_gemm.cu) spread their output
// over CTAs: a CTA of kSkinnyWarps warps computes `tiles` tiles of 16 weight rows of one problem (1, 2, 4 or 8; the
// 8 / tiles warps of a tile split its K range), and the problems' blocks of tiles follow each other in the grid.
// Host code; both kernels read the result from their launch arguments.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/gemm/skinny_gemm_params.h"
#include "core/error.h"

namespace deepinfer::cuda {

inline constexpr int kSkinnyWarps = 8;
inline constexpr int kSkinnyMinStepsPerWarp = 4;  // K steps a warp needs to keep loads in flight

// Enough K steps per warp (k_steps: K over the kernel's step): short K gives each tile fewer warps and the CTA more
// tiles; a gated projection keeps at least one gate and one up tile a CTA.
inline int skinny_tiles_per_cta(int64_t k_steps, SkinnyEpilogue epilogue) {
  int warps_per_tile = kSkinnyWarps;
  while (warps_per_tile > 1 && k_steps < int64_t{kSkinnyMinStepsPerWarp} * warps_per_tile) warps_per_tile /= 2;
  if (epilogue == SkinnyEpilogue::kSiluMul && warps_per_tile == kSkinnyWarps) warps_per_tile = kSkinnyWarps / 2;
  return kSkinnyWarps / warps_per_tile;
}

// Per problem of `p` (any params with num_problems and problems[i].n_out / .epilogue) the tiles a CTA computes and
// its first block; block_begin[num_problems] closes the last range. Returns the blocks in all; throws when they pass
// the grid's int range. `kernel` names the caller in that message.
template <typename Params, size_t kMaxProblems>
int64_t lay_out_skinny_tiles(const Params& p, int64_t k_steps, int (&tiles)[kMaxProblems],
                             int (&block_begin)[kMaxProblems + 1], const char* kernel) {
  int64_t blocks = 0;
  for (int i = 0; i < p.num_problems; ++i) {
    const auto& q = p.problems[i];
    tiles[i] = skinny_tiles_per_cta(k_steps, q.epilogue);
    const int groups = q.epilogue == SkinnyEpilogue::kSiluMul ? tiles[i] / 2 : tiles[i];
    block_begin[i] = static_cast<int>(blocks);
    blocks += (q.n_out + 16 * groups - 1) / (16 * groups);
    DI_CHECK(blocks <= INT32_MAX, kernel, ": ", q.n_out, " output columns are too many");
  }
  block_begin[p.num_problems] = static_cast<int>(blocks);
  return blocks;
}

}  // namespace deepinfer::cuda
