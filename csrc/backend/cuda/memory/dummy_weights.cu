// Kernels of dummy_weights.cuh.
#include "backend/cuda/memory/dummy_weights.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/dummy_normal.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/weight.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlock = static_cast<int>(kFp8Block);  // an FP8 scale block's rows and columns
constexpr int kRowsPerStep = kThreads / kBlock;      // rows a CTA's threads cover at once

struct FillArgs {
  void* dst;
  bool bf16;
  dummy_normal::StreamRange range;
  int64_t count;
};

__global__ void __launch_bounds__(kThreads) fill_normal_kernel(const __grid_constant__ FillArgs a) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < a.count; j += int64_t{gridDim.x} * kThreads) {
    const float v = dummy_normal::value_at(a.range, j);
    if (a.bf16) {
      static_cast<__nv_bfloat16*>(a.dst)[j] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(a.dst)[j] = v;
    }
  }
}

struct Fp8FillArgs {
  uint8_t* codes;
  float* scale_inv;
  dummy_normal::StreamRange range;
  int64_t rows, cols;
};

// One CTA a block (blockIdx.x its block column, blockIdx.y its block row). Thread t covers column t % 128 of rows
// t / 128, t / 128 + 2, ... of the block, twice: for the block's amax, then for the codes. Making each value twice
// costs less than holding 64 of them a thread (over 200 registers, one CTA an SM).
__global__ void __launch_bounds__(kThreads) fill_normal_fp8_kernel(const __grid_constant__ Fp8FillArgs a) {
  __shared__ float warp_amax[kThreads / 32];
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t c = int64_t{blockIdx.x} * kBlock + threadIdx.x % kBlock;
  const int64_t r0 = int64_t{blockIdx.y} * kBlock + threadIdx.x / kBlock;
  const int64_t r_end = min(a.rows, int64_t{blockIdx.y} * kBlock + kBlock);
  const auto value_at = [&](int64_t r) {
    return dummy_normal::value(a.range.key, static_cast<uint64_t>(a.range.first + r * a.range.row_stride + c));
  };
  float amax = 0.0f;
  if (c < a.cols) {
    for (int64_t r = r0; r < r_end; r += kRowsPerStep) amax = fmaxf(amax, fabsf(value_at(r)));
  }
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  // The host's rule (quantize_fp8_block_rows): amax / 448, 1 for an all-zero block; exactly rounded division.
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
  if (threadIdx.x == 0) a.scale_inv[int64_t{blockIdx.y} * gridDim.x + blockIdx.x] = scale;
  if (c >= a.cols) return;
  for (int64_t r = r0; r < r_end; r += kRowsPerStep) {
    a.codes[r * a.cols + c] = __nv_cvt_float_to_fp8(__fdiv_rn(value_at(r), scale), __NV_SATFINITE, __NV_E4M3);
  }
}

void check_device(const TensorView& t, const char* what) {
  DI_CHECK(t.device == Device::kCuda || t.numel() == 0, "cuda fill_dummy_normal: ", what, " is not in device memory");
}

void check_range(const dummy_normal::StreamRange& range, const char* op) {
  DI_CHECK(range.first >= 0 && range.row_length > 0 && range.row_stride >= range.row_length, op, ": stream range from ",
           range.first, ", rows of ", range.row_length, " every ", range.row_stride, " values");
}

}  // namespace

void fill_dummy_normal(const TensorView& dst, const dummy_normal::StreamRange& range, LaunchStream stream) {
  check_device(dst, "dst");
  DI_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16, "cuda fill_dummy_normal: dst is ",
           dtype_name(dst.dtype), ", not float32 or bfloat16");
  check_range(range, "cuda fill_dummy_normal");
  const int64_t count = dst.numel();
  if (count == 0) return;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t{1} << 20);
  launch_pdl(fill_normal_kernel, {.grid = dim3(static_cast<unsigned>(blocks)), .block = dim3(kThreads)}, stream,
             FillArgs{.dst = dst.data, .bf16 = dst.dtype == DType::kBF16, .range = range, .count = count});
}

void fill_dummy_normal_fp8(const TensorView& codes, const TensorView& scale_inv, const dummy_normal::StreamRange& range,
                           LaunchStream stream) {
  check_device(codes, "codes");
  check_device(scale_inv, "scale_inv");
  DI_CHECK(codes.dtype == DType::kF8E4M3 && codes.shape.ndim() == 2 && scale_inv.dtype == DType::kF32,
           "cuda fill_dummy_normal_fp8: codes ", dtype_name(codes.dtype), " ", codes.shape.str(), ", scale_inv ",
           dtype_name(scale_inv.dtype), " (e4m3 [rows, cols] and float32 expected)");
  check_range(range, "cuda fill_dummy_normal_fp8");
  const int64_t rows = codes.shape[0], cols = codes.shape[1];
  const int64_t block_rows = fp8_blocks(rows), block_cols = fp8_blocks(cols);
  DI_CHECK(range.row_length == cols, "cuda fill_dummy_normal_fp8: stream rows of ", range.row_length,
           " values for codes ", codes.shape.str());
  DI_CHECK(scale_inv.numel() == block_rows * block_cols, "cuda fill_dummy_normal_fp8: ", scale_inv.numel(),
           " scales for ", codes.shape.str(), " codes in ", kBlock, " x ", kBlock, " blocks");
  DI_CHECK(block_cols <= INT_MAX && block_rows <= 65535, "cuda fill_dummy_normal_fp8: ", codes.shape.str(),
           " is outside the grid");
  if (rows == 0 || cols == 0) return;
  launch_pdl(fill_normal_fp8_kernel,
             {.grid = dim3(static_cast<unsigned>(block_cols), static_cast<unsigned>(block_rows)),
              .block = dim3(kThreads)},
             stream,
             Fp8FillArgs{.codes = static_cast<uint8_t*>(codes.data), .scale_inv = static_cast<float*>(scale_inv.data),
                         .range = range, .rows = rows, .cols = cols});
}

}  // namespace deepinfer::cuda
