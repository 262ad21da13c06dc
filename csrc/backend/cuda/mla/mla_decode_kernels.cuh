// Device code of the MLA decode kernels; included only by instantiations/mla_decode_*.cu.
//
// One CTA = one sequence x one block of heads x one split (a range of 64-token tiles). Tiles of the paged cache
// stream into shared memory through cp.async, several stages deep; every tile is shared by all heads of the block
// (MLA is an MQA over a 576-wide latent). Both products run on the tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 accumulate) with the heads as the M dimension:
//   S[heads, 64] = Q[heads, 576] · K^T        (K = the tile's 576-wide rows)
//   O[heads, 512] = O * alpha + P[heads, 64] · V   (V = the first 512 columns of the same rows)
// with an online softmax in the log2 domain. A tile's rows are 72 chunks of 16 bytes, stored as 9 column blocks of
// 64 dims with chunk c of row r at chunk c ^ (r & 7) (see tile_offset), so the 8 rows an ldmatrix reads fall in 8
// distinct bank groups.
//
// Narrow kernel (16 heads): the queries live in registers. QK: warp w takes k-half w / 4 (288 of the 576 dims)
// and tokens 16 * (w % 4) .. +16; the two k-halves are summed through shared memory. PV: warp w owns output
// columns 64 w .. +64 for all 16 heads. Three stages of 72 KB. Over the FP8 cache the same kernel runs with another
// QK step (mla_decode_fp8_kernel.cuh): its stages hold the FP8 rows (mla_decode_fp8_stage.cuh), and QK widens them.
// Wide kernel (64 heads): the queries live in shared memory. QK: warp w takes heads 16 * (w % 4) .. +16 and tokens
// 32 * (w / 4) .. +32. PV: warp w owns columns 64 w .. +64 for all 64 heads (128 fp32 accumulators a thread).
// Two stages. mla_decode_wgmma.cuh has the same wide kernel on warpgroup MMA (the default for 64-head blocks).
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/mla/mla_decode_fp8_stage.cuh"
#include "backend/cuda/mla/mla_decode_internal.h"
#include "backend/cuda/mla/mla_decode_params.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda::mla_detail {

using namespace ::deepinfer::cuda::ptx;  // NOLINT: the shared PTX wrappers

template <int kHeadsPerCta, int kNumStages>
struct MlaDecodeTraits {
  static constexpr bool kFp8Cache = false;                   // rows of p.cache (bf16) in tile_offset's layout
  static constexpr int kHeads = kHeadsPerCta;
  static constexpr int kStages = kNumStages;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowTiles = kHeads / 16;               // m16 tiles of heads
  static constexpr int kRowBytes = kHeadDim * 2;              // 1152
  static constexpr int kChunks = kRowBytes / 16;              // 72 chunks of 16 bytes a row
  static constexpr int kTileBytes = kBlockN * kRowBytes;      // 73,728
  static constexpr int kColsPerWarp = kValueDim / kWarps;     // PV: output columns a warp owns
  static constexpr int kPRowBytes = kBlockN * 2;              // one row of P (bf16)

  static_assert(kHeadDim == 576 && kValueDim == 512, "DeepSeek MLA: 512 latent + 64 rope dims");
  static_assert(kHeads % 16 == 0, "heads come in m16 tiles");
  static_assert(kChunks % 8 == 0, "the XOR swizzle permutes groups of 8 chunks");
  static_assert(kThreads == kBlockN * 4 && kChunks % 4 == 0, "4 threads copy each row of a tile");
  static_assert(kColsPerWarp == 64, "PV: each warp owns 8 n8 tiles of output columns");
  static_assert(kBlockN == 64 && kPRowBytes == 128, "P rows are 8 chunks: the swizzle covers them exactly");
  static_assert(kStages >= 2, "at least double buffering");
};

using NarrowTraits = MlaDecodeTraits<kNarrowHeads, 3>;
using WideTraits = MlaDecodeTraits<kWideHeads, 2>;

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers (the shared ones, ldmatrix among them, are in ptx.cuh)

// D[16x8] += A[16x16] · B[16x8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Barrier 1 among the first `kCount` threads (barrier 0 is __syncthreads).
template <int kCount>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kCount) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column index
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Byte offset of 16-byte chunk `chunk` (of 72) of row `row` (of 64) in a tile: 9 column blocks of 64 rows x 128
// bytes (8 KB each); inside a block, chunk c of row r sits at chunk c ^ (r & 7). This is the 128-byte swizzle that
// wgmma descriptors read (8-row atoms of 1 KB), and it keeps ldmatrix free of bank conflicts.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * (kBlockN * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
// The same for the [heads, 64] bf16 P tile (128-byte rows).
__device__ __forceinline__ uint32_t p_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * (kBlockN * 2) + ((chunk ^ (row & 7)) << 4));
}

