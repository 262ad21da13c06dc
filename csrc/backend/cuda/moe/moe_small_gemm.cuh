// Device code of the small-M expert kernels (decode: few rows per expert); included only by
// instantiations/moe_small_*.cu and moe_small_ffn.cu.
//
// Memory-bound: every active expert's weights are read once, at full bandwidth, straight from global memory into
// registers (16-byte loads, no shared-memory staging). The weight rows are the M dimension of mma.sync m16n8k16 and
// the expert's rows (tokens) the N dimension, 8 a tile:
//   CTA = (column block, active expert). 2 tiles of 16 weight rows x kKSplit slices of K: 8 warps (4 slices), or 4
//   warps (2 slices) when the launcher wants twice the resident CTAs: a grid that fits the GPU in one wave of 4-warp
//   CTAs streams to its end, where with 8-warp CTAs a partial second wave would run at a fraction of the bandwidth
//   (V2-Lite's gate/up at batch 1: 88 x 8 CTAs against 132 x 4 resident 8-warp CTAs).
//   gate/up: 16 act columns a CTA; warp row tile 0 holds gate rows i0 .. +16, tile 1 the up rows I + i0 .. +16.
//   down:    32 output columns a CTA; the two row tiles are rows d0 .. +16 and d0 + 16 .. +16 of W_down.
// The K slices' partial sums meet in shared memory; the epilogue applies silu(gate) * up (gate/up) and writes
// bf16 rows of act or y, addressed by pair.
//
// K order inside an MMA is free as long as A and B agree: for every 32-wide K chunk, lane (g, t) loads 16 bytes
// (k = 8t .. 8t+7) of weight rows g and g + 8 and of row g of the activations, and feeds k = 8t .. 8t+3 to the first
// m16n8k16 and 8t+4 .. 8t+7 to the second, in the fragment slots of k = 2t, 2t+1, 2t+8, 2t+9.
//
// FP8 weights (kFp8): the same K order and fragments, from 8 bytes of codes a lane and chunk (half the bytes) widened
// to the bf16 words of the 16-byte layout in registers, exactly. A 32-wide chunk lies inside one 128-wide K block and
// a row tile's 16 rows inside one 128-row block, so each chunk's two MMAs go into a zeroed fp32 partial sum that is
// added to the accumulator times the block's scale: the dequantized product, with no rounding of the weight.
//
// INT4 weights (kInt4, W4A16): a lane's 8 weights of a 32-wide chunk, k = 8t .. 8t+7 of a row, are exactly one packed
// word (4 bytes, streamed as the other formats' chunks), which unpack8 (gemm/int4_unpack.cuh) turns into the four bf16
// words of the 16-byte layout holding q - z, exactly. The group size is a multiple of 32, so a chunk lies inside one
// group of every row; but rows g and g + 8 have scales (and zero points) of their own. Each chunk's two MMAs go into a
// zeroed fp32 partial sum whose row-g registers (0, 1) are added to the accumulator times row g's group scale and
// whose row-(g + 8) registers (2, 3) times row g + 8's: again the dequantized product, no rounding of the weight.
//
// FP4 weights (kFp4: e2m1 codes in the same words, no zero points): groups of 16 or 32 inputs, so the lanes of one
// chunk may have different scales; a lane's word (8 inputs) lies inside one group, whose scale it applies to its
// unpacked pairs in registers (rounded to bf16), and the MMAs accumulate as for bf16 weights.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/gemm/int4_unpack.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"
#include "backend/cuda/moe/moe_small_tiles.h"

