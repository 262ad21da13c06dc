// What the quantized skinny GEMM kernels (FP8: fp8_skinny_gemm.cu; INT4: int4_skinny_gemm.cu) share around their main
// loops: the activations' loads, the warps' accumulators through shared memory into the outputs with the skinny
// GEMM's epilogues (skinny_gemm_params.h), and the host's choice of token tiles and loads in flight. A problem type
// has out, out_f32, n_out, out_row_stride and epilogue.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/gemm/skinny_gemm_params.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda::skinny {

// 16 bf16 bytes of x, or zeros for a token past the batch.
__device__ __forceinline__ uint4 load_x(const uint16_t* ptr, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint4*>(ptr)) : make_uint4(0u, 0u, 0u, 0u);
}

template <typename Problem>
__device__ __forceinline__ float load_out(const Problem& q, int64_t i) {
  return q.out_f32 ? static_cast<const float*>(q.out)[i]
                   : __bfloat162float(static_cast<const __nv_bfloat16*>(q.out)[i]);
}

template <typename Problem>
__device__ __forceinline__ void store_out(const Problem& q, int64_t i, float v) {
  if (q.out_f32) {
    static_cast<float*>(q.out)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(q.out)[i] = __float2bfloat16_rn(v);
  }
}

// Every warp's accumulators into `partial`, then (after the barrier) the CTA's outputs. Output element (group, token
// tile, fragment lane, register): register i of lane l holds row l / 4 + 8 * (i / 2) and token 2 * (l % 4) + i % 2 of
// the tile's 16 x 8 accumulator; the warps of a tile add in a fixed order. kSiluMul pairs gate group g with up group
// g + groups.
template <int kWarps, int kTokenTiles, typename Problem>
__device__ __forceinline__ void write_outputs(float (&partial)[kWarps][kTokenTiles][32][4],
                                              const float (&acc)[kTokenTiles][4], const Problem& q, int64_t tokens,
                                              int block, int groups, int warps_per_tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][t][lane][i] = acc[t][i];
  }
  __syncthreads();
  const int outputs = groups * kTokenTiles * 128;
  for (int idx = threadIdx.x; idx < outputs; idx += kWarps * 32) {
    const int group = idx / (kTokenTiles * 128), t = (idx / 128) % kTokenTiles, l = (idx / 4) % 32, i = idx % 4;
    const int row = l / 4 + 8 * (i / 2), token = 8 * t + 2 * (l % 4) + i % 2;
    const int64_t col = (static_cast<int64_t>(block) * groups + group) * 16 + row;
    if (token >= tokens || col >= q.n_out) continue;
    const auto tile_sum = [&](int tl) {
      float sum = 0.0f;
      for (int w = 0; w < warps_per_tile; ++w) sum += partial[tl * warps_per_tile + w][t][l][i];
      return sum;
    };
    const int64_t o = token * q.out_row_stride + col;
    switch (q.epilogue) {
      case SkinnyEpilogue::kSiluMul: store_out(q, o, ptx::silu(tile_sum(group)) * tile_sum(group + groups)); break;
      case SkinnyEpilogue::kAccumulate: store_out(q, o, load_out(q, o) + tile_sum(group)); break;
      case SkinnyEpilogue::kStore: store_out(q, o, tile_sum(group)); break;
    }
  }
}

// 8-token MMA column tiles for `tokens` (1, 2, 4 or 8).
inline int token_tiles(int64_t tokens) {
  if (tokens <= 8) return 1;
  if (tokens <= 16) return 2;
  if (tokens <= 32) return 4;
  return 8;
}

// K steps a warp has in flight. One or two token tiles: four (two CTAs an SM), or eight when the grid of `blocks` is a
// single wave anyway (one CTA an SM) so the SM still has as many bytes in flight. Wider token tiles need the registers
// for activations and accumulators: two.
inline int loads_in_flight(int64_t blocks, int num_sms, int tiles) {
  if (tiles > 2) return 2;
  return blocks <= num_sms ? 8 : 4;
}

inline bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace deepinfer::cuda::skinny
