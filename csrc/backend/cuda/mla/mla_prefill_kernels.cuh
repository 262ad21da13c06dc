// The MLA prefill attention kernel (mla_prefill.cuh describes the
// steps; mla_prefill_params.h the semantics). Included by instantiations/mla_prefill_*.cu
// (the kernel) and mla_prefill.cu (the traits).
//
// Attention, one CTA per (64-query tile, head, sequence), 4 warps of 16 query rows each:
//   Q tile [64, 192] -> shared memory once -> each warp's A fragments in registers (12 k-steps of 16)
//   for each 64-key tile up to the tile's last visible key (double-buffered, the next tile's cp.async in flight):
//     K tile [64, 192] = k_nope (kv workspace) | k_pe (gathered latents), V tile [64, 128] (kv workspace)
//     S = Q · K^T (mma.sync m16n8k16, fp32), causal mask on the diagonal tiles, online softmax (fp32, exp2)
//     O = O * rescale + P · V   (P as bf16 A fragments straight from the S accumulators)
//   out = O / row sum, bf16.
// Shared-memory tiles are stored with 16-byte chunks XOR-swizzled by row (chunk ^ (row & 7)), so ldmatrix reads of
// 8 rows at one column hit 8 distinct bank groups. Keys past the context are zero-filled (never NaN) and masked.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mla/mla_prefill_params.h"
#include "backend/cuda/runtime/launch_stream.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda::mla_prefill_detail {

// The workspace row of sequence s's key 0: the contexts before it, summed (a few hundred sequences at most, read
// from L1/L2; the workspace holds the sum of the contexts, not num_seqs x the longest).
__device__ __forceinline__ int64_t first_row(const int32_t* context_lens, int s) {
  int64_t row = 0;
  for (int i = 0; i < s; ++i) row += context_lens[i];
  return row;
}

struct MlaPrefillTraits {
  static constexpr int kNope = 128;
  static constexpr int kRope = 64;
  static constexpr int kQk = kNope + kRope;  // 192
  static constexpr int kV = 128;
  static constexpr int kRank = 512;
  static constexpr int kLatent = kRank + kRope;  // 576: a cached row
  static constexpr int kKvWidth = kNope + kV;    // 256: one head's columns of the kv workspace
  static constexpr int kBlockM = 64;             // queries per CTA
  static constexpr int kBlockN = 64;             // keys per tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunk = 8;  // bf16 values per 16-byte chunk

  static_assert(kBlockM == 16 * kWarps, "one 16-row MMA slice of queries per warp");
  static_assert(kBlockN % 16 == 0 && kQk % 16 == 0 && kV % 16 == 0, "whole m16n8k16 steps");
  static_assert(kQk % (8 * kChunk) == 0 && kV % (8 * kChunk) == 0, "the XOR swizzle needs rows of 8k chunks");
  static_assert(kNope % kChunk == 0 && kRope % kChunk == 0 && kRank % kChunk == 0, "16-byte chunks never straddle");

  static constexpr int kQElems = kBlockM * kQk;
  static constexpr int kKElems = kBlockN * kQk;
  static constexpr int kVElems = kBlockN * kV;
  static constexpr int kSmemBytes = (kQElems + 2 * kKElems + 2 * kVElems) * 2;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

// Element offset of (row, chunk) in a swizzled tile with `kWidth` bf16 columns.
template <int kWidth>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kWidth + ((chunk ^ (row & 7)) << 3);
}

// D[16x8] += A[16x16] · B[16x8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------------------------------------------------------
// Attention

// The query tile of an attention CTA (either kernel): grid (query tiles, heads, sequences), the longest (last) query
// tiles started first. Its queries are rows [m0, m0 + rows) of the sequence's num_q, at positions first_pos + m0 ..;
// they see keys [0, last position], num_kv_tiles tiles of kBlockN. False when the sequence has no such tile.
struct QueryTile {
  int seq, head, q_begin, num_q, m0, ctx, first_pos, rows, num_kv_tiles;
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool query_tile(const MlaPrefillAttentionParams& p, QueryTile& t) {
  t.seq = blockIdx.z;
  t.head = blockIdx.y;
  t.q_begin = p.query_start[t.seq];
  t.num_q = p.query_start[t.seq + 1] - t.q_begin;
  t.m0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (t.m0 >= t.num_q) return false;
  t.ctx = p.context_lens[t.seq];
  t.first_pos = t.ctx - t.num_q;  // position of query 0
  t.rows = min(kBlockM, t.num_q - t.m0);
  t.num_kv_tiles = (t.first_pos + t.m0 + t.rows - 1) / kBlockN + 1;
  return true;
}

template <typename T>
struct TileLoader {
  const uint16_t* latents;  // this sequence's first gathered row
  const uint16_t* kv;       // this sequence's first kv row, offset to this head's columns
  int64_t kv_stride;        // elements between kv rows (num_heads * 256)
  int ctx;                  // keys of the sequence

