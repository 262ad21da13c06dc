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
// Tile metadata never waits on L2 inside the K loop: the experts' row offsets and counts are copied to shared memory
// once, and each tile's 128 row -> pair entries arrive by cp.async with the first K block of the tile before it, into
// a ring of three. (Read from L2 where needed, the expert search and the pair loads stalled every thread for a chain
// of dependent L2 round trips at each tile change, with the tensor cores idle.) The epilogue stages each
// warpgroup's outputs in the two stages just consumed and stores whole row segments (store_tile).
// Each of the two changes shortened the V2-Lite layer at 4096 tokens (moe_bench --prefill on an H200).
//
// FP8 weights (kFp8, W8A16): the B tile (weights) does not come by cp.async. Each thread loads its 64 bytes of codes a
// step from global memory into registers one step ahead, and after the step's MMAs are issued widens them, times the
// block scale, to bf16 (one rounding) and stores them into the stage's swizzled B block with plain shared stores; the
// wgmma reads the same bf16 layout as without FP8. A 64-wide K block lies in one 128-wide scale block, and a tile's
// B rows in two 128-row blocks (gate/up: the gate block and the up block; down: two consecutive ones), so a thread's
// chunks need two scales a step. The stores are ordered before the MMAs that read them by the fence.proxy.async and
// the barrier that start every step, as the cp.async copies are.
//
// INT4 weights (kInt4, W4A16) take the FP8 B tiles' route: each thread loads 16 bytes of packed words (32 inputs of a
// row) of two B rows a step, one step ahead, with each one's group scale and zero point (the group size is a multiple
// of 32, so 32 aligned inputs lie in one group), and after the step's MMAs forms (q - z) exactly (unpack8,
// gemm/int4_unpack.cuh), times the scale in fp32, rounded to bf16 once, into the stage's swizzled B block.
// FP4 weights (kFp4) take the same tiles: e2m1 values instead of (q - z), and two scales a row and step, one for each
// half of the 32 inputs (groups of 16 or 32: a half lies in one group).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/gemm/int4_unpack.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/moe/moe_grouped_tiles.cuh"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"

