// Device code of the grouped expert kernels (prefill: many rows per expert); included only by
// instantiations/moe_grouped_*.cu.
//
// Compute-bound. The padded row space (each expert's rows rounded up to 128) is cut into 128-row blocks, each inside
// one expert; a tile is (row block, column block). One persistent CTA per SM walks the tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...; consecutive tiles share a row block (column blocks vary fastest), so CTAs running
// side by side read the same activations and the same expert's weights through L2.
//   gate/up: tile = 128 rows x (128 gate + 128 up columns) of x · W_gate_up[e]^T, K = hidden; the epilogue writes
//            act = silu(gate) * up, 128 columns, rows addressed by pair (x rows gathered by token).
//   down:    tile = 128 rows x 256 columns of act · W_down[e]^T, K = inter; writes y rows by pair.
// Two warpgroups, each 64 rows x 256 columns on wgmma m64n256k16 (128 fp32 accumulators a thread), A and B from
// shared memory. Tiles stream in through cp.async, 64-wide K blocks, 4 stages; stage layout = the 128-byte swizzle
// (16-byte chunk c of row r at c ^ (r & 7), 8-row atoms of 1 KB), which the wgmma descriptors read directly.
// The K-block loop runs across tile boundaries, so the copies of the next tile overlap this tile's epilogue.
// A stage is refilled two steps after its MMAs were issued: by then both warpgroups have waited for them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/moe_internal.h"
#include "backend/cuda/moe_ptx.cuh"
#include "backend/cuda/moe_internal.h"