// ---------------------------------------------------------------------------------------------------------------
// Work split and tile loads

struct TileRange {
  int begin = 0;  // first tile (of kBlockN tokens) of this split
  int end = 0;    // one past the last
};

__device__ __forceinline__ TileRange split_tiles(int context_len, int split, int num_splits) {
  const int num_tiles = (max(context_len, 0) + kBlockN - 1) / kBlockN;
  const int per_split = (num_tiles + num_splits - 1) / num_splits;
  const int begin = split * per_split;
  return {begin, min(begin + per_split, num_tiles)};
}

// The token whose cache row this thread copies in tile `tile` (4 threads a row).
__device__ __forceinline__ int tile_token(int tile) { return tile * kBlockN + static_cast<int>(threadIdx.x >> 2); }

// Tile `tile` of a sequence (tokens tile * 64 ..) into the stage at `dst`: the rows of tokens in [tokens_from,
// tokens_to), in the traits' cache format (bf16 rows into tile_offset's swizzle, FP8 rows into Fp8Stage's regions).
// Rows past the context are zero-filled (their pages are never looked up: unused page-table slots may hold anything;
// an FP8 row of zeros has zero scales, so it widens to zeros, never to NaN). known_page >= 0: the thread's row's page,
// looked up already.
template <typename T>
__device__ __forceinline__ void load_kv_tile(uint32_t dst, const MlaDecodeParams& p, const int32_t* pages,
                                             int tile, int context_len, int tokens_from = 0,
                                             int tokens_to = INT_MAX, int32_t known_page = -1) {
  const int row = threadIdx.x >> 2, sub = threadIdx.x & 3;
  const int token = tile_token(tile);
  if (token < tokens_from || token >= tokens_to) return;
  const bool valid = token < context_len;
  if constexpr (T::kFp8Cache) {
    const uint8_t* src = p.cache_fp8;
    if (valid) {
      const int64_t page = known_page >= 0 ? known_page : pages[token / p.page_size];
      src += (page * p.page_size + token % p.page_size) * Fp8Stage::kRowBytes;
    }
    const uint32_t src_bytes = valid ? 16u : 0u;
#pragma unroll
    for (int k = 0; k < (Fp8Stage::kRowChunks + 3) / 4; ++k) {
      const int chunk = sub + 4 * k;
      if (chunk < Fp8Stage::kRowChunks) {
        cp_async_16(dst + fp8_row_chunk_offset(row, chunk), src + chunk * 16, src_bytes);
      }
    }
  } else {
    const uint16_t* src = p.cache;
    if (valid) {
      const int64_t page = known_page >= 0 ? known_page : pages[token / p.page_size];
      src += (page * p.page_size + token % p.page_size) * kHeadDim;
    }
    const uint32_t src_bytes = valid ? 16u : 0u;
#pragma unroll
    for (int k = 0; k < T::kChunks / 4; ++k) {
      const int chunk = sub + 4 * k;
      cp_async_16(dst + tile_offset(row, chunk), src + chunk * 8, src_bytes);
    }
  }
}

inline constexpr int kMaxFirstTiles = 2;  // kStages - 1 of the deepest pipeline

// A CTA's sequence and split, read at its start.
struct CtaKv {
  int context_len = 0;
  TileRange range;
  const int32_t* pages = nullptr;  // the sequence's page-table row
  int settled = 0;                 // rows [0, settled) were copied before griddep_wait
  // With an early start, the page of this thread's row in each first tile when that row is fresh (-1 otherwise),
  // looked up before the wait: the page table is a step input, so after the wait only the row's bytes are left.
  int32_t fresh_page[kMaxFirstTiles] = {-1, -1};
};
static_assert(kMaxFirstTiles == 2, "CtaKv::fresh_page's initializer sets every first tile to -1");