namespace deepinfer::cuda::moe_detail {

template <GemmKind kKindValue, MoeWeightFormat kFormatValue = MoeWeightFormat::kBf16>
struct GroupedTraits {
  static constexpr GemmKind kKind = kKindValue;
  static constexpr bool kGateUp = kKindValue == GemmKind::kGateUp;
  static constexpr MoeWeightFormat kFormat = kFormatValue;
  // e4m3 weights with block scales, widened in registers (FP8 B tiles)
  static constexpr bool kFp8 = kFormat == MoeWeightFormat::kFp8;
  // packed INT4 weights with group scales, dequantized in registers (INT4 B tiles)
  static constexpr bool kInt4 = kFormat == MoeWeightFormat::kInt4;
  // packed FP4 (e2m1) weights: INT4's B tiles with e2m1 codes and no zero points
  static constexpr bool kFp4 = kFormat == MoeWeightFormat::kFp4;
  static constexpr bool kPacked4 = kInt4 || kFp4;
  static constexpr bool kConvertB = kFp8 || kPacked4;  // the B tile is stored by the threads, not copied by cp.async
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;                 // B rows of a tile (gate/up: 128 gate + 128 up)
  static constexpr int kBlockK = 64;                  // one 128-byte swizzle row
  static constexpr int kStages = 4;
  static constexpr int kThreads = 256;                // two warpgroups
  static constexpr int kABytes = kBlockM * kBlockK * 2;
  static constexpr int kBBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPairRing = 3;  // row -> pair tables in shared memory: this tile's, the next one's, one landing
  // After the stages: the pair ring (16-byte aligned for cp.async), expert offsets [kMaxExperts + 1], expert counts
  // [kMaxExperts].
  static constexpr int kMetaBytes = ((2 * kMaxExperts + 1 + kPairRing * kBlockM) * 4 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kStages * kStageBytes + kMetaBytes + 1024;  // + alignment to the 1 KB swizzle atom
  static constexpr int kOutCols = kGateUp ? kBlockN / 2 : kBlockN;  // output columns of a tile
  static constexpr int kARows = kBlockM * 8 / kThreads;  // rows of A a thread copies (one 16-byte chunk each)
  static constexpr int kBRows = kBlockN * 8 / kThreads;
  static_assert(kBlockM == kRowAlign, "a row block never straddles two experts");
  static_assert(kStages >= 3, "a stage is refilled two steps after its MMAs");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "operands start on swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
  static_assert(kARows * 32 == kBlockM && kBRows * 32 == kBlockN, "thread t copies chunk t % 8 of rows t / 8 + 32 q");
  static_assert(kBlockM % 4 == 0 && kBlockM / 4 <= kThreads, "a tile's pairs: one 16-byte copy of 4 entries a thread");
  // FP8 B tile: 16-byte chunk t % 4 (16 codes) of rows t / 4 + 64 q, q < kFp8Rows: rows q < 2 in the tile's first
  // 128-row block, q >= 2 in its second.
  static constexpr int kFp8Rows = kBlockN * kBlockK / 16 / kThreads;
  static_assert(kFp8Rows == 4 && kThreads / 4 == 64 && kBlockK == 64, "FP8 B: 4 chunks of 16 codes a row");
  // INT4 B tile: 16 bytes (4 words, 32 inputs) t % 2 of rows t / 2 + 128 q, q < kInt4Rows: row q = 0 in the tile's
  // first 128-row block, q = 1 in its second.
  static constexpr int kInt4Rows = kBlockN * kBlockK / 32 / kThreads;
  static_assert(kInt4Rows == 2 && kThreads / 2 == 128 && kBlockK == 64, "INT4 B: 2 x 4 words a row");
};

template <typename T>
struct TileSources {
  int tile_index = -1;  // CTA-local index of the tile these belong to
  const uint16_t* a[T::kARows];  // null: padding row, zero-filled
  const uint16_t* b[T::kConvertB ? 1 : T::kBRows];  // FP8, INT4: unused (Fp8BTile, Int4BTile)
};

template <typename T>
__device__ __forceinline__ void set_sources(const MoeKernelParams& kp, const TileMeta& meta, TileSources<T>& src,
                                            int tile_index, int n_tiles) {
  const MoeParams& p = kp.p;
  const int tile = blockIdx.x + tile_index * gridDim.x;
  const TileInfo ti = tile_info<T>(kp, meta, tile, n_tiles);
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
      src.a[q] = p.x + static_cast<int64_t>(pair / p.top_k) * p.hidden + chunk * 8;
    } else {
      src.a[q] = kp.act + static_cast<int64_t>(pair) * p.inter + chunk * 8;
    }
  }
  if constexpr (!T::kConvertB) {
#pragma unroll
    for (int q = 0; q < T::kBRows; ++q) {
      const int r = row + 32 * q;
      int64_t w_row;
      if constexpr (T::kGateUp) {  // rows 0..127 gate columns col0.., rows 128..255 the matching up columns
        w_row = static_cast<int64_t>(ti.expert) * 2 * p.inter + (r < 128 ? ti.col0 + r : p.inter + ti.col0 + r - 128);
        src.b[q] = static_cast<const uint16_t*>(p.w_gate_up) + w_row * p.hidden + chunk * 8;
      } else {
        w_row = static_cast<int64_t>(ti.expert) * p.hidden + ti.col0 + r;
        src.b[q] = static_cast<const uint16_t*>(p.w_down) + w_row * p.inter + chunk * 8;
      }
    }
  }
}

// FP8 B tiles: where one thread's codes and scales of a tile come from, and the codes of one step in flight.
template <typename T>
struct Fp8BTile {
  int tile_index = -1;               // CTA-local tile the pointers belong to
  const uint8_t* rows[T::kFp8Rows];  // this thread's 16-byte chunk of K block 0 in each of its rows
  const float* scales[2];            // the scales of the tile's two 128-row blocks, K block 0
  uint4 codes[T::kFp8Rows];          // the step's codes, loaded one step before they are stored
  float scale[2];

  __device__ __forceinline__ void set_tile(const MoeKernelParams& kp, const TileMeta& meta, int index, int n_tiles) {
    const MoeParams& p = kp.p;
    const TileInfo ti = tile_info<T>(kp, meta, blockIdx.x + index * gridDim.x, n_tiles);
    const int k_dim = T::kGateUp ? p.hidden : p.inter;
    const int64_t m_rows = T::kGateUp ? 2 * static_cast<int64_t>(p.inter) : p.hidden;  // rows of a matrix
    const int64_t k_blocks = k_dim / 128, row_blocks = m_rows / 128;
    const uint8_t* const base = static_cast<const uint8_t*>(T::kGateUp ? p.w_gate_up : p.w_down) +
                                static_cast<int64_t>(ti.expert) * m_rows * k_dim;
    // Matrix rows of the tile's two 128-row halves: gate/up, gate columns col0.. then the up ones; down, col0.. on.
    const int64_t half_row[2] = {ti.col0, T::kGateUp ? p.inter + ti.col0 : ti.col0 + 128};
    const int row = threadIdx.x >> 2, chunk = threadIdx.x & 3;
#pragma unroll
    for (int q = 0; q < T::kFp8Rows; ++q) {
      rows[q] = base + (half_row[q / 2] + row + 64 * (q % 2)) * k_dim + chunk * 16;
    }
    const float* const scale_base = (T::kGateUp ? p.w_gate_up_scale : p.w_down_scale) + ti.expert * row_blocks * k_blocks;
    scales[0] = scale_base + half_row[0] / 128 * k_blocks;
    scales[1] = scale_base + half_row[1] / 128 * k_blocks;
    tile_index = index;
  }

