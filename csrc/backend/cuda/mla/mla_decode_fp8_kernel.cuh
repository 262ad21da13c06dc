// Device code of the MLA decode kernel over the FP8 latent cache; included only by
// instantiations/mla_decode_narrow_fp8.cu.
//
// It is the narrow kernel (mla_decode_kernels.cuh: 16 heads per CTA, queries in registers, mma.sync, the same
// splits, early start, softmax, PV and epilogue) with another QK step. A head count that is a multiple of 16 runs as
// num_heads / 16 head blocks: V2-Lite's 16 heads and V3's 16 per GPU under 8-way tensor parallelism are one block; V3's
// 128 on one GPU are 8 blocks reading the same tiles through L2 (a wide FP8 kernel would read them once per 64 heads).
//
// Why this QK step. A token's row is 656 bytes instead of 1,152, so the kernel needs 57% of the bf16 kernel's DRAM
// time; at 16 heads a tile's products are only ~2.2 MFLOP, so shared memory and issue slots, not the tensor cores,
// decide whether the widening hides under the copies. Widening each stage into a bf16 tile first and running the bf16
// QK on it would move ~190 KB of shared memory a tile beside the products' reads (codes read, 72 KB written, 72 KB
// read again by QK). Instead QK reads the codes itself: a warp's k-half is 256 codes + 32 rope dims of its 16 tokens,
// each lane reads 16 codes (one 16-byte load) of a 64-code block and widens them in registers (mla_decode_fp8_widen.h:
// two bf16x2 words per four codes, under 2 integer operations a code, one bf16x2 multiply by 2^120 * scale a pair),
// which are the B fragments of four k16 steps as they come out: the k order inside a step is a permutation of the
// block's dims, and the queries' A fragments are loaded in the same permutation (k is a sum: any order that pairs
// each query dim with its key dim gives the same dot product). The eight warps together widen every code of the tile
// exactly once and store the words as they are into a bf16 V tile (tile_offset's layout, 64 KB), so each group of
// four columns sits there in the order 0 2 1 3: PV reads it unchanged (its output columns come out in that order),
// and the epilogue swaps one value with the neighbouring lane to write dimension order (store_output), instead of
// two byte permutes per four codes in every tile. k_pe stays bf16 in the stage and is read by ldmatrix directly.
//
// Per tile that is 32 KB of code reads, 8 KB of rope reads and 64 KB of V writes, against ~190 KB; with PV's 80 KB and
// the copies' 41 KB the CTA moves ~230 KB of shared memory per 41 KB tile, ~1.8k cycles at 128 B/clk, and the
// widening takes ~5 integer-pipe instructions per four codes (~640 cycles a tile for the 8 warps), both below the
// ~2.7k cycles one SM's share of 4 TB/s takes to deliver 41 KB: the kernel should stay bound by DRAM, at up to 1.76x
// the bf16 kernel's tokens per second. Three stages fit beside the V tile (194 KB in all): two tiles in flight while
// the third is used, 84 KB a CTA, more than an SM's share of the bytes in flight that DRAM latency needs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/mla/mla_decode_fp8_stage.cuh"
#include "backend/cuda/mla/mla_decode_fp8_widen.h"
#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

// The narrow kernel's shape over FP8 stages (the shared tile loads read T::kFp8Cache).
struct MlaDecodeFp8Traits {
  static constexpr bool kFp8Cache = true;
  static constexpr int kHeads = kNarrowHeads;
  static constexpr int kStages = 3;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowTiles = kHeads / 16;
  static constexpr int kTileBytes = Fp8Stage::kBytes;  // one stage: a tile's 64 FP8 rows
  static constexpr int kColsPerWarp = kValueDim / kWarps;
  static constexpr int kPRowBytes = kBlockN * 2;
  static_assert(kThreads == kBlockN * 4, "4 threads copy each row of a tile");
  static_assert(kColsPerWarp == 64 && kPRowBytes == 128, "PV and the P tile as in the bf16 kernels");
  static_assert(kStages - 1 <= kMaxFirstTiles, "start_cta's early copies cover the first kStages - 1 tiles");
};

