// Device code of the W8A8 grouped expert kernels (prefill with FP8 experts and MoeParams::fp8_activations); included
// only by instantiations/moe_grouped_w8a8_*.cu.
//
// DeepSeek's FP8 recipe on the grouped path: the A rows (x gathered by token for gate/up, act by pair for down) are
// e4m3 codes with one scale per row per 128 channels (quantize_fp8_activations, run just before each kernel), the
// weights e4m3 codes with one scale per 128 x 128 block, and the products run on FP8 tensor cores (wgmma
// m64n128k32 e4m3, twice the bf16 rate, half the bytes a K step).
//
// The tile walk, the row -> pair ring, the 128-byte swizzle and the epilogue are the bf16 kernels'
// (moe_grouped_tiles.cuh). What differs:
//   - A K block is 128 codes: one 128-byte swizzle row, so the stage layout and the descriptors are byte for byte the
//     bf16 kernels', and one scale block, so every K block has one scale per A row and one per B row block.
//   - Promotion: a K block's four MMAs accumulate into `part` (fresh each block), which the warpgroup then waits for
//     and adds to `acc` times scale_a(row) * scale_b(column block), in fp32. (The tensor cores' FP8 accumulation keeps
//     fewer mantissa bits than fp32; DeepSeek-V3's report promotes every 128 channels for that reason, and the scales
//     differ per block anyway.) Two accumulator sets of 64 x 128 a warpgroup are what the register file allows, so a
//     tile is 128 rows x 128 B rows: gate/up 64 gate + 64 up rows (64 output columns), down 128 output columns.
//   - Both operands come by cp.async: no widening in registers (the W8A16 kernel's B path).
//   - Six stages (32 KB each), refilled two steps after their MMAs were issued, as in the bf16 kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/moe/moe_grouped_tiles.cuh"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"
#include "backend/cuda/runtime/launch.h"

namespace deepinfer::cuda::moe_detail {

template <GemmKind kKindValue>
struct W8A8Traits {
  static constexpr GemmKind kKind = kKindValue;
  static constexpr bool kGateUp = kKindValue == GemmKind::kGateUp;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;  // B rows of a tile (gate/up: 64 gate + 64 up)
  static constexpr int kBlockK = kW8A8BlockK;  // codes: one 128-byte swizzle row and one scale block
  static constexpr int kStages = 6;
  static constexpr int kThreads = 256;  // two warpgroups, 64 rows each
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPairRing = 3;
  static constexpr int kMetaBytes = ((2 * kMaxExperts + 1 + kPairRing * kBlockM) * 4 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kStages * kStageBytes + kMetaBytes + 1024;
  static constexpr int kOutCols = kGateUp ? kBlockN / 2 : kBlockN;
  static constexpr int kAcc = 64 * kBlockN / 128;  // fp32 accumulators a thread (a warpgroup's 64 x kBlockN)
  static constexpr int kARows = kBlockM * 8 / kThreads;  // rows of A a thread copies (one 16-byte chunk each)
  static constexpr int kBRows = kBlockN * 8 / kThreads;
  static_assert(kBlockM == kRowAlign, "a row block never straddles two experts");
  static_assert(kStages - 2 == kW8A8MinKBlocks, "a tile's pairs land before the tile's first copies read them");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "operands start on swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
  static_assert(kARows * 32 == kBlockM && kBRows * 32 == kBlockN, "thread t copies chunk t % 8 of rows t / 8 + 32 q");
  static_assert(64 * (kOutCols * 2 + 16) <= kStageBytes, "a warpgroup's staged outputs fit one stage");
};

// Where one thread's copies of a tile come from: A rows (null: padding, zero-filled) and B rows, K block 0.
template <typename T>
struct W8A8Sources {
  int tile_index = -1;
  const uint8_t* a[T::kARows];
  const uint8_t* b[T::kBRows];
};

template <typename T>
__device__ __forceinline__ void set_w8a8_sources(const MoeKernelParams& kp, const TileMeta& meta,
                                                 W8A8Sources<T>& src, int tile_index, int n_tiles) {
  const MoeParams& p = kp.p;
  const TileInfo ti = tile_info<T>(kp, meta, blockIdx.x + tile_index * gridDim.x, n_tiles);
  const int* pairs = ring_pairs<T>(meta, tile_index);
  const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
  src.tile_index = tile_index;
#pragma unroll
  for (int q = 0; q < T::kARows; ++q) {
    const int r = row + 32 * q;
    const int pair = r < ti.valid_rows ? pairs[r] : -1;
    if (pair < 0) {
      src.a[q] = nullptr;
    } else if constexpr (T::kGateUp) {
      src.a[q] = kp.x_codes + static_cast<int64_t>(pair / p.top_k) * p.hidden + chunk * 16;
    } else {
      src.a[q] = kp.act_codes + static_cast<int64_t>(pair) * p.inter + chunk * 16;
    }
  }
  const int64_t k_dim = T::kGateUp ? p.hidden : p.inter;
  const int64_t m_rows = T::kGateUp ? 2 * static_cast<int64_t>(p.inter) : p.hidden;  // rows of an expert matrix
  const uint8_t* const base =
      static_cast<const uint8_t*>(T::kGateUp ? p.w_gate_up : p.w_down) + ti.expert * m_rows * k_dim;
#pragma unroll
  for (int q = 0; q < T::kBRows; ++q) {
    const int r = row + 32 * q;
    // gate/up: rows 0..63 the gate rows of columns col0.., rows 64..127 the matching up rows; down: rows col0..
    const int64_t w_row = T::kGateUp ? (r < 64 ? ti.col0 + r : p.inter + ti.col0 + r - 64) : ti.col0 + r;
    src.b[q] = base + w_row * k_dim + chunk * 16;
  }
}

// Queues the copies of CTA-local step `step` and, with a tile's first K block, the next tile's pairs (the timing
// argument of the bf16 kernels' load_step holds with kStages - 2 = kW8A8MinKBlocks steps of lead).
template <typename T>
__device__ __forceinline__ void load_w8a8_step(const MoeKernelParams& kp, const TileMeta& meta, W8A8Sources<T>& src,
                                               int step, int kb_per_tile, int n_tiles, int my_tiles,
                                               uint32_t smem_base) {
  const int tile_index = step / kb_per_tile;
  const int kb = step - tile_index * kb_per_tile;
  if (tile_index != src.tile_index) set_w8a8_sources<T>(kp, meta, src, tile_index, n_tiles);
  if (kb == 0 && tile_index + 1 < my_tiles) load_tile_pairs<T>(kp, meta, tile_index + 1, n_tiles);
  const uint32_t a_stage = smem_base + (step % T::kStages) * T::kStageBytes;
  const uint32_t b_stage = a_stage + T::kABytes;
  const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
#pragma unroll
  for (int q = 0; q < T::kARows; ++q) {
    const uint8_t* a = src.a[q];
    cp_async_16(a_stage + swizzle_offset(row + 32 * q, chunk), a != nullptr ? a + kb * T::kBlockK : kp.x_codes,
                a != nullptr ? 16u : 0u);
  }
#pragma unroll
  for (int q = 0; q < T::kBRows; ++q) {
    cp_async_16(b_stage + swizzle_offset(row + 32 * q, chunk), src.b[q] + kb * T::kBlockK, 16u);
  }
}

// The scales one thread's accumulators need, K block 0: its two rows' activation scales (rows 16 w + g and + 8 of
// its warpgroup's 64; a padding row reads row 0's, finite, never stored) and the B row blocks' (gate/up: the gate
// block for accumulator columns 0..63, the up block for 64..127; down: one block).
template <typename T>
struct W8A8Scales {
  const float* a[2];
  int64_t a_stride = 0;  // rows of the scale array: one K block to the next
  const float* b[2];