namespace deepinfer::cuda::moe_detail {

template <GemmKind kKindValue, int kTokenTilesValue, int kKSplitValue = 4,
          MoeWeightFormat kFormatValue = MoeWeightFormat::kBf16>
struct SmallTraits {
  static constexpr GemmKind kKind = kKindValue;
  static constexpr bool kGateUp = kKindValue == GemmKind::kGateUp;
  static constexpr MoeWeightFormat kFormat = kFormatValue;
  static constexpr bool kFp8 = kFormat == MoeWeightFormat::kFp8;    // e4m3 weights with block scales
  static constexpr bool kInt4 = kFormat == MoeWeightFormat::kInt4;  // packed INT4 words with group scales
  static constexpr bool kFp4 = kFormat == MoeWeightFormat::kFp4;    // packed e2m1 words with group scales
  static constexpr bool kPacked4 = kInt4 || kFp4;
  // A lane's 8 weights of a 32-wide K chunk: 16 bytes of bf16, 8 bytes of e4m3 codes, or one packed 4-bit word.
  using WeightChunk = std::conditional_t<kFp8, uint2, std::conditional_t<kPacked4, uint32_t, uint4>>;
  // Bytes of `elems` consecutive weights of a row (packed 4-bit: a multiple of 8, whole words).
  static constexpr __host__ __device__ int64_t bytes_of(int64_t elems) {
    return kPacked4 ? elems / 2 : elems * (kFp8 ? 1 : 2);
  }
  static constexpr int kTokenTiles = kTokenTilesValue;   // n8 tiles of expert rows per pass
  static constexpr int kRowsPerPass = 8 * kTokenTiles;
  static constexpr int kKSplit = kKSplitValue;           // warps along K
  static constexpr int kRowTiles = 2;                    // m16 tiles of weight rows
  static constexpr int kThreads = 32 * kKSplit * kRowTiles;
  static constexpr int kUnroll = kTokenTiles == 1 ? 3 : 4;  // K chunks loaded before their MMAs
  static constexpr int kOutCols = kGateUp ? 16 : kDownColsPerCta;  // output columns of a CTA
  // Resident CTAs per SM the registers are budgeted for (<= 64 registers with one token tile, 128 with four): 32
  // or 16 warps an SM. The launcher's one-wave test counts on it.
  static constexpr int kMinBlocks = (kTokenTiles == 1 ? 4 : 2) * (4 / kKSplit);
  static_assert(kKSplit == 2 || kKSplit == 4, "4 or 8 warps: 2 row tiles x 2 or 4 K slices");
  static_assert(kTokenTiles >= 1 && kTokenTiles <= 4, "at most 32 rows a pass");
  static_assert(kOutCols == 32 || kGateUp, "the fused combine covers the down CTA's 32 columns, 2 a thread");
};

// The combine of the columns [col0, col0 + 32) of every token, by the last down CTA of the column block:
// out[t, c] = add[t, c] + sum_j weight[t, j] * y[t * top_k + j, c], slots in order (as the combine kernel).
template <typename T>
__device__ void combine_columns(const MoeKernelParams& kp, int col0) {
  const MoeParams& p = kp.p;
  for (int idx = threadIdx.x; idx < p.num_tokens * 16; idx += T::kThreads) {
    const int token = idx / 16, col = col0 + (idx % 16) * 2;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t pair = static_cast<int64_t>(token) * p.top_k + j;
      const int e = expert_slot(p, __ldcg(&p.topk_ids[pair]));
      if (e < 0 || e >= p.num_experts) continue;  // an invalid id, or one held elsewhere: no row
      const float w = __ldcg(&p.topk_weights[pair]);
      if (w == 0.0f) continue;
      const uint32_t v = __ldcg(reinterpret_cast<const unsigned int*>(kp.y + pair * p.hidden + col));
      acc0 = fmaf(w, bf16_lo(v), acc0);
      acc1 = fmaf(w, bf16_hi(v), acc1);
    }
    const int64_t at = static_cast<int64_t>(token) * p.hidden + col;
    if (p.add != nullptr) {
      const uint32_t a = __ldcg(reinterpret_cast<const unsigned int*>(p.add + at));
      acc0 += bf16_lo(a);
      acc1 += bf16_hi(a);
    }
    *reinterpret_cast<uint32_t*>(p.out + at) = pack_bf16x2(acc0, acc1);
  }
}

// Where a CTA's work comes from: its slot's expert, rows and first row, and the active expert count; for the shared
// slots computed before the wait, the expert and every token's pair are known without the routing's output.
struct SlotWork {
  int expert, count, row0, num_active;
  int shared;  // >= 0: shared expert `shared` of every token (pair t * top_k + k + shared), rows not read
};

