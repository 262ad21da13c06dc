// PTX wrappers only the MoE kernels use (sm_90a): loads through L2, an L2 prefetch, bf16 helpers; the shared ones
// (weight streaming, mma.sync, cp.async, wgmma, programmatic dependent launch) are in ptx.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

// 8-byte streaming load (FP8 weights: 8 codes), evict-first in L2, as ld_stream_16.
__device__ __forceinline__ uint2 ld_stream_8(const void* ptr) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;\n"
      : "=r"(v.x), "=r"(v.y)
      : "l"(ptr), "l"(policy));
  return v;
}

// 4-byte streaming load (INT4 weights: one packed word of 8 codes), evict-first in L2, as ld_stream_16.
__device__ __forceinline__ uint32_t ld_stream_4(const void* ptr) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;\n" : "=r"(v) : "l"(ptr), "l"(policy));
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


// 16-byte store to shared memory at a shared-state-space address (the grouped kernels' FP8 B tiles).
__device__ __forceinline__ void st_shared_16(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
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
// FP8 (e4m3) helpers. Every e4m3 value is an f16 value (the hardware conversion is exact) and, with 4 significant bits,
// also a bf16 value: the widening to bf16 through f32 is exact.

// Codes byte 2i and 2i + 1 of `codes` (i = 0, 1) as floats, the lower byte first.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t codes, int i) {
  const auto pair = static_cast<__nv_fp8x2_storage_t>(codes >> (16 * i));
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
}

// Four codes (byte 0 = the lowest k) as two bf16x2 words, exactly: lo = codes 0, 1; hi = codes 2, 3.
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  const float2 a = e4m3x2_to_float2(codes, 0), b = e4m3x2_to_float2(codes, 1);
  lo = pack_bf16x2(a.x, a.y);
  hi = pack_bf16x2(b.x, b.y);
}

// Four codes times `scale`, rounded to bf16 once (the grouped kernels' widening): lo = codes 0, 1; hi = codes 2, 3.
__device__ __forceinline__ void e4m3x4_to_bf16x2_scaled(uint32_t codes, float scale, uint32_t& lo, uint32_t& hi) {
  const float2 a = e4m3x2_to_float2(codes, 0), b = e4m3x2_to_float2(codes, 1);
  lo = pack_bf16x2(a.x * scale, a.y * scale);
  hi = pack_bf16x2(b.x * scale, b.y * scale);
}

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