  // K tile rows [key0, key0 + kBlockN): k_nope chunks from kv, k_pe chunks from the latents; zeros past ctx.
  __device__ __forceinline__ void load_k(uint16_t* sk, int key0, int tid) const {
    constexpr int kChunks = T::kQk / T::kChunk, kNopeChunks = T::kNope / T::kChunk;
    for (int i = tid; i < T::kBlockN * kChunks; i += T::kThreads) {
      const int row = i / kChunks, c = i % kChunks, key = key0 + row;
      const bool valid = key < ctx;
      const uint16_t* src = !valid ? kv
                            : c < kNopeChunks
                                ? kv + key * kv_stride + c * T::kChunk
                                : latents + static_cast<int64_t>(key) * T::kLatent + T::kRank +
                                      (c - kNopeChunks) * T::kChunk;
      ptx::cp_async_16(ptx::smem_addr(sk + swizzled<T::kQk>(row, c)), src, valid ? 16 : 0);
    }
  }

  __device__ __forceinline__ void load_v(uint16_t* sv, int key0, int tid) const {
    constexpr int kChunks = T::kV / T::kChunk;
    for (int i = tid; i < T::kBlockN * kChunks; i += T::kThreads) {
      const int row = i / kChunks, c = i % kChunks, key = key0 + row;
      const bool valid = key < ctx;
      const uint16_t* src = valid ? kv + key * kv_stride + T::kNope + c * T::kChunk : kv;
      ptx::cp_async_16(ptx::smem_addr(sv + swizzled<T::kV>(row, c)), src, valid ? 16 : 0);
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(T::kThreads) mla_prefill_attention_kernel(
    const __grid_constant__ MlaPrefillAttentionParams p) {
  constexpr int kQSteps = T::kQk / 16;     // k-steps of S = Q · K^T
  constexpr int kSTiles = T::kBlockN / 8;  // n-tiles of S
  constexpr int kPSteps = T::kBlockN / 16; // k-steps of O = P · V
  constexpr int kOTiles = T::kV / 8;       // n-tiles of O
  constexpr float kLog2e = 1.4426950408889634f;
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  QueryTile qt;
  if (!query_tile<T::kBlockM, T::kBlockN>(p, qt)) return;
  const int s = qt.seq, h = qt.head, q_begin = qt.q_begin, num_q = qt.num_q, m0 = qt.m0, ctx = qt.ctx;
  const int first_pos = qt.first_pos, num_kv_tiles = qt.num_kv_tiles;

  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sq = smem;
  uint16_t* sk = sq + T::kQElems;          // two buffers
  uint16_t* sv = sk + 2 * T::kKElems;      // two buffers

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t seq_row0 = first_row(p.context_lens, s);
  const int64_t kv_stride = static_cast<int64_t>(p.num_heads) * T::kKvWidth;
  const TileLoader<T> loader{.latents = p.latents + seq_row0 * T::kLatent,
                             .kv = p.kv + seq_row0 * kv_stride + static_cast<int64_t>(h) * T::kKvWidth,
                             .kv_stride = kv_stride,
                             .ctx = ctx};

  // Q tile; rows past the sequence's queries are zeros.
  {
    constexpr int kChunks = T::kQk / T::kChunk;
    for (int i = tid; i < T::kBlockM * kChunks; i += T::kThreads) {
      const int row = i / kChunks, c = i % kChunks;
      const bool valid = m0 + row < num_q;
      const int64_t q_row = q_begin + m0 + (valid ? row : 0);
      const uint16_t* src = p.q + (q_row * p.num_heads + h) * T::kQk + c * T::kChunk;
      ptx::cp_async_16(ptx::smem_addr(sq + swizzled<T::kQk>(row, c)), src, valid ? 16 : 0);
    }
  }
  loader.load_k(sk, 0, tid);
  loader.load_v(sv, 0, tid);
  ptx::cp_async_commit();

  uint32_t q_frag[kQSteps][4];
  float o[kOTiles][4];
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw scores (before softmax_scale)
  float row_sum[2] = {0.0f, 0.0f};            // this thread's columns only; summed over the quad at the end
  const float scale_log2 = p.softmax_scale * kLog2e;
  // Positions of this thread's two rows (lane / 4 and lane / 4 + 8 of the warp's 16).
  const int pos0 = first_pos + m0 + warp * 16 + lane / 4;
  const int pos1 = pos0 + 8;
  const int warp_min_pos = first_pos + m0 + warp * 16;

  for (int t = 0; t < num_kv_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < num_kv_tiles) {
      loader.load_k(sk + (buf ^ 1) * T::kKElems, (t + 1) * T::kBlockN, tid);
      loader.load_v(sv + (buf ^ 1) * T::kVElems, (t + 1) * T::kBlockN, tid);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
      for (int kk = 0; kk < kQSteps; ++kk) {
        const int row = warp * 16 + lane % 16, chunk = kk * 2 + lane / 16;
        ptx::ldmatrix_x4(q_frag[kk], ptx::smem_addr(sq + swizzled<T::kQk>(row, chunk)));
      }
    }
    const uint16_t* k_tile = sk + buf * T::kKElems;
    const uint16_t* v_tile = sv + buf * T::kVElems;

    // S = Q · K^T for the warp's 16 rows and the tile's 64 keys.
    float sc[kSTiles][4];
    for (int n = 0; n < kSTiles; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t b[4];
        const int row = np * 16 + (lane / 16) * 8 + lane % 8, chunk = kk * 2 + (lane / 8) % 2;
        ptx::ldmatrix_x4(b, ptx::smem_addr(k_tile + swizzled<T::kQk>(row, chunk)));
        mma_16816(sc[2 * np], q_frag[kk], b[0], b[1]);
        mma_16816(sc[2 * np + 1], q_frag[kk], b[2], b[3]);
      }
    }

    // Causal mask where the tile reaches past the warp's first position (keys past ctx are past every position).
    const int key0 = t * T::kBlockN;
    if (key0 + T::kBlockN - 1 > warp_min_pos) {
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        const int key = key0 + n * 8 + (lane % 4) * 2;
        if (key > pos0) sc[n][0] = -INFINITY;
        if (key + 1 > pos0) sc[n][1] = -INFINITY;
        if (key > pos1) sc[n][2] = -INFINITY;
        if (key + 1 > pos1) sc[n][3] = -INFINITY;
      }
    }

    // Online softmax: new row maxima over the quad, rescale the running sums and outputs.
    float new_max[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
      new_max[0] = fmaxf(new_max[0], fmaxf(sc[n][0], sc[n][1]));
      new_max[1] = fmaxf(new_max[1], fmaxf(sc[n][2], sc[n][3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 1));
      new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 2));
    }
    // Every row sees key 0 in tile 0, so the maxima are finite from the first tile on.
    const float rescale[2] = {exp2f((row_max[0] - new_max[0]) * scale_log2),
                              exp2f((row_max[1] - new_max[1]) * scale_log2)};
    const float offset[2] = {new_max[0] * scale_log2, new_max[1] * scale_log2};
    row_max[0] = new_max[0];
    row_max[1] = new_max[1];
    row_sum[0] *= rescale[0];
    row_sum[1] *= rescale[1];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
      sc[n][0] = exp2f(fmaf(sc[n][0], scale_log2, -offset[0]));
      sc[n][1] = exp2f(fmaf(sc[n][1], scale_log2, -offset[0]));
      sc[n][2] = exp2f(fmaf(sc[n][2], scale_log2, -offset[1]));
      sc[n][3] = exp2f(fmaf(sc[n][3], scale_log2, -offset[1]));
      row_sum[0] += sc[n][0] + sc[n][1];
      row_sum[1] += sc[n][2] + sc[n][3];
    }

    // O += P · V, P's A fragments straight from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t a[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                             pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        uint32_t b[4];
        const int row = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, chunk = dp * 2 + lane / 16;
        ptx::ldmatrix_x4_trans(b, ptx::smem_addr(v_tile + swizzled<T::kV>(row, chunk)));
        mma_16816(o[2 * dp], a, b[0], b[1]);
        mma_16816(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the loads of tile t + 2 overwrite it
  }

  // out = O / row sum, for the rows that are queries of this sequence.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  const float inv[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + warp * 16 + lane / 4 + r * 8;
    if (i >= num_q) continue;
    uint16_t* out_row = p.out + (static_cast<int64_t>(q_begin + i) * p.num_heads + h) * T::kV;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      *reinterpret_cast<uint32_t*>(out_row + n * 8 + (lane % 4) * 2) =
          pack_bf16x2(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
    }
  }
}

void launch_mla_prefill_attention(const MlaPrefillAttentionParams& p, LaunchStream stream);
// The wgmma kernel (mla_prefill_wgmma.cuh), launched by instantiations/mla_prefill_attention_wgmma.cu.
void launch_mla_prefill_attention_wgmma(const MlaPrefillAttentionParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda::mla_prefill_detail