  __device__ __forceinline__ void set_tile(const MoeKernelParams& kp, const TileInfo& ti, const int* pairs) {
    const MoeParams& p = kp.p;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x & 127) >> 5, g = (threadIdx.x & 31) >> 2;
    a_stride = T::kGateUp ? p.num_tokens : static_cast<int64_t>(p.num_tokens) * p.top_k;
    const float* const a_base = T::kGateUp ? kp.x_scales : kp.act_scales;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 64 * wg + 16 * warp + g + 8 * h;
      const int pair = r < ti.valid_rows ? pairs[r] : -1;
      a[h] = a_base + (pair < 0 ? 0 : T::kGateUp ? pair / p.top_k : pair);
    }
    const int64_t k_blocks = (T::kGateUp ? p.hidden : p.inter) / T::kBlockK;
    const int64_t row_blocks = (T::kGateUp ? 2 * static_cast<int64_t>(p.inter) : p.hidden) / 128;
    const float* const b_base =
        (T::kGateUp ? p.w_gate_up_scale : p.w_down_scale) + ti.expert * row_blocks * k_blocks;
    b[0] = b_base + (ti.col0 / 128) * k_blocks;
    b[1] = T::kGateUp ? b_base + ((p.inter + ti.col0) / 128) * k_blocks : b[0];
  }
};

