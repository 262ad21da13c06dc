// PTX wrappers only the MoE kernels use (sm_90a): streaming loads, bf16 helpers, mma.sync; the shared ones
// (cp.async, wgmma, programmatic dependent launch) are in ptx.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/ptx.cuh"

namespace deepinfer::cuda::moe_detail {

using namespace ::deepinfer::cuda::ptx;  // NOLINT: the shared PTX wrappers


// ---------------------------------------------------------------------------------------------------------------
// Global memory

// 16-byte read-only load that skips L1 and marks the L2 line evict-first: weights streamed once.
__device__ __forceinline__ uint4 ld_stream_16(const void* ptr) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr), "l"(policy));
  return v;
}

// 16-byte load through L2 only (data written by an earlier kernel, read once).
__device__ __forceinline__ uint4 ld_cg_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Pulls the 128-byte line at `ptr` into L2 with evict-last priority.
__device__ __forceinline__ void prefetch_l2_evict_last(const void* ptr) {
  asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(ptr));
}


// ---------------------------------------------------------------------------------------------------------------
// bf16 helpers

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column index
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// g * sigmoid(g); the exponent is clamped so the fast division never sees a denominator above 2^126.
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(fminf(-g, 80.0f))); }

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;\n" : "=r"(mask));
  return mask;
}

// ---------------------------------------------------------------------------------------------------------------
// mma.sync

// D[16x8] += A[16x16] · B[16x8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------------------------
// Warpgroup MMA



}  // namespace deepinfer::cuda::moe_detail