// The start of a decode CTA, up to and including griddep_wait. With p.fresh_rows >= 0 the metadata and every row but
// the sequence's last fresh_rows were complete before the previous kernel (the step's input upload, earlier steps,
// earlier kernels), so the CTA reads them, and starts the copies of those rows of its first kStages - 1 tiles, while
// the previous kernel still runs; the rest waits. Those copies stay uncommitted: finish_first_tiles puts them in the
// first commit group.
template <typename T>
__device__ __forceinline__ CtaKv start_cta(const MlaDecodeParams& p, int b, int split, uint32_t kv_base) {
  const bool early = p.fresh_rows >= 0;
  if (!early) griddep_wait();  // q and the cache come from earlier kernels; the trigger is allow_dependent_launch()
  CtaKv kv;
  kv.context_len = p.context_lens[b];
  kv.range = split_tiles(kv.context_len, split, p.num_splits);
  kv.pages = p.page_table + static_cast<int64_t>(b) * p.max_pages_per_seq;
  if (early) {
    static_assert(T::kStages - 1 <= kMaxFirstTiles, "CtaKv::fresh_page holds every first tile");
    kv.settled = max(kv.context_len - p.fresh_rows, 0);
#pragma unroll
    for (int st = 0; st < T::kStages - 1; ++st) {
      if (kv.range.begin + st < kv.range.end) {
        load_kv_tile<T>(kv_base + st * T::kTileBytes, p, kv.pages, kv.range.begin + st, kv.context_len, 0,
                        kv.settled);
        const int token = tile_token(kv.range.begin + st);
        if (token >= kv.settled && token < kv.context_len) kv.fresh_page[st] = kv.pages[token / p.page_size];
      }
    }
    griddep_wait();  // q and the fresh rows come from the previous kernels
  }
  return kv;
}

// The first kStages - 1 tiles' remaining rows (all of them without an early start), one commit group a stage; the
// first group also holds the early copies and whatever the caller issued since start_cta (the wide kernels' q).
template <typename T>
__device__ __forceinline__ void finish_first_tiles(uint32_t kv_base, const MlaDecodeParams& p, const CtaKv& kv) {
#pragma unroll
  for (int st = 0; st < T::kStages - 1; ++st) {
    if (kv.range.begin + st < kv.range.end) {
      load_kv_tile<T>(kv_base + st * T::kTileBytes, p, kv.pages, kv.range.begin + st, kv.context_len, kv.settled,
                      INT_MAX, kv.fresh_page[st]);
    }
    cp_async_commit();
  }
}

// The wide kernels' queries: 64 rows of 576 into the swizzled layout at q_base, four threads a row. Not committed:
// they travel in the first tile's commit group (finish_first_tiles).
template <typename T>
__device__ __forceinline__ void queue_queries(uint32_t q_base, const MlaDecodeParams& p, int b, int h0) {
  static_assert(T::kHeads * 4 == kThreads, "four threads a query row");
  const int row = threadIdx.x >> 2, sub = threadIdx.x & 3;
  const uint16_t* src = p.q + (static_cast<int64_t>(b) * p.num_heads + h0 + row) * kHeadDim;
#pragma unroll
  for (int k = 0; k < T::kChunks / 4; ++k) {
    const int chunk = sub + 4 * k;
    cp_async_16(q_base + tile_offset(row, chunk), src + chunk * 8, 16u);
  }
}

// The main loop's copy for iteration i, once tile i's copy is waited for: tile i + kStages - 1 into the stage that
// tile i - 1 used (an empty commit group past the last tile keeps cp_async_wait's count right).
template <typename T>
__device__ __forceinline__ void queue_next_tile(uint32_t kv_base, const MlaDecodeParams& p, const int32_t* pages,
                                                const TileRange& range, int i, int stage, int context_len) {
  const int next = i + T::kStages - 1;
  if (next < range.end - range.begin) {
    const int next_stage = (stage + T::kStages - 1) % T::kStages;
    load_kv_tile<T>(kv_base + next_stage * T::kTileBytes, p, pages, range.begin + next, context_len);
  }
  cp_async_commit();
}

// Lets the next kernel (the split-combine, or the next op's) start its launch while this grid finishes. Called once
// the main loop is done (ptx.cuh's rule allows any point after griddep_wait): the next grid's CTAs, resident while
// they wait, then share the SMs with this grid's only during its epilogue.
__device__ __forceinline__ void allow_dependent_launch() {
  griddep_launch_dependents();
}

// ---------------------------------------------------------------------------------------------------------------
// Epilogues

// A split with no tiles: log-sum-exp -inf (the combine skips it), or a zero output when it is the only split
// (context length 0).
template <typename T>
__device__ void store_empty(const MlaDecodeParams& p, int b, int h0, int split) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  const int64_t row0 = static_cast<int64_t>(b) * p.num_heads + h0;
  if (p.num_splits == 1) {
    uint32_t* out = reinterpret_cast<uint32_t*>(p.out + row0 * kValueDim);
    for (int i = threadIdx.x; i < T::kHeads * kValueDim / 2; i += kThreads) out[i] = 0u;
  } else if (threadIdx.x < T::kHeads) {
    float* lse = static_cast<float*>(p.workspace) + static_cast<int64_t>(p.num_splits) * rows * kValueDim;
    lse[split * rows + row0 + threadIdx.x] = -INFINITY;
  }
}

