// A thread widens one packed word (eight inputs of one row) with int4_unpack.cuh's exact (q - z) or e2m1 value, times
// the scale in fp32, rounded once to the output's dtype.
#include "backend/cuda/gemm/int4_dequant.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/gemm/int4_unpack.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;

struct DequantArgs {
  const uint32_t* words;
  const float* scales;
  const int32_t* zeros;
  int64_t first_row, rows, k_dim, group_size;
  void* out;
  bool out_f32;
};

template <bool kE2m1>
__global__ void __launch_bounds__(kThreads) dequantize_int4_kernel(const __grid_constant__ DequantArgs a) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t row_words = a.k_dim / 8, groups = a.k_dim / a.group_size, zero_words = (groups + 7) / 8;
  const int64_t total = a.rows * row_words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / row_words, w = i % row_words, row = a.first_row + r, g = w * 8 / a.group_size;
    const uint32_t z = kE2m1 ? 0u : int4::zero_of_group(a.zeros == nullptr ? nullptr : a.zeros + row * zero_words, g);
    uint32_t pairs[4];
    int4::unpack8_codes<kE2m1>(__ldg(a.words + row * row_words + w), int4::zero_pair(z), pairs);
    const float s = __ldg(a.scales + row * groups + g);
    float v[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&pairs[j]);
      v[2 * j] = __low2float(pair) * s;
      v[2 * j + 1] = __high2float(pair) * s;
    }
    const int64_t at = r * a.k_dim + w * 8;
    if (a.out_f32) {
      float4* dst = reinterpret_cast<float4*>(static_cast<float*>(a.out) + at);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 packed;
      uint32_t* p = &packed.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        p[j] = *reinterpret_cast<const uint32_t*>(&b);
      }
      *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.out) + at) = packed;
    }
  }
}

}  // namespace

void dequantize_int4_rows(const uint32_t* words, const float* scales, const int32_t* zeros, int64_t first_row,
                          int64_t rows, int64_t k_dim, int64_t group_size, void* out, bool out_f32,
                          LaunchStream stream, bool e2m1) {
  DI_CHECK(k_dim > 0 && k_dim % 8 == 0 && group_size > 0 && group_size % 8 == 0 && k_dim % group_size == 0,
           "dequantize_int4_rows: K ", k_dim, " and group size ", group_size, " must be multiples of 8, the group ",
           "dividing K");
  if (rows <= 0) return;
  const int64_t total = rows * (k_dim / 8);
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{132} * 16);
  const DequantArgs args{words, scales, zeros, first_row, rows, k_dim, group_size, out, out_f32};
  const LaunchShape shape{.grid = dim3(static_cast<unsigned>(blocks)), .block = dim3(kThreads)};
  if (e2m1) {
    launch_pdl(dequantize_int4_kernel<true>, shape, stream, args);
  } else {
    launch_pdl(dequantize_int4_kernel<false>, shape, stream, args);
  }
}

}  // namespace deepinfer::cuda