// The work of a slot, from the routing's record (after the grid dependency wait), or, for shared slot `slot` run
// before it, from the parameters alone.
__device__ __forceinline__ SlotWork slot_work(const MoeKernelParams& kp, int slot, bool shared_early) {
  if (shared_early) return {kp.p.num_experts - kp.shared_slots + slot, kp.p.num_tokens, 0, 0, slot};
  const ::int4 info = __ldcg(&kp.slot_info[slot]);  // expert -1: no expert in this slot
  return {info.x, info.y, info.z, info.w, -1};
}

// Shared memory of one work item: the K slices' partial sums and the rows' pairs of a pass.
template <int kKSplit, int kRowsPerPass>
struct SmallShared {
  float red[kKSplit][2][16][kRowsPerPass + 1];
  int32_t pair_s[kRowsPerPass];
  int32_t flag;  // a broadcast: whether this CTA combines (combine_if_last)
};
template <typename T>
using SmallSharedOf = SmallShared<T::kKSplit, T::kRowsPerPass>;

// One work item: output column block `col_block` of one slot. load_first issues the first group of weight loads
// (constants, so allowed before the grid dependency wait); compute does the rest: the slot's rows in passes, the K
// slices' reduction, the epilogue (act or y rows by pair). Ends with a barrier (shared memory is free again).
// `col_block` is a callable: the grid kernels pass one that reads blockIdx.x where needed, which keeps a register
// free (the 4-warp down kernel spilled with the block index held across the K loop).
template <typename T>
struct SmallItem {
  const char* w_lo = nullptr;  // this lane's weights (bytes) of rows g and g + 8 of its row tile, chunk 0
  const char* w_hi = nullptr;
  const float* scale_row = nullptr;  // FP8: the scales of the row tile's 128-row block, one a 128-wide K block
  // INT4: the group scales and packed zero points (null: symmetric) of rows g and g + 8, and the chunks a group.
  // FP4: the group scales of rows g and g + 8, and the group size.
  const float* scale_lo = nullptr;
  const float* scale_hi = nullptr;
  const int32_t* zeros_lo = nullptr;
  const int32_t* zeros_hi = nullptr;
  int chunks_per_group = 1;
  int fp4_group_size = 16;
  int num_chunks = 0;
  typename T::WeightChunk a_lo[T::kUnroll], a_hi[T::kUnroll];
  float a_scale[T::kUnroll];     // FP8: each chunk's block scale; INT4, FP4: row g's group scale (unused otherwise)
  float a_scale_hi[T::kUnroll];  // INT4, FP4: row g + 8's group scale (unused otherwise)
  uint32_t a_zero[T::kUnroll];   // INT4: the zero points of rows g (low half) and g + 8 (high half)