// Columns 2t, 2t + 1 of an n8 tile of the output from lane t's accumulator pair (v0, v1): the pair itself, or, when V
// was stored with the columns of each group of four in the FP8 QK step's order 0 2 1 3 (kWidenOrder:
// mla_decode_fp8_kernel.cuh), the pair holds columns (4k, 4k + 2) (t even) or (4k + 1, 4k + 3) (t odd) of group k,
// and one exchange with lane t ^ 1 gives each lane its two adjacent columns.
template <bool kWidenOrder>
__device__ __forceinline__ float2 output_column_pair(float v0, float v1, int t) {
  if constexpr (!kWidenOrder) {
    return make_float2(v0, v1);
  } else {
    const bool odd = (t & 1) != 0;
    const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 1);
    return odd ? make_float2(other, v1) : make_float2(v0, other);
  }
}

// Writes this warp's accumulators: rows rt * 16 + g (+ 8), columns 64 * warp + 8 * nt + 2 t (+ 1), divided by the
// row sums; with splits, an fp32 partial plus the row's log2-sum-exp. kWidenOrder: as output_column_pair's.
template <typename T, bool kWidenOrder = false>
__device__ void store_output(const MlaDecodeParams& p, int b, int h0, int split, const float (&acc)[T::kRowTiles][8][4],
                             const float* row_max, const float* row_sum) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  const int64_t row0 = static_cast<int64_t>(b) * p.num_heads + h0;
#pragma unroll
  for (int rt = 0; rt < T::kRowTiles; ++rt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = rt * 16 + g + 8 * half;
      const float l = row_sum[r];
      const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
      if (p.num_splits == 1) {
        uint16_t* out = p.out + (row0 + r) * kValueDim + warp * T::kColsPerWarp + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float2 v = output_column_pair<kWidenOrder>(acc[rt][nt][2 * half], acc[rt][nt][2 * half + 1], t);
          *reinterpret_cast<uint32_t*>(out + nt * 8) = pack_bf16x2(v.x * inv_l, v.y * inv_l);
        }
      } else {
        float* part = static_cast<float*>(p.workspace) + (split * rows + row0 + r) * kValueDim +
                      warp * T::kColsPerWarp + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float2 v = output_column_pair<kWidenOrder>(acc[rt][nt][2 * half], acc[rt][nt][2 * half + 1], t);
          *reinterpret_cast<float2*>(part + nt * 8) = make_float2(v.x * inv_l, v.y * inv_l);
        }
        if (warp == 0 && t == 0) {
          float* lse = static_cast<float*>(p.workspace) + static_cast<int64_t>(p.num_splits) * rows * kValueDim;
          lse[split * rows + row0 + r] = l > 0.0f ? row_max[r] + log2f(l) : -INFINITY;
        }
      }
    }
  }
}

