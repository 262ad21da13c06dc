// Device helpers shared by the memory-bound kernels (elementwise, norms, rope, row copies): fp32 <-> element
// conversions for the two activation types (float and bfloat16), 16-byte vector loads and stores, and a row copy
// in the widest unit the row's size and alignment allow.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "core/dtype.h"

namespace deepinfer::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// kSize elements of T moved in one 16-byte access.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  Vec16<T> out;
  memcpy(&out, &raw, sizeof(out));
  return out;
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

__host__ __device__ __forceinline__ bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Grid-stride kernels get at most this many blocks: enough to fill any current GPU several times over.
constexpr int64_t kMaxGridBlocks = 4096;

inline unsigned grid_blocks(int64_t work_items, int threads_per_block) {
  const int64_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxGridBlocks ? kMaxGridBlocks : blocks));
}

// The launch shape of a grid-stride kernel of kThreads-thread blocks over `work_items` items.
template <int kThreads>
LaunchShape grid_stride_shape(int64_t work_items) {
  return {.grid = dim3(grid_blocks(work_items, kThreads)), .block = dim3(kThreads)};
}

// A grid-stride loop's first item and step for this thread (kThreads threads a block):
// for (int64_t w = g.first; w < items; w += g.step).
template <int kThreads>
struct GridStride {
  int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
};

// The copy kernels' traits (strided copy, row gather, cache write): the unit one access moves and the block size.
template <typename CopyUnit, int kThreadsPerBlock>
struct CopyUnitTraits {
  static_assert(sizeof(CopyUnit) <= 16, "at most 16-byte accesses");
  using Unit = CopyUnit;
  static constexpr int kThreads = kThreadsPerBlock;
};

// Copies `row_bytes` bytes from src to dst with the block's threads, `Unit` bytes at a time (row_bytes, src and dst
// are multiples of sizeof(Unit)).
template <typename Unit>
__device__ __forceinline__ void copy_row(const void* src, void* dst, int64_t row_bytes) {
  const auto* s = static_cast<const Unit*>(src);
  auto* d = static_cast<Unit*>(dst);
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) d[u] = s[u];
}

// The widest of 16, 8, 4, 2 or 1 bytes that divides the row size and both base addresses. Rows of a contiguous
// [rows, row_bytes] tensor then all share that alignment.
inline int copy_unit_bytes(const void* src, const void* dst, int64_t row_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                         static_cast<uintptr_t>(row_bytes);
  for (int unit = 16; unit > 1; unit /= 2) {
    if (bits % static_cast<uintptr_t>(unit) == 0) return unit;
  }
  return 1;
}

// Calls f(Unit{}) with the unsigned type of `unit_bytes` (16: uint4, 8: uint2, 4, 2 or 1 byte).
template <typename F>
void dispatch_copy_unit(int unit_bytes, F&& f) {
  switch (unit_bytes) {
    case 16: f(uint4{}); return;
    case 8: f(uint2{}); return;
    case 4: f(uint32_t{}); return;
    case 2: f(uint16_t{}); return;
    default: f(uint8_t{}); return;
  }
}

// Calls f(T{}) with T = float or __nv_bfloat16 for the activation dtype; throws for any other dtype.
template <typename F>
void dispatch_activation(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    default: DI_CHECK(false, op, ": activations must be float32 or bfloat16, got ", dtype_name(dtype));
  }
}

}  // namespace deepinfer::cuda