  // Issues the loads of CTA-local step `step`'s codes and scales.
  __device__ __forceinline__ void load(const MoeKernelParams& kp, const TileMeta& meta, int step, int kb_per_tile,
                                       int n_tiles) {
    const int index = step / kb_per_tile, kb = step - index * kb_per_tile;
    if (index != tile_index) set_tile(kp, meta, index, n_tiles);
#pragma unroll
    for (int q = 0; q < T::kFp8Rows; ++q) codes[q] = __ldg(reinterpret_cast<const uint4*>(rows[q] + kb * T::kBlockK));
    scale[0] = __ldg(scales[0] + kb / 2);  // 2 K blocks of 64 a scale block
    scale[1] = __ldg(scales[1] + kb / 2);
  }

  // Widens the loaded codes into the B block of stage `b_stage` (shared address): 16 codes of row r, K 16 c .. 16 c +
  // 15, become bf16 chunks 2 c and 2 c + 1 of the row.
  __device__ __forceinline__ void store(uint32_t b_stage) const {
    const int row = threadIdx.x >> 2, chunk = threadIdx.x & 3;
#pragma unroll
    for (int q = 0; q < T::kFp8Rows; ++q) {
      const int r = row + 64 * (q % 2) + 128 * (q / 2);
      const float s = scale[q / 2];
      uint4 lo, hi;
      e4m3x4_to_bf16x2_scaled(codes[q].x, s, lo.x, lo.y);
      e4m3x4_to_bf16x2_scaled(codes[q].y, s, lo.z, lo.w);
      e4m3x4_to_bf16x2_scaled(codes[q].z, s, hi.x, hi.y);
      e4m3x4_to_bf16x2_scaled(codes[q].w, s, hi.z, hi.w);
      st_shared_16(b_stage + swizzle_offset(r, 2 * chunk), lo);
      st_shared_16(b_stage + swizzle_offset(r, 2 * chunk + 1), hi);
    }
  }
};

// INT4 B tiles: where one thread's words, scales and zero points of a tile come from, and those of one step in
// flight.
template <typename T>
struct Int4BTile {
  int tile_index = -1;                  // CTA-local tile the pointers belong to
  const int32_t* rows[T::kInt4Rows];    // this thread's 4 words of K block 0 in each of its rows
  const float* scales[T::kInt4Rows];    // the rows' group scales
  const int32_t* zeros[T::kInt4Rows];   // the rows' packed zero points; null: symmetric
  uint4 codes[T::kInt4Rows];            // the step's words, loaded one step before they are stored
  float scale[T::kInt4Rows];
  float scale_hi[T::kInt4Rows];         // FP4: the scale of words 2 and 3 (scale: words 0 and 1)
  uint32_t zero[T::kInt4Rows];

  __device__ __forceinline__ void set_tile(const MoeKernelParams& kp, const TileMeta& meta, int index, int n_tiles) {
    const MoeParams& p = kp.p;
    const TileInfo ti = tile_info<T>(kp, meta, blockIdx.x + index * gridDim.x, n_tiles);
    const int k_dim = T::kGateUp ? p.hidden : p.inter;
    const int64_t m_rows = T::kGateUp ? 2 * static_cast<int64_t>(p.inter) : p.hidden;  // rows of a matrix
    const int64_t words = k_dim / 8, groups = k_dim / (T::kGateUp ? p.group_size : p.down_group_size), zero_words = (groups + 7) / 8;
    const int64_t expert_row = static_cast<int64_t>(ti.expert) * m_rows;  // the expert's first row of the stack
    const int32_t* const base = static_cast<const int32_t*>(T::kGateUp ? p.w_gate_up : p.w_down);
    const float* const scale_base = T::kGateUp ? p.w_gate_up_scale : p.w_down_scale;
    const int32_t* const zero_base = T::kGateUp ? p.w_gate_up_zeros : p.w_down_zeros;
    // Matrix rows of the tile's two 128-row halves: gate/up, gate columns col0.. then the up ones; down, col0.. on.
    const int64_t half_row[2] = {ti.col0, T::kGateUp ? p.inter + ti.col0 : ti.col0 + 128};
    const int row = threadIdx.x >> 1, half = threadIdx.x & 1;
#pragma unroll
    for (int q = 0; q < T::kInt4Rows; ++q) {
      const int64_t r = expert_row + half_row[q] + row;
      rows[q] = base + r * words + 4 * half;
      scales[q] = scale_base + r * groups;
      zeros[q] = zero_base != nullptr ? zero_base + r * zero_words : nullptr;
    }
    tile_index = index;
  }