  // This warp's chunks c, c + kKSplit, ... of one group, whose loads are in flight together; chunks past the end
  // load zeros (their MMAs add nothing), so the tail costs one round trip, not one a chunk.
  __device__ __forceinline__ void load_weights(int c) {
#pragma unroll
    for (int u = 0; u < T::kUnroll; ++u) {
      const int chunk = c + u * T::kKSplit;
      const bool in = chunk < num_chunks;
      const int64_t at = T::bytes_of(static_cast<int64_t>(chunk) * 32);
      if constexpr (T::kFp8) {
        a_lo[u] = in ? ld_stream_8(w_lo + at) : make_uint2(0u, 0u);
        a_hi[u] = in ? ld_stream_8(w_hi + at) : make_uint2(0u, 0u);
        a_scale[u] = in ? __ldg(scale_row + chunk / 4) : 0.0f;  // 4 chunks a 128-wide block
      } else if constexpr (T::kInt4) {
        // Past the end: zero scales (and zero activations) make the chunk's products vanish.
        const int group = in ? chunk / chunks_per_group : 0;
        a_lo[u] = in ? ld_stream_4(w_lo + at) : 0u;
        a_hi[u] = in ? ld_stream_4(w_hi + at) : 0u;
        a_scale[u] = in ? __ldg(scale_lo + group) : 0.0f;
        a_scale_hi[u] = in ? __ldg(scale_hi + group) : 0.0f;
        a_zero[u] = int4::zero_of_group(zeros_lo, group) | (int4::zero_of_group(zeros_hi, group) << 16);
      } else if constexpr (T::kFp4) {
        // The group of this lane's word: inputs 32 chunk + 8 t .. + 7.
        const int group = in ? (chunk * 32 + 8 * static_cast<int>(threadIdx.x & 3)) / fp4_group_size : 0;
        a_lo[u] = in ? ld_stream_4(w_lo + at) : 0u;
        a_hi[u] = in ? ld_stream_4(w_hi + at) : 0u;
        a_scale[u] = in ? __ldg(scale_lo + group) : 0.0f;
        a_scale_hi[u] = in ? __ldg(scale_hi + group) : 0.0f;
      } else {
        a_lo[u] = in ? ld_stream_16(w_lo + at) : make_uint4(0u, 0u, 0u, 0u);
        a_hi[u] = in ? ld_stream_16(w_hi + at) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }

  // Chunk u's weights as the bf16 words of the 16-byte layout (FP8: widened, exact; INT4: q - z, exact).
  __device__ __forceinline__ void weight_words(int u, uint4& lo, uint4& hi) const {
    if constexpr (T::kFp8) {
      e4m3x4_to_bf16x2(a_lo[u].x, lo.x, lo.y);
      e4m3x4_to_bf16x2(a_lo[u].y, lo.z, lo.w);
      e4m3x4_to_bf16x2(a_hi[u].x, hi.x, hi.y);
      e4m3x4_to_bf16x2(a_hi[u].y, hi.z, hi.w);
    } else if constexpr (T::kInt4) {
      uint32_t pl[4], ph[4];
      int4::unpack8(a_lo[u], int4::zero_pair(a_zero[u] & 0xffffu), pl);
      int4::unpack8(a_hi[u], int4::zero_pair(a_zero[u] >> 16), ph);
      lo = make_uint4(pl[0], pl[1], pl[2], pl[3]);
      hi = make_uint4(ph[0], ph[1], ph[2], ph[3]);
    } else if constexpr (T::kFp4) {  // e2m1(q) * s, rounded to bf16 (the MMAs then run as for bf16 weights)
      uint32_t pl[4], ph[4];
      int4::unpack8_e2m1(a_lo[u], pl);
      int4::unpack8_e2m1(a_hi[u], ph);
      int4::scale4(pl, int4::scale_pair(a_scale[u]));
      int4::scale4(ph, int4::scale_pair(a_scale_hi[u]));
      lo = make_uint4(pl[0], pl[1], pl[2], pl[3]);
      hi = make_uint4(ph[0], ph[1], ph[2], ph[3]);
    } else {
      lo = a_lo[u];
      hi = a_hi[u];
    }
  }

  template <typename ColBlock>
  __device__ __forceinline__ void load_first(const MoeKernelParams& kp, int e, ColBlock col_block) {
    const MoeParams& p = kp.p;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int h = warp & 1, ks = warp >> 1;
    const int k_dim = T::kGateUp ? p.hidden : p.inter;
    // The row tile's first row inside expert e's matrix, and the matrix's rows.
    const int tile_row = T::kGateUp ? h * p.inter + col_block() * T::kOutCols : col_block() * T::kOutCols + h * 16;
    const int64_t m_rows = T::kGateUp ? 2 * static_cast<int64_t>(p.inter) : p.hidden;
    const int64_t w_row = static_cast<int64_t>(e) * m_rows + tile_row;
    const char* const base = static_cast<const char*>(T::kGateUp ? p.w_gate_up : p.w_down);
    w_lo = base + T::bytes_of((w_row + g) * k_dim + 8 * t);
    w_hi = w_lo + T::bytes_of(8 * static_cast<int64_t>(k_dim));
    if constexpr (T::kFp8) {
      const int64_t k_blocks = k_dim / 128, row_blocks = m_rows / 128;
      scale_row = (T::kGateUp ? p.w_gate_up_scale : p.w_down_scale) + (e * row_blocks + tile_row / 128) * k_blocks;
    }
    if constexpr (T::kInt4) {
      const int64_t group_size = T::kGateUp ? p.group_size : p.down_group_size;
      const int64_t groups = k_dim / group_size, zero_words = (groups + 7) / 8;
      scale_lo = (T::kGateUp ? p.w_gate_up_scale : p.w_down_scale) + (w_row + g) * groups;
      scale_hi = scale_lo + 8 * groups;
      const int32_t* const zeros = T::kGateUp ? p.w_gate_up_zeros : p.w_down_zeros;
      zeros_lo = zeros != nullptr ? zeros + (w_row + g) * zero_words : nullptr;
      zeros_hi = zeros != nullptr ? zeros_lo + 8 * zero_words : nullptr;
      chunks_per_group = static_cast<int>(group_size / 32);
    }
    if constexpr (T::kFp4) {
      const int64_t group_size = T::kGateUp ? p.group_size : p.down_group_size;
      const int64_t groups = k_dim / group_size;
      scale_lo = (T::kGateUp ? p.w_gate_up_scale : p.w_down_scale) + (w_row + g) * groups;
      scale_hi = scale_lo + 8 * groups;
      fp4_group_size = static_cast<int>(group_size);
    }
    num_chunks = k_dim / 32;
    load_weights(ks);
  }

  // The pairs of the slot's rows p0 .. p0 + kRowsPerPass into sm.pair_s (-1 past its count); a barrier must come
  // before they are read.
  __device__ __forceinline__ void load_pairs(const MoeKernelParams& kp, SmallSharedOf<T>& sm, const SlotWork& work,
                                             int p0) {
    const int tid = threadIdx.x;
    if (tid < T::kRowsPerPass) {
      const int n = p0 + tid;
      sm.pair_s[tid] = n >= work.count      ? -1
                       : work.shared >= 0 ? n * kp.p.top_k + (kp.p.top_k - kp.shared_slots) + work.shared
                                          : __ldcg(&kp.row_pair[work.row0 + n]);
    }
  }

  // The caller has run load_pairs(..., 0) (the down kernel before its wait, where it may), so each pass's pairs load
  // at the end of the pass before it.
  template <typename ColBlock>
  __device__ __forceinline__ void compute(const MoeKernelParams& kp, SmallSharedOf<T>& sm, const SlotWork& work,
                                          ColBlock col_block) {
    const MoeParams& p = kp.p;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int h = warp & 1, ks = warp >> 1;
    bool weights_loaded = true;  // the first group of the first pass
    for (int p0 = 0; p0 < work.count; p0 += T::kRowsPerPass) {
      __syncthreads();
      const uint16_t* src[T::kTokenTiles];
#pragma unroll
      for (int nt = 0; nt < T::kTokenTiles; ++nt) {
        const int pair = sm.pair_s[8 * nt + g];
        if (pair < 0) {
          src[nt] = nullptr;
        } else if constexpr (T::kGateUp) {
          src[nt] = p.x + static_cast<int64_t>(pair / p.top_k) * p.hidden + 8 * t;
        } else {
          src[nt] = kp.act + static_cast<int64_t>(pair) * p.inter + 8 * t;
        }
      }
      float acc[T::kTokenTiles][4];
#pragma unroll
      for (int nt = 0; nt < T::kTokenTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

      for (int c = ks; c < num_chunks; c += T::kKSplit * T::kUnroll) {
        if (!weights_loaded) load_weights(c);
        weights_loaded = false;
        uint4 b[T::kUnroll][T::kTokenTiles];
#pragma unroll
        for (int u = 0; u < T::kUnroll; ++u) {
          const bool in = c + u * T::kKSplit < num_chunks;
#pragma unroll
          for (int nt = 0; nt < T::kTokenTiles; ++nt) {
            b[u][nt] = in && src[nt] != nullptr ? ld_cg_16(src[nt] + (c + u * T::kKSplit) * 32)
                                                : make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int u = 0; u < T::kUnroll; ++u) {
          uint4 lo, hi;
          weight_words(u, lo, hi);
#pragma unroll
          for (int nt = 0; nt < T::kTokenTiles; ++nt) {
            if constexpr (T::kFp8) {  // the chunk's partial sum, then times its block's scale
              float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_bf16_16816(part, lo.x, hi.x, lo.y, hi.y, b[u][nt].x, b[u][nt].y);
              mma_bf16_16816(part, lo.z, hi.z, lo.w, hi.w, b[u][nt].z, b[u][nt].w);
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[nt][i] = fmaf(a_scale[u], part[i], acc[nt][i]);
            } else if constexpr (T::kInt4) {  // the partial sum, then each row times its own group scale
              float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_bf16_16816(part, lo.x, hi.x, lo.y, hi.y, b[u][nt].x, b[u][nt].y);
              mma_bf16_16816(part, lo.z, hi.z, lo.w, hi.w, b[u][nt].z, b[u][nt].w);
              acc[nt][0] = fmaf(a_scale[u], part[0], acc[nt][0]);  // row g
              acc[nt][1] = fmaf(a_scale[u], part[1], acc[nt][1]);
              acc[nt][2] = fmaf(a_scale_hi[u], part[2], acc[nt][2]);  // row g + 8
              acc[nt][3] = fmaf(a_scale_hi[u], part[3], acc[nt][3]);
            } else {
              mma_bf16_16816(acc[nt], lo.x, hi.x, lo.y, hi.y, b[u][nt].x, b[u][nt].y);
              mma_bf16_16816(acc[nt], lo.z, hi.z, lo.w, hi.w, b[u][nt].z, b[u][nt].w);
            }
          }
        }
      }
      // Accumulator (row g / g + 8 of the row tile, rows 2t, 2t + 1 of the token tile) -> red[ks][h][feature][row].
#pragma unroll
      for (int nt = 0; nt < T::kTokenTiles; ++nt) {
        sm.red[ks][h][g][8 * nt + 2 * t] = acc[nt][0];
        sm.red[ks][h][g][8 * nt + 2 * t + 1] = acc[nt][1];
        sm.red[ks][h][g + 8][8 * nt + 2 * t] = acc[nt][2];
        sm.red[ks][h][g + 8][8 * nt + 2 * t + 1] = acc[nt][3];
      }
      __syncthreads();
      if constexpr (T::kGateUp) {
        // 16 act columns (8 pairs) x kRowsPerPass rows.
        for (int idx = tid; idx < T::kRowsPerPass * 8; idx += T::kThreads) {
          const int n = idx / 8, col = (idx % 8) * 2;
          const int pair = sm.pair_s[n];
          if (pair < 0) continue;
          float gate0 = 0.0f, gate1 = 0.0f, up0 = 0.0f, up1 = 0.0f;
#pragma unroll
          for (int s = 0; s < T::kKSplit; ++s) {
            gate0 += sm.red[s][0][col][n];
            gate1 += sm.red[s][0][col + 1][n];
            up0 += sm.red[s][1][col][n];
            up1 += sm.red[s][1][col + 1][n];
          }
          uint16_t* const out = kp.act + static_cast<int64_t>(pair) * p.inter + col_block() * T::kOutCols + col;
          *reinterpret_cast<uint32_t*>(out) = pack_bf16x2(silu(gate0) * up0, silu(gate1) * up1);
        }
      } else {
        // 32 output columns (16 pairs) x kRowsPerPass rows.
        for (int idx = tid; idx < T::kRowsPerPass * 16; idx += T::kThreads) {
          const int n = idx / 16, col = (idx % 16) * 2;
          const int pair = sm.pair_s[n];
          if (pair < 0) continue;
          const int tile = col / 16, f = col % 16;
          float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
          for (int s = 0; s < T::kKSplit; ++s) {
            v0 += sm.red[s][tile][f][n];
            v1 += sm.red[s][tile][f + 1][n];
          }
          uint16_t* const out = kp.y + static_cast<int64_t>(pair) * p.hidden + col_block() * T::kOutCols + col;
          *reinterpret_cast<uint32_t*>(out) = pack_bf16x2(v0, v1);
        }
      }
      __syncthreads();  // pair_s and red are reused by the next pass
      if (p0 + T::kRowsPerPass < work.count) load_pairs(kp, sm, work, p0 + T::kRowsPerPass);
    }
  }
};

// After a down item: the last of the column block's num_active items combines the block (combine_columns).
template <typename T>
__device__ __forceinline__ void combine_if_last(const MoeKernelParams& kp, SmallSharedOf<T>& sm, int col_block,
                                                int num_active) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sm.flag = atomicAdd(&kp.col_done[col_block], 1) == num_active - 1;
  __syncthreads();
  if (!sm.flag) return;
  __threadfence();
  combine_columns<T>(kp, col_block * T::kOutCols);
  if (threadIdx.x == 0) kp.col_done[col_block] = 0;
}

template <typename T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    moe_small_gemm_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ SmallSharedOf<T> sm;
  const MoeParams& p = kp.p;
  // Two exceptions to ptx.cuh's rule that nothing global is read before griddep_wait, both on one fact of a chain of
  // programmatic dependent launches: a grid starts only once every CTA of its predecessor has passed its own wait,
  // so every kernel before the predecessor has completed and its memory is visible.
  //  - gate/up, shared slots (kp.shared_prewait): the predecessor is a routing kernel of the same moe_forward (route,
  //    scatter, or router and route in one), so x, an input of the call and written before it, is complete. These
  //    CTAs know their expert and pairs without the routing, so they run whole before the wait, while the routing
  //    runs; they write only their own pairs' act rows, which no kernel reads before the down kernel.
  //  - down: the predecessor is the gate/up kernel, so the routing kernel, which wrote slot_info
  //    and row_pair, has completed. The slot record, the first pass's row pairs, and the first weights (constant)
  //    are loaded before the wait, while gate/up finishes; act, gate/up's output, is read after it.
  const bool shared_early = T::kGateUp && static_cast<int>(blockIdx.y) < kp.shared_prewait * kp.shared_slots;
  const bool read_slot_early = shared_early || !T::kGateUp;
  if (!read_slot_early) {
    griddep_wait();
    griddep_launch_dependents();
  }
  const SlotWork work = slot_work(kp, static_cast<int>(blockIdx.y), shared_early);
  const int e = work.expert;
  const auto col_block = [] { return static_cast<int>(blockIdx.x); };
  SmallItem<T> item;
  if (e >= 0) item.load_first(kp, e, col_block);
  // The down kernel's first pairs before the wait (row_pair, like slot_info, is the routing's); gate/up's after it.
  if (!T::kGateUp && read_slot_early) item.load_pairs(kp, sm, work, 0);
  if (read_slot_early && !shared_early) {
    griddep_wait();
    griddep_launch_dependents();
  }
  if (e < 0) {
    // Slot 0 without an expert: no pair has a row (under a shard, every token's experts are held elsewhere), so no
    // down CTA counts itself done; slot 0's write the combine of their columns, out = add (or zeros).
    if constexpr (!T::kGateUp) {
      if (kp.fused_combine && blockIdx.y == 0) combine_columns<T>(kp, static_cast<int>(blockIdx.x) * T::kOutCols);
    }
    return;
  }
  if constexpr (T::kGateUp) {
    if (kp.down_prefetch) {  // this CTA's share of W_down[e] into L2, for the down kernel that follows
      const int64_t bytes = T::bytes_of(static_cast<int64_t>(p.hidden) * p.inter);
      const char* base = static_cast<const char*>(p.w_down) + static_cast<int64_t>(e) * bytes;
      const int64_t per_cta = (bytes / gridDim.x + 127) / 128 * 128;
      const int64_t begin = blockIdx.x * per_cta, end = min(bytes, begin + per_cta);
      for (int64_t at = begin + threadIdx.x * 128; at < end; at += T::kThreads * 128) prefetch_l2_evict_last(base + at);
    }
  }
  if (T::kGateUp || !read_slot_early) item.load_pairs(kp, sm, work, 0);
  item.compute(kp, sm, work, col_block);
  if constexpr (!T::kGateUp) {
    // The active count read again here (work.num_active, the same record), not held in a register across the K loop:
    // the 4-warp kernel spilled 12 bytes with it.
    if (kp.fused_combine) {
      combine_if_last<T>(kp, sm, static_cast<int>(blockIdx.x), __ldcg(&kp.slot_info[blockIdx.y]).w);
    }
  }
  if (shared_early) {  // no CTA leaves before its wait (ptx.cuh)
    griddep_wait();
    griddep_launch_dependents();
  }
}

// Grid (output column blocks, max_active experts); experts past the active count exit at once.
template <typename T>
dim3 small_gemm_grid(const MoeKernelParams& kp) {
  const int out_cols = T::kGateUp ? kp.p.inter : kp.p.hidden;
  return dim3(out_cols / T::kOutCols, kp.max_active);
}

template <typename T>
void launch_small_gemm(const MoeKernelParams& kp, LaunchStream stream) {
  launch_pdl(moe_small_gemm_kernel<T>, {.grid = small_gemm_grid<T>(kp), .block = dim3(T::kThreads)}, stream, kp);
}

// 8-warp CTAs, unless the CTAs that stream after the grid dependency wait need more than one wave of them and fit in
// one wave of 4-warp CTAs (same tiles, half the warps along K, twice the CTAs resident). The shared slots of a gate/up
// grid that runs them before the wait (kp.shared_prewait) do not count: they stream while the routing runs and have
// left their SMs by the time the other CTAs may start (V2-Lite at batch 1: 6 x 88 routed CTAs, one wave of 8-warp
// CTAs, twice the loads in flight of the 4-warp ones).
template <GemmKind kKind, int kTokenTiles, MoeWeightFormat kFormat>
void launch_small_gemm_in_fewest_waves(const MoeKernelParams& kp, LaunchStream stream) {
  using Wide = SmallTraits<kKind, kTokenTiles, 4, kFormat>;
  using Narrow = SmallTraits<kKind, kTokenTiles, 2, kFormat>;
  const dim3 grid = small_gemm_grid<Wide>(kp);
  const bool shared_early = kKind == GemmKind::kGateUp && kp.shared_prewait != 0;
  const int64_t late_slots = int64_t{grid.y} - (shared_early ? kp.shared_slots : 0);
  const int64_t ctas = int64_t{grid.x} * late_slots;
  if (ctas > int64_t{Wide::kMinBlocks} * kp.p.num_sms && ctas <= int64_t{Narrow::kMinBlocks} * kp.p.num_sms) {
    launch_small_gemm<Narrow>(kp, stream);
  } else {
    launch_small_gemm<Wide>(kp, stream);
  }
}

// One token tile a pass or four, by the experts' average rows (moe_small_tiles.h).
template <GemmKind kKind, MoeWeightFormat kFormat>
void launch_small_gemm_for_tokens(const MoeKernelParams& kp, LaunchStream stream) {
  const MoeParams& p = kp.p;
  if (moe_small_token_tiles(p.num_tokens, p.top_k - p.num_shared_experts, num_routed_experts(p), kFormat) == 1) {
    launch_small_gemm_in_fewest_waves<kKind, 1, kFormat>(kp, stream);
  } else {
    launch_small_gemm<SmallTraits<kKind, 4, 4, kFormat>>(kp, stream);
  }
}

// bf16 or FP8 weights; INT4 and FP4 ones have instantiations of their own (launch_small_int4_*, launch_small_fp4_*).
template <GemmKind kKind>
void launch_small_gemm_for_format(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kFp8) {
    launch_small_gemm_for_tokens<kKind, MoeWeightFormat::kFp8>(kp, stream);
  } else {
    launch_small_gemm_for_tokens<kKind, MoeWeightFormat::kBf16>(kp, stream);
  }
}

}  // namespace deepinfer::cuda::moe_detail