// a * b on bf16x2 (round to nearest; exact here: b is a power of two and a has 4 significant bits).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// 2^120 * scale in both halves of a bf16x2: what turns widened codes (value * 2^-120) into the cache's values.
// Exact for the power-of-two scales up to 2^7; a zero-filled row (past the context) has scale 0 and widens to zeros,
// and a NaN scale (a row of poison, which a correct kernel never reads) stays NaN, so such a read shows.
__device__ __forceinline__ uint32_t widen_factor(float scale) {
  const float f = scale * kE4m3WidenScale;
  return pack_bf16x2(f, f);
}

// The QK step over FP8 stages (see the top of this file). Warp k-halves: codes 256 k_half .. + 256 (4 blocks of 64)
// and rope dims 32 k_half .. + 32.
struct NarrowFp8Qk {
  static constexpr bool kFp8Cache = true;
  static constexpr bool kVInWidenOrder = true;  // V's words are the even and odd words as widened (no permute)
  static constexpr int kBlocks = 4;                             // 64-code blocks of a k-half
  static constexpr int kCodeSteps = kBlocks * 4;                // k16 steps over them
  static constexpr int kRopeSteps = (kHeadDim - kValueDim) / 2 / 16;  // 2
  static constexpr int kSmemBytes = kBlockN * kValueDim * 2;    // the V tile: [64][512] bf16, tile_offset's layout
  static_assert(kCodeSteps + kRopeSteps == kHeadDim / 2 / 16, "a k-half is 288 dims, as in the bf16 kernel");
  static_assert(Fp8Stage::kGroup == 2 * 64, "a scale covers two 64-code blocks");

  // Lane (g, t)'s A fragments. Code step 4 blk + j pairs, in the mma's k order 2t, 2t+1 | 2t+8, 2t+9, the block's
  // dims 16t + 4j + {0, 2 | 1, 3}: the order in which widen_e4m3x4 returns the lane's 16 codes (even | odd word).
  struct Queries {
    uint32_t codes[kCodeSteps][4];
    uint32_t rope[kRopeSteps][4];  // natural k order: the rope B fragments come from ldmatrix
  };

