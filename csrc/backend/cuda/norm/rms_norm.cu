// RMSNorm kernel: one block per row. Each thread sums the squares of a strided slice of the row in fp32, the block
// reduces them (warp shuffles, then one value per warp through shared memory), and the threads scale their slice
// (rms_norm_row.cuh, which mla_prepare's kernel shares).
#include "backend/cuda/norm/rms_norm.cuh"

#include <cuda_bf16.h>

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "backend/cuda/norm/rms_norm_params.h"
#include "backend/cuda/norm/rms_norm_row.cuh"

namespace deepinfer::cuda {
namespace {

template <int kThreadsPerBlock>
struct RmsNormTraits {
  static constexpr int kThreads = kThreadsPerBlock;
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) rms_norm_kernel(__grid_constant__ const RmsNormParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t row = blockIdx.x;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x) + row * p.x_row_stride;
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out) + row * p.out_row_stride;
  rms_norm_row<Traits::kThreads>(x, p.weight, p.dim, p.eps, [&](int64_t i, __nv_bfloat16 v) { out[i] = v; });
}

template <typename Traits>
void launch(const RmsNormParams& p, LaunchStream stream) {
  launch_pdl(rms_norm_kernel<Traits>, {.grid = dim3(static_cast<unsigned>(p.rows)), .block = dim3(Traits::kThreads)},
             stream, p);
}

void launch_rms_norm(const RmsNormParams& p, LaunchStream stream) {
  if (rms_norm_block_threads(p.dim) == 128) {
    launch<RmsNormTraits<128>>(p, stream);
  } else {
    launch<RmsNormTraits<512>>(p, stream);
  }
}

}  // namespace

void rms_norm(const RmsNormArgs& a, LaunchStream stream) {
  DI_CHECK(a.x.dtype == DType::kBF16 && a.out.dtype == DType::kBF16 && a.weight.dtype == DType::kF32,
           "cuda rms_norm: x and out must be bfloat16 and weight float32, got ", dtype_name(a.x.dtype), ", ",
           dtype_name(a.out.dtype), " and ", dtype_name(a.weight.dtype));
  DI_CHECK(a.x.device == Device::kCuda && a.out.device == Device::kCuda && a.weight.device == Device::kCuda,
           "cuda rms_norm: x, weight and out must be in device memory");
  DI_CHECK(a.x.shape.ndim() == 2 && a.out.shape == a.x.shape && a.weight.numel() == a.x.shape[1],
           "cuda rms_norm: x ", a.x.shape.str(), " weight ", a.weight.shape.str(), " out ", a.out.shape.str());
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  DI_CHECK(a.row_stride == 0 || a.row_stride >= dim, "cuda rms_norm: row stride ", a.row_stride, " < row size ", dim);
  DI_CHECK(rows <= INT_MAX, "cuda rms_norm: ", rows, " rows exceed the grid");
  if (rows == 0 || dim == 0) return;
  const int64_t stride = a.row_stride == 0 ? dim : a.row_stride;
  launch_rms_norm({.x = static_cast<const uint16_t*>(a.x.data), .weight = static_cast<const float*>(a.weight.data),
                   .out = static_cast<uint16_t*>(a.out.data), .rows = rows, .dim = dim, .x_row_stride = stride,
                   .out_row_stride = stride, .eps = a.eps},
                  stream);
}

}  // namespace deepinfer::cuda
