// The skinny GEMM's norm prologue (SkinnyNormPrologue): a CTA of the skinny kernel builds the normalized activation
// rows it multiplies in its own shared memory, so norm_linear is one launch instead of a norm kernel and a GEMM.
//
// The rows must come out bit for bit as the separate kernels make them (the model's results must not depend on the
// fusion), so the prologue reproduces their fp32 summation order with the skinny kernel's 256 threads:
//   with an add, the vectorized add_rms_norm kernel (norm_residual.cu): V = norm_residual_block_threads(dim / 8)
//   threads, thread v sums the squares of chunks of 8 elements v, v + V, ... in element order;
//   without, the rms_norm kernel (rms_norm_row.cuh): V = rms_norm_block_threads(dim), thread v sums elements
//   v, v + V, ...;
// then each warp of V adds its 32 sums by an xor butterfly and the warp totals are added in warp order from zero.
// Thread t of the CTA plays the reference's threads t and t + 256 (those below V): lane for lane the same warps, so
// its shuffles add the same pairs. The values are rounded where the reference rounds them (the sum to bf16 before
// it is squared, the normalized value once), and scaled as w * (v * inv_rms).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/rms_norm_row.cuh"
#include "backend/cuda/skinny_gemm_params.h"

namespace deepinfer::cuda::skinny_norm {

inline constexpr int kCtaThreads = 256;      // the skinny kernel's threads
inline constexpr int kMaxRefThreads = 512;   // the most threads a reference kernel reduces a row with
inline constexpr int kRowPad = 32;           // bf16 elements after each staged row (see row_stride)

// Elements between staged rows: the pad moves row r + 1 by 64 bytes against row r, so the main loop's eight lanes
// of a 16-byte load phase (two tokens, four K quarters) hit distinct banks.
__host__ __device__ constexpr int64_t row_stride(int64_t k_dim) { return k_dim + kRowPad; }

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Normalizes the `tokens` rows into `staged` (rows row_stride(k_dim) apart). kAdd: with the sublayer output added
// (chunks of 8); otherwise plain rms_norm of residual_in (single elements). `ref_threads` is the reference kernel's
// block size for this row length. When `writer`, also stores residual_out and normed. All threads of
// the CTA call it; it ends with a barrier, after which `staged` is ready. Called after griddep_wait().
template <bool kAdd>
__device__ __forceinline__ void normalize_rows(const SkinnyGemmParams& p, int ref_threads, uint16_t* staged,
                                               bool writer) {
  constexpr int kChunk = kAdd ? 8 : 1;
  constexpr int kPlays = kMaxRefThreads / kCtaThreads;  // reference threads one thread plays, at most
  __shared__ float warp_totals[8][kMaxRefThreads / 32];  // per token: no barrier between one row and the next
  const SkinnyNormPrologue& n = p.norm;
  const int64_t dim = p.k_dim, stride = row_stride(dim), ref_step = int64_t{ref_threads} * kChunk;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int token = 0; token < p.tokens; ++token) {
    const int64_t row = token * dim;
    uint16_t* srow = staged + token * stride;
    float sum_sq[kPlays];
#pragma unroll
    for (int h = 0; h < kPlays; ++h) {
      sum_sq[h] = 0.0f;
      const int v = static_cast<int>(threadIdx.x) + h * kCtaThreads;
      if (v >= ref_threads) continue;
      for (int64_t i = int64_t{v} * kChunk; i < dim; i += ref_step) {
        if constexpr (kAdd) {
          const uint4 a = *reinterpret_cast<const uint4*>(n.add + row + i);
          const uint4 r = *reinterpret_cast<const uint4*>(n.residual_in + row + i);
          const auto* a16 = reinterpret_cast<const uint16_t*>(&a);
          const auto* r16 = reinterpret_cast<const uint16_t*>(&r);
          uint4 sum;
          auto* s16 = reinterpret_cast<uint16_t*>(&sum);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            s16[j] = float_to_bf16_bits(bf16_bits_to_float(a16[j]) + bf16_bits_to_float(r16[j]));
            const float rounded = bf16_bits_to_float(s16[j]);
            sum_sq[h] = fmaf(rounded, rounded, sum_sq[h]);
          }
          *reinterpret_cast<uint4*>(srow + i) = sum;
          if (writer) *reinterpret_cast<uint4*>(n.residual_out + row + i) = sum;
        } else {
          const uint16_t bits = n.residual_in[row + i];
          const float value = bf16_bits_to_float(bits);
          sum_sq[h] = fmaf(value, value, sum_sq[h]);
          srow[i] = bits;
          if (writer) n.residual_out[row + i] = bits;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kPlays; ++h) {
      const float warp_sum = sum_over_warp(sum_sq[h]);
      const int ref_warp = h * (kCtaThreads / 32) + warp;
      if (lane == 0 && ref_warp < ref_threads / 32) warp_totals[token][ref_warp] = warp_sum;
    }
  }
  __syncthreads();
  // Each thread scales the elements it staged, so no barrier is needed between the passes.
  for (int token = 0; token < p.tokens; ++token) {
    float total = 0.0f;
    for (int w = 0; w < ref_threads / 32; ++w) total += warp_totals[token][w];
    const float inv_rms = rsqrtf(total / static_cast<float>(dim) + n.eps);
    uint16_t* srow = staged + token * stride;
    uint16_t* out = n.normed + token * dim;
#pragma unroll
    for (int h = 0; h < kPlays; ++h) {
      const int v = static_cast<int>(threadIdx.x) + h * kCtaThreads;
      if (v >= ref_threads) continue;
      for (int64_t i = int64_t{v} * kChunk; i < dim; i += ref_step) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          srow[i + j] = float_to_bf16_bits(n.weight[i + j] * (bf16_bits_to_float(srow[i + j]) * inv_rms));
        }
        if (writer) {
          if constexpr (kAdd) {
            *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(srow + i);
          } else {
            out[i] = srow[i];
          }
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace deepinfer::cuda::skinny_norm
