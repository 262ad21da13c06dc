// One thread block writes one latent row into its FP8 cache row (backend/ops/latent_fp8.h), the bytes
// quantize_latent_fp8_row gives for the same values:
//   1. each warp takes 32 consecutive c_kv values at a time (a kThreads-thread block covers kThreads / 128 groups a
//      pass, a warp always inside one group), reduces |v| with shuffles, and one lane folds the warp's maximum into
//      its group's shared amax (atomicMax on the bits: non-negative floats order as their bits);
//   2. after a barrier each thread reads its values again and writes their codes, code = e4m3(v * (1 / scale)) with
//      the group's power-of-two scale (latent_fp8_math.h); the first threads write the scales, the k_pe values
//      rounded to bf16, and the padding zeros.
// A NaN c_kv value does not count toward its group's amax (as on the host) and gets the NaN code 0x7f.
#pragma once

#include <cstdint>

#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/mla/latent_fp8_math.h"
#include "backend/cuda/mla/latent_fp8_row_params.h"

namespace deepinfer::cuda {

// Every thread of the block calls it, with the same arguments (it has barriers). `latent` ([rank + rope_dim] values)
// must be complete for every thread: written before the call and a barrier, or an input of the kernel.
template <int kThreads, typename T>
__device__ __forceinline__ void store_latent_fp8_row(const T* latent, const LatentFp8RowParams& r, uint8_t* row) {
  static_assert(kThreads % kLatentFp8Group == 0, "a warp's 32 consecutive values stay inside one group");
  __shared__ uint32_t amax_bits[kLatentFp8MaxGroups];  // the groups' largest |v| (the launcher checked the count)
  const int64_t num_groups = (r.rank + kLatentFp8Group - 1) / kLatentFp8Group;
  for (int64_t g = threadIdx.x; g < num_groups; g += kThreads) amax_bits[g] = 0;
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x % 32);
  // i0: the first value of this warp's pass, the same for its 32 lanes, so the loop and the shuffles are warp-uniform.
  for (int64_t i0 = threadIdx.x - lane; i0 < r.rank; i0 += kThreads) {
    const int64_t i = i0 + lane;
    float a = i < r.rank ? fmaxf(0.0f, fabsf(to_float(latent[i]))) : 0.0f;  // fmaxf drops a NaN
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    if (lane == 0) atomicMax(&amax_bits[i0 / kLatentFp8Group], __float_as_uint(a));
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < r.rank; i += kThreads) {
    const float scale = latent_fp8_group_scale(__uint_as_float(amax_bits[i / kLatentFp8Group]));
    row[i] = latent_fp8_code(__fmul_rn(to_float(latent[i]), latent_fp8_inverse_scale(scale)));
  }
  for (int64_t g = threadIdx.x; g < num_groups; g += kThreads) {
    const float scale = latent_fp8_group_scale(__uint_as_float(amax_bits[g]));
    memcpy(row + r.scales_offset + 4 * g, &scale, sizeof(scale));  // byte stores: the offset is rank + 4g
  }
  for (int64_t j = threadIdx.x; j < r.rope_dim; j += kThreads) {
    const uint16_t bits = latent_fp8_bf16_bits(to_float(latent[r.rank + j]));
    memcpy(row + r.rope_offset + 2 * j, &bits, sizeof(bits));
  }
  for (int64_t b = r.rope_offset + 2 * r.rope_dim + threadIdx.x; b < r.row_bytes; b += kThreads) row[b] = 0;
}

}  // namespace deepinfer::cuda
