// PTX wrappers only the MoE kernels use (sm_90a): loads through L2, an L2 prefetch, bf16 helpers; the shared ones
// (weight streaming, mma.sync, cp.async, wgmma, programmatic dependent launch) are in ptx.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda::moe_detail {

using namespace ::deepinfer::cuda::ptx;  // NOLINT: the shared PTX wrappers


// ---------------------------------------------------------------------------------------------------------------
// Global memory

// 16-byte load through L2 only (data written by an earlier kernel, read once).
__device__ __forceinline__ uint4 ld_cg_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// A counter other CTAs of the grid raise after a fence: the acquiring side of that handoff.
__device__ __forceinline__ int ld_acquire_gpu(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
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

// ---------------------------------------------------------------------------------------------------------------
// Warp and warpgroup

// Barrier `id` (1 .. 15; 0 is __syncthreads') over the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;\n" : "=r"(mask));
  return mask;
}

}  // namespace deepinfer::cuda::moe_detail
