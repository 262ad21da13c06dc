// What the grouped expert kernels share (moe_grouped_gemm.cuh: bf16 and W8A16; moe_grouped_w8a8.cuh: W8A8): the
// tile walk over the padded row space, the row -> pair tables in shared memory, the 128-byte swizzle of the operand
// stages, and the epilogue. A traits type T names the tile (kBlockM rows, kOutCols output columns), the pair ring
// (kPairRing) and the stage size (kStageBytes); kGateUp picks the SwiGLU epilogue.
#pragma once

#include <cstdint>

#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"

namespace deepinfer::cuda::moe_detail {

// The tile metadata a CTA keeps in shared memory (generic pointers for reads, the pair ring's shared address for
// cp.async).
struct TileMeta {
  const int* offsets;  // [E + 1] expert_offsets
  const int* counts;   // [E] expert_counts
  int* pairs;          // [kPairRing][kBlockM]: row_pair of CTA-local tile i in slot i % kPairRing
  uint32_t pairs_addr;
};

struct TileInfo {
  int expert = 0;
  int row0 = 0;        // first padded row of the tile
  int valid_rows = 0;  // rows of the tile that hold pairs
  int col0 = 0;        // first output column
};

template <typename T>
__device__ __forceinline__ TileInfo tile_info(const MoeKernelParams& kp, const TileMeta& meta, int tile, int n_tiles) {
  TileInfo ti;
  ti.row0 = (tile / n_tiles) * T::kBlockM;
  ti.col0 = (tile % n_tiles) * T::kOutCols;
  int lo = 0, hi = kp.p.num_experts;  // the last expert whose first row is <= row0 (empty experts come before it)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (meta.offsets[mid] <= ti.row0) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  ti.expert = lo;
  ti.valid_rows = min(T::kBlockM, meta.counts[lo] - (ti.row0 - meta.offsets[lo]));
  return ti;
}

// First padded row of CTA-local tile `tile_index`.
template <typename T>
__device__ __forceinline__ int tile_row0(int tile_index, int n_tiles) {
  return (static_cast<int>(blockIdx.x) + tile_index * static_cast<int>(gridDim.x)) / n_tiles * T::kBlockM;
}

// Queues the copy of CTA-local tile `tile_index`'s row -> pair entries into its ring slot (threads 0 .. 31; entries
// past the expert's count are copied too and never read: row0 + kBlockM never passes the padded total).
template <typename T>
__device__ __forceinline__ void load_tile_pairs(const MoeKernelParams& kp, const TileMeta& meta, int tile_index,
                                                int n_tiles) {
  if (threadIdx.x < T::kBlockM / 4) {
    const int slot = tile_index % T::kPairRing;
    cp_async_16(meta.pairs_addr + (slot * T::kBlockM + threadIdx.x * 4) * 4,
                kp.row_pair + tile_row0<T>(tile_index, n_tiles) + threadIdx.x * 4, 16u);
  }
}

// The ring slot holding CTA-local tile `tile_index`'s pairs.
template <typename T>
__device__ __forceinline__ const int* ring_pairs(const TileMeta& meta, int tile_index) {
  return meta.pairs + (tile_index % T::kPairRing) * T::kBlockM;
}

// Byte offset of 16-byte chunk `chunk` (of 8) of row `row` in a swizzled operand block.
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The global sources of one thread's chunks for the tile the copies are in.
// The epilogue, per warpgroup: its 64 x kOutCols outputs go as bf16 through a staging buffer in shared memory, then
// out to their rows in 16-byte stores, a warp writing whole row segments. (Stored straight from the accumulator
// fragments, every warp store touched 8 rows with 16 bytes each, and the tile's tensor-core idle time at each tile
// change grew with it.) Thread (warp w of the warpgroup, lane g * 4 + t) holds rows 16 w + g (+ 8) and columns
// 8 j + 2 t (+ 1) in accumulators 4 j .. 4 j + 3 (kAcc: 64 x 2 kOutCols gate/up or 64 x kOutCols down values a
// warpgroup, over its 128 threads). `stage` (kStageBytes, no copies in flight, no MMA reading it) is this warpgroup's own.
template <typename T, int kAcc>
__device__ __forceinline__ void store_tile(const MoeKernelParams& kp, const TileInfo& ti, const int* pairs,
                                           const float (&acc)[kAcc], uint8_t* stage) {
  constexpr int kPitch = T::kOutCols * 2 + 16;  // bytes a staged row: + 16 puts a fragment store's 8 rows on
                                                // distinct banks
  constexpr int kChunks = T::kOutCols / 8;      // 16-byte chunks of a row
  static_assert(64 * kPitch <= T::kStageBytes, "a warpgroup's outputs fit its stage");
  const MoeParams& p = kp.p;
  const int wg = threadIdx.x >> 7, wt = threadIdx.x & 127;
  const int rows = min(64, ti.valid_rows - 64 * wg);
  if (rows <= 0) return;  // the whole warpgroup: all its rows are padding
  const int warp = wt >> 5, lane = wt & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint8_t* row = stage + (16 * warp + g + 8 * half) * kPitch + 4 * t;
    if constexpr (T::kGateUp) {
#pragma unroll
      for (int j = 0; j < T::kOutCols / 8; ++j) {  // gate in accumulator columns 8 j + .., up in the second half
        const float a0 = silu(acc[4 * j + 2 * half]) * acc[4 * j + kAcc / 2 + 2 * half];
        const float a1 = silu(acc[4 * j + 2 * half + 1]) * acc[4 * j + kAcc / 2 + 2 * half + 1];
        *reinterpret_cast<uint32_t*>(row + 16 * j) = pack_bf16x2(a0, a1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < T::kOutCols / 8; ++j) {
        *reinterpret_cast<uint32_t*>(row + 16 * j) = pack_bf16x2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
  warpgroup_barrier_sync(1 + wg);
  uint16_t* const out = T::kGateUp ? kp.act : kp.y;
  const int64_t pitch = T::kGateUp ? p.inter : p.hidden;
  for (int i = wt; i < rows * kChunks; i += 128) {
    const int r = i / kChunks, c = i - r * kChunks;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kPitch + 16 * c);
    *reinterpret_cast<uint4*>(out + pairs[64 * wg + r] * pitch + ti.col0 + 8 * c) = v;
  }
}

}  // namespace deepinfer::cuda::moe_detail