// O = alpha * O + P · V for this warp's 64 columns: P [kHeads, 64] bf16 at p_tile, V = the tile's first 512 columns.
template <typename T>
__device__ __forceinline__ void accumulate_pv(float (&acc)[T::kRowTiles][8][4], uint32_t p_tile, uint32_t kv,
                                              const float* alpha) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
  for (int rt = 0; rt < T::kRowTiles; ++rt) {
    const float a_lo = alpha[rt * 16 + g], a_hi = alpha[rt * 16 + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[rt][nt][0] *= a_lo;
      acc[rt][nt][1] *= a_lo;
      acc[rt][nt][2] *= a_hi;
      acc[rt][nt][3] *= a_hi;
    }
  }
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    uint32_t pa[T::kRowTiles][4];
#pragma unroll
    for (int rt = 0; rt < T::kRowTiles; ++rt) {
      const int row = rt * 16 + (lane & 15);
      ldmatrix_x4(pa[rt], p_tile + p_offset(row, kk * 2 + (lane >> 4)));
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      // matrices: (tokens 0-7, cols 0-7), (tokens 8-15, cols 0-7), (tokens 0-7, cols 8-15), (tokens 8-15, cols 8-15)
      const int token = kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
      const int chunk = warp * (T::kColsPerWarp / 8) + np * 2 + (lane >> 4);
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, kv + tile_offset(token, chunk));
#pragma unroll
      for (int rt = 0; rt < T::kRowTiles; ++rt) {
        mma_bf16_16816(acc[rt][2 * np], pa[rt], vb[0], vb[1]);
        mma_bf16_16816(acc[rt][2 * np + 1], pa[rt], vb[2], vb[3]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Online softmax, shared by the three kernels

// A thread's share of one tile's scores: the m16n8 accumulator layout of rows r_lo and r_lo + 8 of S[rows, 64],
// columns (tokens) 8 (kNTiles part + nt) + 2 t (+ 1) in s[nt] (elements 0, 1: row r_lo; 2, 3: row r_lo + 8), where
// `part` (of kParts) names the warp's (or warpgroup's) slice of the tile's columns and t = lane % 4.
template <int kRows, int kParts, int kNTiles>
struct SoftmaxRows {
  static_assert(kParts * kNTiles * 8 == kBlockN, "the parts cover the tile's columns");
  int part, r_lo, t;
};

// One tile's online-softmax update in the log2 domain: masks the tokens at or past `valid` (and scales the rest by
// scale_log2), exchanges row maxima with the other parts through red_max ([kParts][kRows] fp32, `barrier` between
// the writes and the reads), writes P (bf16) to the swizzled P tile, updates the running maxima and this thread's
// share of the row sums, and returns the rescale factors of rows r_lo and r_lo + 8 (0 on the first tile).
template <int kRows, int kParts, int kNTiles, typename Barrier>
__device__ __forceinline__ float2 online_softmax_tile(const SoftmaxRows<kRows, kParts, kNTiles>& th,
                                                      float (&s)[kNTiles][4], int valid, float scale_log2,
                                                      float* red_max, uint8_t* p_tile, float (&m_run)[2],
                                                      float (&l_run)[2], Barrier&& barrier) {
  const int r_lo = th.r_lo, r_hi = th.r_lo + 8;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = (th.part * kNTiles + nt) * 8 + 2 * th.t + (e & 1);
      s[nt][e] = token < valid ? s[nt][e] * scale_log2 : -INFINITY;
    }
  }
  float mx_lo = fmaxf(s[0][0], s[0][1]), mx_hi = fmaxf(s[0][2], s[0][3]);
#pragma unroll
  for (int nt = 1; nt < kNTiles; ++nt) {
    mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
  }
  mx_lo = quad_max(mx_lo);
  mx_hi = quad_max(mx_hi);
  if (th.t == 0) {
    red_max[th.part * kRows + r_lo] = mx_lo;
    red_max[th.part * kRows + r_hi] = mx_hi;
  }
  barrier();
  float parts_lo = red_max[r_lo], parts_hi = red_max[r_hi];
#pragma unroll
  for (int j = 1; j < kParts; ++j) {
    parts_lo = fmaxf(parts_lo, red_max[j * kRows + r_lo]);
    parts_hi = fmaxf(parts_hi, red_max[j * kRows + r_hi]);
  }
  const float new_lo = fmaxf(m_run[0], parts_lo), new_hi = fmaxf(m_run[1], parts_hi);
  const float2 alpha = make_float2(exp2f(m_run[0] - new_lo), exp2f(m_run[1] - new_hi));  // 0 on the first tile
  m_run[0] = new_lo;
  m_run[1] = new_hi;
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const float p0 = exp2f(s[nt][0] - new_lo), p1 = exp2f(s[nt][1] - new_lo);
    const float p2 = exp2f(s[nt][2] - new_hi), p3 = exp2f(s[nt][3] - new_hi);
    sum_lo += p0 + p1;
    sum_hi += p2 + p3;
    const int chunk = th.part * kNTiles + nt;
    *reinterpret_cast<uint32_t*>(p_tile + p_offset(r_lo, chunk) + 4 * th.t) = pack_bf16x2(p0, p1);
    *reinterpret_cast<uint32_t*>(p_tile + p_offset(r_hi, chunk) + 4 * th.t) = pack_bf16x2(p2, p3);
  }
  l_run[0] = l_run[0] * alpha.x + sum_lo;
  l_run[1] = l_run[1] * alpha.y + sum_hi;
  return alpha;
}