  static __device__ __forceinline__ void load_queries(Queries& q, const MlaDecodeParams& p, int b, int h0,
                                                      const NarrowQkRole& role) {
    const int g = role.lane >> 2, t = role.lane & 3;
    const uint16_t* q_lo = p.q + (static_cast<int64_t>(b) * p.num_heads + h0 + g) * kHeadDim;  // head g
    const uint16_t* q_hi = q_lo + 8 * kHeadDim;                                                  // head g + 8
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const int dim = (role.k_half * kBlocks + blk) * 64 + 16 * t;  // the 16 dims this lane's codes hold
      const uint4 lo0 = __ldg(reinterpret_cast<const uint4*>(q_lo + dim));
      const uint4 lo1 = __ldg(reinterpret_cast<const uint4*>(q_lo + dim + 8));
      const uint4 hi0 = __ldg(reinterpret_cast<const uint4*>(q_hi + dim));
      const uint4 hi1 = __ldg(reinterpret_cast<const uint4*>(q_hi + dim + 8));
      const uint32_t lo[8] = {lo0.x, lo0.y, lo0.z, lo0.w, lo1.x, lo1.y, lo1.z, lo1.w};  // dims (2i, 2i + 1)
      const uint32_t hi[8] = {hi0.x, hi0.y, hi0.z, hi0.w, hi1.x, hi1.y, hi1.z, hi1.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t(&a)[4] = q.codes[blk * 4 + j];
        a[0] = pack_low_halves(lo[2 * j], lo[2 * j + 1]);   // head g, dims 4j, 4j + 2
        a[1] = pack_low_halves(hi[2 * j], hi[2 * j + 1]);   // head g + 8
        a[2] = pack_high_halves(lo[2 * j], lo[2 * j + 1]);  // head g, dims 4j + 1, 4j + 3
        a[3] = pack_high_halves(hi[2 * j], hi[2 * j + 1]);
      }
    }
    const uint32_t* w_lo = reinterpret_cast<const uint32_t*>(q_lo);
    const uint32_t* w_hi = reinterpret_cast<const uint32_t*>(q_hi);
#pragma unroll
    for (int ks = 0; ks < kRopeSteps; ++ks) {
      const int word = (kValueDim + role.k_half * (kRopeSteps * 16) + ks * 16 + 2 * t) / 2;
      q.rope[ks][0] = __ldg(w_lo + word);
      q.rope[ks][1] = __ldg(w_hi + word);
      q.rope[ks][2] = __ldg(w_lo + word + 4);
      q.rope[ks][3] = __ldg(w_hi + word + 4);
    }
  }

  // S over the warp's k-half; the widened codes of its 16 tokens x 256 codes go to the V tile in `v`.
  static __device__ __forceinline__ uint32_t scores(float (&s)[2][4], const Queries& q, SmemRegion stage,
                                                    SmemRegion v, const NarrowQkRole& role) {
    const int lane = role.lane, g = lane >> 2, t = lane & 3;
    uint32_t factor[2][2];  // [n8 tile][scale group of the k-half]
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int row = role.group * 16 + nt * 8 + g;
      const float2 scales = *reinterpret_cast<const float2*>(stage.ptr + fp8_scales_offset(row) + 8 * role.k_half);
      factor[nt][0] = widen_factor(scales.x);
      factor[nt][1] = widen_factor(scales.y);
    }
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const int block = role.k_half * kBlocks + blk;  // of the row's 8 blocks of 64 codes
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {  // the n8 tiles: tokens 16 group + 8 nt ..
        const int row = role.group * 16 + nt * 8 + g;
        const uint4 raw = *reinterpret_cast<const uint4*>(stage.ptr + fp8_codes_offset(row, 4 * block + t));
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t widened[8];  // dims 64 block + 16 t .. + 16, each four as (0, 2), (1, 3)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const WidenedE4m3x4 w = widen_e4m3x4(words[j]);
          widened[2 * j] = mul_bf16x2(w.even, factor[nt][blk >> 1]);
          widened[2 * j + 1] = mul_bf16x2(w.odd, factor[nt][blk >> 1]);
          mma_bf16_16816(s[nt], q.codes[blk * 4 + j], widened[2 * j], widened[2 * j + 1]);
        }
        // bf16 chunks 8 block + 2t and + 1 of the row, each group of four columns in the order 0 2 1 3 (PV does not
        // mind; store_output exchanges the pairs back). Conflict-free: the two rows of a quarter warp differ in
        // row & 1, which moves every chunk of the second to the other parity.
        *reinterpret_cast<uint4*>(v.ptr + tile_offset(row, 8 * block + 2 * t)) =
            make_uint4(widened[0], widened[1], widened[2], widened[3]);
        *reinterpret_cast<uint4*>(v.ptr + tile_offset(row, 8 * block + 2 * t + 1)) =
            make_uint4(widened[4], widened[5], widened[6], widened[7]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < kRopeSteps; ++ks) {
      // matrices: (tokens 0-7, k 0-7), (tokens 0-7, k 8-15), (tokens 8-15, k 0-7), (tokens 8-15, k 8-15)
      const int token = role.group * 16 + ((lane >> 4) << 3) + (lane & 7);
      const int chunk = role.k_half * (kRopeSteps * 2) + ks * 2 + ((lane >> 3) & 1);
      uint32_t kb[4];
      ldmatrix_x4(kb, stage.addr + fp8_rope_offset(token, chunk));
      mma_bf16_16816(s[0], q.rope[ks], kb[0], kb[1]);
      mma_bf16_16816(s[1], q.rope[ks], kb[2], kb[3]);
    }
    return v.addr;
  }
};

}  // namespace deepinfer::cuda::mla_detail