template <typename T>
__global__ void __launch_bounds__(T::kThreads, 1) moe_grouped_w8a8_kernel(const __grid_constant__ MoeKernelParams kp) {
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

  const uint32_t meta_addr = smem_base + T::kStages * T::kStageBytes;
  int* pairs_s = reinterpret_cast<int*>(smem_raw + (meta_addr - smem_addr(smem_raw)));
  int* offsets_s = pairs_s + T::kPairRing * T::kBlockM;
  int* counts_s = offsets_s + kMaxExperts + 1;
  for (int i = threadIdx.x; i <= p.num_experts; i += T::kThreads) {
    offsets_s[i] = __ldcg(&kp.expert_offsets[i]);
    if (i < p.num_experts) counts_s[i] = __ldcg(&kp.expert_counts[i]);
  }
  const TileMeta meta{.offsets = offsets_s, .counts = counts_s, .pairs = pairs_s, .pairs_addr = meta_addr};
  if (threadIdx.x < T::kBlockM) pairs_s[threadIdx.x] = __ldcg(&kp.row_pair[tile_row0<T>(0, n_tiles) + threadIdx.x]);
  __syncthreads();

  W8A8Sources<T> src;
#pragma unroll
  for (int s = 0; s < T::kStages - 2; ++s) {
    if (s < total_steps) load_w8a8_step<T>(kp, meta, src, s, kb_per_tile, n_tiles, my_tiles, smem_base);
    cp_async_commit();
  }

  float acc[T::kAcc], part[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.0f;
  W8A8Scales<T> scales;
  int step = 0;
  for (int tile_index = 0; tile_index < my_tiles; ++tile_index) {
    const TileInfo ti = tile_info<T>(kp, meta, blockIdx.x + tile_index * gridDim.x, n_tiles);
    const bool has_rows = ti.valid_rows > wg * 64;  // as in the bf16 kernels: an all-padding warpgroup idles
    scales.set_tile(kp, ti, ring_pairs<T>(meta, tile_index));
    for (int kb = 0; kb < kb_per_tile; ++kb, ++step) {
      cp_async_wait<T::kStages - 3>();
      fence_proxy_async();
      __syncthreads();
      // This K block's scales, loaded now and read after the MMAs (written by the quantize kernel before this one).
      const float sa0 = __ldg(scales.a[0] + kb * scales.a_stride), sa1 = __ldg(scales.a[1] + kb * scales.a_stride);
      const float sb0 = __ldg(scales.b[0] + kb), sb1 = __ldg(scales.b[1] + kb);
      const uint32_t a_stage = smem_base + (step % T::kStages) * T::kStageBytes;
      const uint64_t desc_a = sw128_desc(a_stage + wg * 64 * 128, 16, 1024);
      const uint64_t desc_b = sw128_desc(a_stage + T::kABytes, 16, 1024);
      if (has_rows) {
        wgmma_fence();
#pragma unroll
        for (int k32 = 0; k32 < T::kBlockK / 32; ++k32) {  // +32 bytes a k32 step: +2 in the descriptor
          wgmma_m64n128k32_e4m3(part, desc_a + 2 * k32, desc_b + 2 * k32, k32 > 0 ? 1 : 0);
        }
        wgmma_commit();
      }
      if (step + T::kStages - 2 < total_steps) {
        load_w8a8_step<T>(kp, meta, src, step + T::kStages - 2, kb_per_tile, n_tiles, my_tiles, smem_base);
      }
      cp_async_commit();
      // The promotion runs in every warpgroup, without a branch: accumulators touched inside divergent code make
      // ptxas serialize the wgmma instructions (its C7518 warning). An all-padding warpgroup waits for nothing and
      // promotes stale values it never stores.
      wgmma_wait<0>();
      fence_registers(part);
      // Accumulator 4 j + i: row g (i < 2) or g + 8, column 8 j + 2 t + (i & 1); gate/up columns 64.. are the up
      // block's. The first K block of a tile starts the sums (a select, not a multiply by 0: a stale inf stays out).
      const float s00 = sa0 * sb0, s01 = sa0 * sb1, s10 = sa1 * sb0, s11 = sa1 * sb1;
      const bool first = kb == 0;
#pragma unroll
      for (int j = 0; j < T::kAcc / 4; ++j) {
        const bool second = T::kGateUp && j >= T::kAcc / 8;
        const float top = second ? s01 : s00, bottom = second ? s11 : s10;
        acc[4 * j] = fmaf(part[4 * j], top, first ? 0.0f : acc[4 * j]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], top, first ? 0.0f : acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], bottom, first ? 0.0f : acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], bottom, first ? 0.0f : acc[4 * j + 3]);
      }
    }
    // Staging goes to the stages of the tile's last two K blocks, as in the bf16 kernels (no copies fly into them and,
    // after this barrier, no MMA reads them).
    __syncthreads();
    const int wg_stage = (step - 1 + wg * (T::kStages - 1)) % T::kStages;  // wg 0: step - 1's, wg 1: step - 2's
    store_tile<T>(kp, ti, ring_pairs<T>(meta, tile_index), acc,
                  smem_raw + (smem_base - smem_addr(smem_raw)) + wg_stage * T::kStageBytes);
  }
}

template <GemmKind kKind>
void launch_grouped_w8a8(const MoeKernelParams& kp, LaunchStream stream) {
  using T = W8A8Traits<kKind>;
  const auto kernel = moe_grouped_w8a8_kernel<T>;
  const int n_tiles = (T::kGateUp ? kp.p.inter : kp.p.hidden) / T::kOutCols;
  const int64_t max_tiles = static_cast<int64_t>(kp.max_rows / T::kBlockM) * n_tiles;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kp.p.num_sms, max_tiles)));
  launch_pdl_large_smem(kernel, {.grid = dim3(grid), .block = dim3(T::kThreads), .smem_bytes = T::kSmemBytes},
                        stream, kp);
}

}  // namespace deepinfer::cuda::moe_detail