// After the main loop: the row sums of this thread's rows, summed over its quad, into red_sum ([kParts][kRows]),
// and part 0's running maxima into row_max. The caller synchronizes before the sums are read.
template <int kRows, int kParts, int kNTiles>
__device__ __forceinline__ void publish_row_stats(const SoftmaxRows<kRows, kParts, kNTiles>& th,
                                                  const float (&m_run)[2], const float (&l_run)[2], float* red_sum,
                                                  float* row_max) {
  const float l_lo = quad_sum(l_run[0]), l_hi = quad_sum(l_run[1]);
  if (th.t == 0) {
    red_sum[th.part * kRows + th.r_lo] = l_lo;
    red_sum[th.part * kRows + th.r_lo + 8] = l_hi;
    if (th.part == 0) {
      row_max[th.r_lo] = m_run[0];
      row_max[th.r_lo + 8] = m_run[1];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Narrow kernel: 16 heads per CTA

// What a narrow kernel's QK step works on. Warp w computes S for the 16 heads and the 16 tokens 16 group .. over
// one k-half of the 576 dims (the four warps of a k-half cover the tile's 64 tokens); role.lane is its lane.
struct NarrowQkRole {
  int k_half, group, lane;
};
// A region of the kernel's shared memory, as a generic pointer (plain loads and stores) and as its shared-window
// address (cp.async, ldmatrix).
struct SmemRegion {
  uint8_t* ptr;
  uint32_t addr;
};

// The narrow kernel's QK step over one cache format, with the queries of its 16 heads held in registers (the A
// fragments of the warp's k-half). A QK type gives
//   kFp8Cache                 the cache format, which must be its traits' (the tile loads copy rows of it)
//   kSmemBytes                shared memory it needs beside the stages (its region, after them)
//   Queries                   the registers
//   load_queries(q, p, b, h0, role)
//   scores(s, q, stage, region, role)   S of the warp's heads and tokens over its k-half from the tile in `stage`;
//                             returns the address of the tile whose first 512 columns PV reads as V (tile_offset's
//                             layout): the stage itself, or one the step widened into its region.
//   kVInWidenOrder            V's columns in each group of four are stored 0 2 1 3 (store_output puts them back)
// This one reads the bf16 tile: both products read the stage (ldmatrix), and the k-halves are dims 288 k_half ...
struct NarrowBf16Qk {
  static constexpr bool kFp8Cache = false;
  static constexpr bool kVInWidenOrder = false;
  static constexpr int kSmemBytes = 0;
  static constexpr int kKSteps = kHeadDim / 2 / 16;  // 18 k16 steps per k-half
  static constexpr int kChunksPerHalf = NarrowTraits::kChunks / 2;  // 36 chunks of 16 bytes
  struct Queries {
    uint32_t a[kKSteps][4];  // A fragments of Q[16 heads, this k-half]
  };

  static __device__ __forceinline__ void load_queries(Queries& q, const MlaDecodeParams& p, int b, int h0,
                                                      const NarrowQkRole& role) {
    const int g = role.lane >> 2, t = role.lane & 3;
    const uint32_t* q_lo =
        reinterpret_cast<const uint32_t*>(p.q + (static_cast<int64_t>(b) * p.num_heads + h0 + g) * kHeadDim);
    const uint32_t* q_hi = q_lo + 8 * kHeadDim / 2;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int word = (role.k_half * (kHeadDim / 2) + ks * 16 + 2 * t) / 2;
      q.a[ks][0] = __ldg(q_lo + word);
      q.a[ks][1] = __ldg(q_hi + word);
      q.a[ks][2] = __ldg(q_lo + word + 4);
      q.a[ks][3] = __ldg(q_hi + word + 4);
    }
  }

  static __device__ __forceinline__ uint32_t scores(float (&s)[2][4], const Queries& q, SmemRegion stage,
                                                    SmemRegion /*region*/, const NarrowQkRole& role) {
    const int lane = role.lane;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      // matrices: (tokens 0-7, k 0-7), (tokens 0-7, k 8-15), (tokens 8-15, k 0-7), (tokens 8-15, k 8-15)
      const int token = role.group * 16 + ((lane >> 4) << 3) + (lane & 7);
      const int chunk = role.k_half * kChunksPerHalf + ks * 2 + ((lane >> 3) & 1);
      uint32_t kb[4];
      ldmatrix_x4(kb, stage.addr + tile_offset(token, chunk));
      mma_bf16_16816(s[0], q.a[ks], kb[0], kb[1]);
      mma_bf16_16816(s[1], q.a[ks], kb[2], kb[3]);
    }
    return stage.addr;
  }
};

template <typename T, typename Qk>
struct NarrowSmem {
  static constexpr int kKv = 0;                                          // [kStages] stages of the cache's format
  static constexpr int kQk = kKv + T::kStages * T::kTileBytes;           // the QK step's region (Qk::kSmemBytes)
  static constexpr int kP = kQk + Qk::kSmemBytes;                        // [16][64] bf16, swizzled
  static constexpr int kSPart = kP + T::kHeads * T::kPRowBytes;          // [4 groups][32 lanes][8] fp32
  static constexpr int kRedMax = kSPart + 4 * 32 * 8 * 4;                // [4 groups][16] fp32
  static constexpr int kRedSum = kRedMax + 4 * T::kHeads * 4;            // [4 groups][16] fp32
  static constexpr int kAlpha = kRedSum + 4 * T::kHeads * 4;             // [16] fp32
  static constexpr int kRowMax = kAlpha + T::kHeads * 4;                 // [16] fp32
  static constexpr int kBytes = kRowMax + T::kHeads * 4;
  static_assert(kQk % 128 == 0 && Qk::kSmemBytes % 128 == 0, "the regions keep the swizzles' 128-byte alignment");
  static_assert(kBytes <= 227 * 1024, "fits one CTA per SM");
};

// Qk: NarrowBf16Qk, or the FP8 one (mla_decode_fp8_kernel.cuh); the rest of the kernel is the same for both.
template <typename T, typename Qk>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_narrow_kernel(const __grid_constant__ MlaDecodeParams p) {
  static_assert(T::kHeads == 16 && T::kWarps == 8, "warp roles below assume 16 heads and 8 warps");
  static_assert(T::kFp8Cache == Qk::kFp8Cache, "the tile loads and the QK step read one cache format");
  using L = NarrowSmem<T, Qk>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t kv_base = smem_addr(smem + L::kKv);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int h0 = blockIdx.x * T::kHeads, split = blockIdx.y, b = blockIdx.z;
  const CtaKv start = start_cta<T>(p, b, split, kv_base);
  const int context_len = start.context_len;
  const TileRange range = start.range;
  if (range.begin >= range.end) {
    store_empty<T>(p, b, h0, split);
    return;
  }
  const int num_tiles = range.end - range.begin;
  const int32_t* pages = start.pages;
  const uint32_t p_tile = smem_addr(smem + L::kP);
  float* red_max = reinterpret_cast<float*>(smem + L::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + L::kRedSum);
  float* alpha = reinterpret_cast<float*>(smem + L::kAlpha);
  float* row_max = reinterpret_cast<float*>(smem + L::kRowMax);
  const SmemRegion qk_region{.ptr = smem + L::kQk, .addr = smem_addr(smem + L::kQk)};

  // Complete the first tiles' copies; load the queries into registers meanwhile.
  finish_first_tiles<T>(kv_base, p, start);
  const int k_half = warp >> 2, group = warp & 3;  // QK role: one k-half of the dims, tokens 16 * group ..
  const NarrowQkRole role{.k_half = k_half, .group = group, .lane = lane};
  typename Qk::Queries q;
  Qk::load_queries(q, p, b, h0, role);

  const SoftmaxRows<T::kHeads, 4, 2> th{.part = group, .r_lo = g, .t = t};  // the softmax role (k_half 0)
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float acc[1][8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY};  // QK role (k_half 0): running max of rows g, g + 8
  float l_run[2] = {0.0f, 0.0f};            // and this warp's share of their sums
  float4* s_part = reinterpret_cast<float4*>(smem + L::kSPart) + (group * 32 + lane) * 2;
  int stage = 0;
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<T::kStages - 2>();
    // Tile i visible to all; every warp is done with tile i - 1's stage (and with the QK region's V tile)
    __syncthreads();
    queue_next_tile<T>(kv_base, p, pages, range, i, stage, context_len);
    const SmemRegion kv_stage{.ptr = smem + L::kKv + stage * T::kTileBytes, .addr = kv_base + stage * T::kTileBytes};
    const int valid = context_len - (range.begin + i) * kBlockN;  // tokens of this tile inside the context

    // S (partial over this warp's k-half) for 16 heads x 16 tokens
    float s[2][4] = {};
    const uint32_t v_tile = Qk::scores(s, q, kv_stage, qk_region, role);
    if (k_half == 1) {
      s_part[0] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
      s_part[1] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
    }
    __syncthreads();  // also publishes what the QK step wrote to its region (the FP8 step's V tile)
    if (k_half == 0) {
      const float4 o0 = s_part[0], o1 = s_part[1];
      s[0][0] += o0.x, s[0][1] += o0.y, s[0][2] += o0.z, s[0][3] += o0.w;
      s[1][0] += o1.x, s[1][1] += o1.y, s[1][2] += o1.z, s[1][3] += o1.w;
      const float2 a = online_softmax_tile(th, s, valid, scale_log2, red_max, smem + L::kP, m_run, l_run,
                                           [] { named_barrier_sync<128>(); });  // the four k_half-0 warps
      if (group == 0 && t == 0) {
        alpha[g] = a.x;
        alpha[g + 8] = a.y;
      }
    }
    __syncthreads();
    accumulate_pv<T>(acc, p_tile, v_tile, alpha);
    stage = stage + 1 == T::kStages ? 0 : stage + 1;
  }
  allow_dependent_launch();

  if (k_half == 0) publish_row_stats(th, m_run, l_run, red_sum, row_max);
  __syncthreads();
  if (threadIdx.x < T::kHeads) {  // reduce the four groups' sums in place, into group 0's slots
    red_sum[threadIdx.x] += red_sum[16 + threadIdx.x] + red_sum[32 + threadIdx.x] + red_sum[48 + threadIdx.x];
  }
  __syncthreads();
  store_output<T, Qk::kVInWidenOrder>(p, b, h0, split, acc, row_max, red_sum);
}