  // Issues the loads of CTA-local step `step`'s words, scales and zero points.
  __device__ __forceinline__ void load(const MoeKernelParams& kp, const TileMeta& meta, int step, int kb_per_tile,
                                       int n_tiles) {
    const int index = step / kb_per_tile, kb = step - index * kb_per_tile;
    if (index != tile_index) set_tile(kp, meta, index, n_tiles);
    const int group_size = T::kGateUp ? kp.p.group_size : kp.p.down_group_size;
    const int first = kb * T::kBlockK + 32 * (threadIdx.x & 1);  // the thread's first input of the step
    const int group = first / group_size;
    const int group_hi = T::kFp4 ? (first + 16) / group_size : group;
#pragma unroll
    for (int q = 0; q < T::kInt4Rows; ++q) {
      codes[q] = __ldg(reinterpret_cast<const uint4*>(rows[q] + kb * (T::kBlockK / 8)));
      scale[q] = __ldg(scales[q] + group);
      if constexpr (T::kFp4) {
        scale_hi[q] = __ldg(scales[q] + group_hi);
        zero[q] = 0u;
      } else {
        zero[q] = int4::zero_of_group(zeros[q], group);
      }
    }
  }

  // Dequantizes the loaded words into the B block of stage `b_stage` (shared address): word j of row r's 4, inputs
  // 32 h + 8 j .. + 7 of the K block (h = thread % 2), becomes bf16 chunk 4 h + j of the row.
  __device__ __forceinline__ void store(uint32_t b_stage) const {
    const int row = threadIdx.x >> 1, half = threadIdx.x & 1;
#pragma unroll
    for (int q = 0; q < T::kInt4Rows; ++q) {
      const int r = row + 128 * q;
      const uint32_t zp = int4::zero_pair(zero[q]);
      const uint32_t words[4] = {codes[q].x, codes[q].y, codes[q].z, codes[q].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float s = T::kFp4 && j >= 2 ? scale_hi[q] : scale[q];
        uint32_t pairs[4];
        int4::unpack8_codes<T::kFp4>(words[j], zp, pairs);  // q - z or e2m1(q), exact
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = pack_bf16x2(bf16_lo(pairs[i]) * s, bf16_hi(pairs[i]) * s);
        st_shared_16(b_stage + swizzle_offset(r, 4 * half + j), make_uint4(v[0], v[1], v[2], v[3]));
      }
    }
  }
};

// The B tile a kConvertB kernel stores itself (bf16 kernels declare an unused Fp8BTile, as before).
template <typename T>
using ConvertedBTile = std::conditional_t<T::kPacked4, Int4BTile<T>, Fp8BTile<T>>;