namespace deepinfer::cuda::moe_detail {

template <GemmKind kKindValue>
struct GroupedTraits {
  static constexpr GemmKind kKind = kKindValue;
  static constexpr bool kGateUp = kKindValue == GemmKind::kGateUp;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;                 // B rows of a tile (gate/up: 128 gate + 128 up)
  static constexpr int kBlockK = 64;                  // one 128-byte swizzle row
  static constexpr int kStages = 4;
  static constexpr int kThreads = 256;                // two warpgroups
  static constexpr int kABytes = kBlockM * kBlockK * 2;
  static constexpr int kBBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment to the 1 KB swizzle atom
  static constexpr int kOutCols = kGateUp ? kBlockN / 2 : kBlockN;  // output columns of a tile
  static constexpr int kARows = kBlockM * 8 / kThreads;  // rows of A a thread copies (one 16-byte chunk each)
  static constexpr int kBRows = kBlockN * 8 / kThreads;
  static_assert(kBlockM == kRowAlign, "a row block never straddles two experts");
  static_assert(kStages >= 3, "a stage is refilled two steps after its MMAs");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "operands start on swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
  static_assert(kARows * 32 == kBlockM && kBRows * 32 == kBlockN, "thread t copies chunk t % 8 of rows t / 8 + 32 q");
};

struct TileInfo {
  int expert = 0;
  int row0 = 0;        // first padded row of the tile
  int valid_rows = 0;  // rows of the tile that hold pairs
  int col0 = 0;        // first output column
};

template <typename T>
__device__ __forceinline__ TileInfo tile_info(const MoeKernelParams& kp, int tile, int n_tiles) {
  TileInfo ti;
  ti.row0 = (tile / n_tiles) * T::kBlockM;
  ti.col0 = (tile % n_tiles) * T::kOutCols;
  int lo = 0, hi = kp.p.num_experts;  // the last expert whose first row is <= row0 (empty experts come before it)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (__ldcg(&kp.expert_offsets[mid]) <= ti.row0) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  ti.expert = lo;
  ti.valid_rows = min(T::kBlockM, __ldcg(&kp.expert_counts[lo]) - (ti.row0 - __ldcg(&kp.expert_offsets[lo])));
  return ti;
}

// Byte offset of 16-byte chunk `chunk` (of 8) of row `row` in a swizzled operand block.
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The global sources of one thread's chunks for the tile the copies are in.
template <typename T>
struct TileSources {
  int tile_index = -1;  // CTA-local index of the tile these belong to
  const uint16_t* a[T::kARows];  // null: padding row, zero-filled
  const uint16_t* b[T::kBRows];
};

template <typename T>
__device__ __forceinline__ void set_sources(const MoeKernelParams& kp, TileSources<T>& src, int tile_index,
                                            int n_tiles) {
  const MoeParams& p = kp.p;
  const int tile = blockIdx.x + tile_index * gridDim.x;
  const TileInfo ti = tile_info<T>(kp, tile, n_tiles);
  const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
  src.tile_index = tile_index;
#pragma unroll
  for (int q = 0; q < T::kARows; ++q) {
    const int r = row + 32 * q;
    const int pair = r < ti.valid_rows ? __ldcg(&kp.row_pair[ti.row0 + r]) : -1;
    if (pair < 0) {
      src.a[q] = nullptr;
    } else if constexpr (T::kGateUp) {
      src.a[q] = p.x + static_cast<int64_t>(pair / p.top_k) * p.hidden + chunk * 8;
    } else {
      src.a[q] = kp.act + static_cast<int64_t>(pair) * p.inter + chunk * 8;
    }
  }
#pragma unroll
  for (int q = 0; q < T::kBRows; ++q) {
    const int r = row + 32 * q;
    int64_t w_row;
    if constexpr (T::kGateUp) {  // rows 0..127 gate columns col0.., rows 128..255 the matching up columns
      w_row = static_cast<int64_t>(ti.expert) * 2 * p.inter + (r < 128 ? ti.col0 + r : p.inter + ti.col0 + r - 128);
      src.b[q] = p.w_gate_up + w_row * p.hidden + chunk * 8;
    } else {
      w_row = static_cast<int64_t>(ti.expert) * p.hidden + ti.col0 + r;
      src.b[q] = p.w_down + w_row * p.inter + chunk * 8;
    }
  }
}

// Queues the copies of CTA-local step `step` (tile step / kb_per_tile, K block step % kb_per_tile).
template <typename T>
__device__ __forceinline__ void load_step(const MoeKernelParams& kp, TileSources<T>& src, int step, int kb_per_tile,
                                          int n_tiles, uint32_t smem_base) {
  const int tile_index = step / kb_per_tile;
  const int kb = step - tile_index * kb_per_tile;
  if (tile_index != src.tile_index) set_sources<T>(kp, src, tile_index, n_tiles);
  const uint32_t a_stage = smem_base + (step % T::kStages) * T::kStageBytes;
  const uint32_t b_stage = a_stage + T::kABytes;
  const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
#pragma unroll
  for (int q = 0; q < T::kARows; ++q) {
    const uint16_t* a = src.a[q];
    cp_async_16(a_stage + swizzle_offset(row + 32 * q, chunk), a != nullptr ? a + kb * T::kBlockK : kp.p.x,
                a != nullptr ? 16u : 0u);
  }
#pragma unroll
  for (int q = 0; q < T::kBRows; ++q) {
    cp_async_16(b_stage + swizzle_offset(row + 32 * q, chunk), src.b[q] + kb * T::kBlockK, 16u);
  }
}

// Thread (warpgroup wg, warp w of it, lane g * 4 + t) holds rows 64 wg + 16 w + g (+ 8) and columns 8 j + 2 t (+ 1).
template <typename T>
__device__ __forceinline__ void store_tile(const MoeKernelParams& kp, const TileInfo& ti, const float (&acc)[128]) {
  const MoeParams& p = kp.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r_lo = (warp >> 2) * 64 + (warp & 3) * 16 + g;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + 8 * half;
    const int pair = r < ti.valid_rows ? __ldcg(&kp.row_pair[ti.row0 + r]) : -1;
    if (pair < 0) continue;
    if constexpr (T::kGateUp) {
      uint16_t* out = kp.act + static_cast<int64_t>(pair) * p.inter + ti.col0 + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j) {  // gate in accumulator columns 8 j + .., up in 128 + 8 j + ..
        const float a0 = silu(acc[4 * j + 2 * half]) * acc[4 * j + 64 + 2 * half];
        const float a1 = silu(acc[4 * j + 2 * half + 1]) * acc[4 * j + 64 + 2 * half + 1];
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_bf16x2(a0, a1);
      }
    } else {
      uint16_t* out = kp.y + static_cast<int64_t>(pair) * p.hidden + ti.col0 + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_bf16x2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(T::kThreads, 1) moe_grouped_gemm_kernel(const __grid_constant__ MoeKernelParams kp) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t smem_base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  griddep_wait();
  griddep_launch_dependents();
  const MoeParams& p = kp.p;
  const int k_dim = T::kGateUp ? p.hidden : p.inter;
  const int n_tiles = (T::kGateUp ? p.inter : p.hidden) / T::kOutCols;
  const int total_tiles = __ldcg(&kp.expert_offsets[p.num_experts]) / T::kBlockM * n_tiles;
  if (static_cast<int>(blockIdx.x) >= total_tiles) return;
  const int my_tiles = (total_tiles - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
  const int kb_per_tile = k_dim / T::kBlockK;
  const int total_steps = my_tiles * kb_per_tile;
  const int wg = threadIdx.x >> 7;

  TileSources<T> src;
#pragma unroll
  for (int s = 0; s < T::kStages - 2; ++s) {
    if (s < total_steps) load_step<T>(kp, src, s, kb_per_tile, n_tiles, smem_base);
    cp_async_commit();
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  int step = 0;
  for (int tile_index = 0; tile_index < my_tiles; ++tile_index) {
    const TileInfo ti = tile_info<T>(kp, blockIdx.x + tile_index * gridDim.x, n_tiles);
    // A warpgroup whose 64 rows are all padding (an expert's last row block) issues no MMAs: the other one then has
    // the tensor cores to itself. Its stale accumulators are never stored.
    const bool has_rows = ti.valid_rows > wg * 64;
    // The K loop reads no accumulator outside wgmma, so the compiler keeps one MMA group in flight across it.
    for (int kb = 0; kb < kb_per_tile; ++kb, ++step) {
      cp_async_wait<T::kStages - 3>();  // this step's copies (one group, the next step's, may still fly)
      fence_proxy_async();
      __syncthreads();
      const uint32_t a_stage = smem_base + (step % T::kStages) * T::kStageBytes;
      const uint64_t desc_a = sw128_desc(a_stage + wg * 64 * 128, 16, 1024);
      const uint64_t desc_b = sw128_desc(a_stage + T::kABytes, 16, 1024);
      if (has_rows) {
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < T::kBlockK / 16; ++k16) {  // +32 bytes a k16 step: +2 in the descriptor
          wgmma_m64n256k16_bf16<BLayout::kKMajor>(acc, desc_a + 2 * k16, desc_b + 2 * k16, (kb > 0 || k16 > 0) ? 1 : 0);
        }
        wgmma_commit();
      }
      // Refill the stage of step - 2: every warpgroup waited for its MMAs before this step's barrier.
      if (step + T::kStages - 2 < total_steps) {
        load_step<T>(kp, src, step + T::kStages - 2, kb_per_tile, n_tiles, smem_base);
      }
      cp_async_commit();
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_registers(acc);
    store_tile<T>(kp, ti, acc);
  }
}

template <typename T>
void launch_grouped_gemm(const MoeKernelParams& kp, cudaStream_t stream) {
  const auto kernel = moe_grouped_gemm_kernel<T>;
  CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  const int n_tiles = (T::kGateUp ? kp.p.inter : kp.p.hidden) / T::kOutCols;
  const int64_t max_tiles = static_cast<int64_t>(kp.max_rows / T::kBlockM) * n_tiles;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kp.p.num_sms, max_tiles)));
  launch_pdl(kernel, {.grid = dim3(grid), .block = dim3(T::kThreads), .smem_bytes = T::kSmemBytes}, stream, kp);
}

}  // namespace deepinfer::cuda::moe_detail