// ---------------------------------------------------------------------------------------------------------------
// Wide kernel: 64 heads per CTA

template <typename T>
struct WideSmem {
  static constexpr int kQ = 0;                                           // [64][576] bf16, swizzled
  static constexpr int kKv = kQ + T::kHeads * T::kRowBytes;              // [kStages][64][576] bf16, swizzled
  static constexpr int kP = kKv + T::kStages * T::kTileBytes;            // [64][64] bf16, swizzled
  static constexpr int kRedMax = kP + T::kHeads * T::kPRowBytes;         // [2 halves][64] fp32
  static constexpr int kRedSum = kRedMax + 2 * T::kHeads * 4;            // [2 halves][64] fp32
  static constexpr int kAlpha = kRedSum + 2 * T::kHeads * 4;             // [64] fp32
  static constexpr int kRowMax = kAlpha + T::kHeads * 4;                 // [64] fp32
  static constexpr int kBytes = kRowMax + T::kHeads * 4;
  static_assert(kBytes <= 227 * 1024, "fits one CTA per SM");
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_wide_kernel(const __grid_constant__ MlaDecodeParams p) {
  static_assert(T::kHeads == 64 && T::kWarps == 8, "warp roles below assume 64 heads and 8 warps");
  using L = WideSmem<T>;
  constexpr int kKSteps = kHeadDim / 16;  // 36
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t kv_base = smem_addr(smem + L::kKv);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int h0 = blockIdx.x * T::kHeads, split = blockIdx.y, b = blockIdx.z;
  const CtaKv start = start_cta<T>(p, b, split, kv_base);
  const int context_len = start.context_len;
  const TileRange range = start.range;
  if (range.begin >= range.end) {
    store_empty<T>(p, b, h0, split);
    return;
  }
  const int num_tiles = range.end - range.begin;
  const int32_t* pages = start.pages;
  const uint32_t q_base = smem_addr(smem + L::kQ);
  const uint32_t p_tile = smem_addr(smem + L::kP);
  float* red_max = reinterpret_cast<float*>(smem + L::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + L::kRedSum);
  float* alpha = reinterpret_cast<float*>(smem + L::kAlpha);
  float* row_max = reinterpret_cast<float*>(smem + L::kRowMax);

  queue_queries<T>(q_base, p, b, h0);
  finish_first_tiles<T>(kv_base, p, start);

  const int rows = warp & 3, half = warp >> 2;  // QK role: heads 16 * rows .., tokens 32 * half ..
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float acc[T::kRowTiles][8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY};  // QK role: running max of rows 16 * rows + g (+ 8)
  float l_run[2] = {0.0f, 0.0f};            // and this warp's share of their sums
  const int r_lo = rows * 16 + g, r_hi = r_lo + 8;
  const SoftmaxRows<T::kHeads, 2, 4> th{.part = half, .r_lo = r_lo, .t = t};
  int stage = 0;
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();
    queue_next_tile<T>(kv_base, p, pages, range, i, stage, context_len);
    const uint32_t kv = kv_base + stage * T::kTileBytes;
    const int valid = context_len - (range.begin + i) * kBlockN;

    float s[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_base + tile_offset(rows * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int token = half * 32 + np * 16 + ((lane >> 4) << 3) + (lane & 7);
        uint32_t kb[4];
        ldmatrix_x4(kb, kv + tile_offset(token, ks * 2 + ((lane >> 3) & 1)));
        mma_bf16_16816(s[2 * np], qa, kb[0], kb[1]);
        mma_bf16_16816(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }
    const float2 a = online_softmax_tile(th, s, valid, scale_log2, red_max, smem + L::kP, m_run, l_run,
                                         [] { __syncthreads(); });
    if (half == 0 && t == 0) {
      alpha[r_lo] = a.x;
      alpha[r_hi] = a.y;
    }
    __syncthreads();
    accumulate_pv<T>(acc, p_tile, kv, alpha);
    stage = stage + 1 == T::kStages ? 0 : stage + 1;
  }
  allow_dependent_launch();

  publish_row_stats(th, m_run, l_run, red_sum, row_max);
  __syncthreads();
  if (threadIdx.x < T::kHeads) red_sum[threadIdx.x] += red_sum[T::kHeads + threadIdx.x];
  __syncthreads();
  store_output<T>(p, b, h0, split, acc, row_max, red_sum);
}

// ---------------------------------------------------------------------------------------------------------------
// Launch (each kernel's instantiation file calls it)

// One CTA per (head block, split, sequence). Head blocks vary fastest, so the CTAs that read the same tiles run side
// by side and share them through L2.
template <typename T>
void launch_decode_kernel(void (*kernel)(MlaDecodeParams), int smem_bytes, const MlaDecodeParams& p,
                          LaunchStream stream) {
  const dim3 grid(p.num_heads / T::kHeads, p.num_splits, p.batch);
  launch_pdl_large_smem(kernel, {.grid = grid, .block = dim3(kThreads), .smem_bytes = static_cast<size_t>(smem_bytes)},
                        stream, p);
}

}  // namespace deepinfer::cuda::mla_detail