// Queues the copies of CTA-local step `step` (tile step / kb_per_tile, K block step % kb_per_tile). The first K block
// of tile i also brings tile i + 1's pairs: they land (step's wait and barrier) at least kb_per_tile - 2 >= 0 steps
// before set_sources reads them for tile i + 1's first K block. Their ring slot held tile i - 2's pairs, last read by
// that tile's epilogue, which every thread finished before the barrier of tile i - 1's first step; this copy is
// queued at step - 2 >= that step (kb_per_tile >= 2).
template <typename T>
__device__ __forceinline__ void load_step(const MoeKernelParams& kp, const TileMeta& meta, TileSources<T>& src,
                                          int step, int kb_per_tile, int n_tiles, int my_tiles, uint32_t smem_base) {
  const int tile_index = step / kb_per_tile;
  const int kb = step - tile_index * kb_per_tile;
  if (tile_index != src.tile_index) set_sources<T>(kp, meta, src, tile_index, n_tiles);
  if (kb == 0 && tile_index + 1 < my_tiles) load_tile_pairs<T>(kp, meta, tile_index + 1, n_tiles);
  const uint32_t a_stage = smem_base + (step % T::kStages) * T::kStageBytes;
  const uint32_t b_stage = a_stage + T::kABytes;
  const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
#pragma unroll
  for (int q = 0; q < T::kARows; ++q) {
    const uint16_t* a = src.a[q];
    cp_async_16(a_stage + swizzle_offset(row + 32 * q, chunk), a != nullptr ? a + kb * T::kBlockK : kp.p.x,
                a != nullptr ? 16u : 0u);
  }
  if constexpr (!T::kConvertB) {  // FP8, INT4: ConvertedBTile
#pragma unroll
    for (int q = 0; q < T::kBRows; ++q) {
      cp_async_16(b_stage + swizzle_offset(row + 32 * q, chunk), src.b[q] + kb * T::kBlockK, 16u);
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

  // The metadata: expert offsets and counts, and the first tile's pairs (the later ones come by cp.async).
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

  TileSources<T> src;
  ConvertedBTile<T> conv_b;  // FP8 and INT4 only
#pragma unroll
  for (int s = 0; s < T::kStages - 2; ++s) {
    if (s < total_steps) {
      load_step<T>(kp, meta, src, s, kb_per_tile, n_tiles, my_tiles, smem_base);
      if constexpr (T::kConvertB) {
        conv_b.load(kp, meta, s, kb_per_tile, n_tiles);
        conv_b.store(smem_base + (s % T::kStages) * T::kStageBytes + T::kABytes);
      }
    }
    cp_async_commit();
  }
  if constexpr (T::kConvertB) {  // the first step the loop stores: in registers one step ahead
    if (T::kStages - 2 < total_steps) conv_b.load(kp, meta, T::kStages - 2, kb_per_tile, n_tiles);
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  int step = 0;
  for (int tile_index = 0; tile_index < my_tiles; ++tile_index) {
    const TileInfo ti = tile_info<T>(kp, meta, blockIdx.x + tile_index * gridDim.x, n_tiles);
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
        load_step<T>(kp, meta, src, step + T::kStages - 2, kb_per_tile, n_tiles, my_tiles, smem_base);
        if constexpr (T::kConvertB) {  // its B codes came last step; the next step's go out now
          conv_b.store(smem_base + ((step + T::kStages - 2) % T::kStages) * T::kStageBytes + T::kABytes);
        }
      }
      cp_async_commit();
      if constexpr (T::kConvertB) {
        if (step + T::kStages - 1 < total_steps) conv_b.load(kp, meta, step + T::kStages - 1, kb_per_tile, n_tiles);
      }
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_registers(acc);
    // Staging goes to the stages of this tile's last two K blocks: no copies fly into them (the next ones are in
    // flight into the other two) and, after this barrier, no warpgroup's MMAs read them. They are refilled only after
    // the next step's barrier, which every thread reaches with its stores done.
    __syncthreads();
    const int wg_stage = (step - 1 + wg * (T::kStages - 1)) % T::kStages;  // wg 0: step - 1's, wg 1: step - 2's
    store_tile<T>(kp, ti, ring_pairs<T>(meta, tile_index), acc,
                  smem_raw + (smem_base - smem_addr(smem_raw)) + wg_stage * T::kStageBytes);
  }
}

template <typename T>
void launch_grouped_gemm_of(const MoeKernelParams& kp, LaunchStream stream) {
  const auto kernel = moe_grouped_gemm_kernel<T>;
  const int n_tiles = (T::kGateUp ? kp.p.inter : kp.p.hidden) / T::kOutCols;
  const int64_t max_tiles = static_cast<int64_t>(kp.max_rows / T::kBlockM) * n_tiles;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kp.p.num_sms, max_tiles)));
  launch_pdl_large_smem(kernel, {.grid = dim3(grid), .block = dim3(T::kThreads), .smem_bytes = T::kSmemBytes},
                        stream, kp);
}

// bf16 or FP8 weights (p.weight_format); INT4 and FP4 ones have instantiations of their own (launch_grouped_int4_*,
// launch_grouped_fp4_*).
template <GemmKind kKind>
void launch_grouped_gemm(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kFp8) {
    launch_grouped_gemm_of<GroupedTraits<kKind, MoeWeightFormat::kFp8>>(kp, stream);
  } else {
    launch_grouped_gemm_of<GroupedTraits<kKind, MoeWeightFormat::kBf16>>(kp, stream);
  }
}

}  // namespace deepinfer::cuda::moe_detail
