// Kernels of fp8_convert.cuh. All are memory-bound loops: a thread widens 16 codes (one 16-byte load), a warp quantizes
// one 128-channel block of one token (four values a lane, the block's amax by shuffles), a CTA rescales one token's
// row into fp16 (its amax over the row, then the row again from L1).
#include "backend/cuda/gemm/fp8_convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlock = 128;

struct DequantizeArgs {
  const uint8_t* codes;
  const float* scale_inv;
  int64_t first_row, rows, k;
  void* out;
  bool out_f32;
};

__global__ void __launch_bounds__(kThreads) dequantize_fp8_rows_kernel(const __grid_constant__ DequantizeArgs a) {
  // The output is a workspace that the GEMM of the previous chunk may still read: wait before touching it.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t k_blocks = (a.k + kBlock - 1) / kBlock;
  if (a.k % 16 != 0) {  // rows not whole vectors: one element a thread
    for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < a.rows * a.k; e += int64_t{gridDim.x} * kThreads) {
      const int64_t r = e / a.k, c = e % a.k, row = a.first_row + r;
      const auto code = static_cast<__nv_fp8_storage_t>(a.codes[row * a.k + c]);
      const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))) *
                      a.scale_inv[(row / kBlock) * k_blocks + c / kBlock];
      if (a.out_f32) {
        static_cast<float*>(a.out)[e] = v;
      } else {
        static_cast<__nv_bfloat16*>(a.out)[e] = __float2bfloat16_rn(v);
      }
    }
    return;
  }
  const int64_t vectors_per_row = a.k / 16, total = a.rows * vectors_per_row;
  for (int64_t v = blockIdx.x * int64_t{kThreads} + threadIdx.x; v < total; v += int64_t{gridDim.x} * kThreads) {
    const int64_t r = v / vectors_per_row, c = (v % vectors_per_row) * 16, row = a.first_row + r;
    const uint4 packed = __ldg(reinterpret_cast<const uint4*>(a.codes + row * a.k + c));
    const float scale = __ldg(a.scale_inv + (row / kBlock) * k_blocks + c / kBlock);
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    float values[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const auto code = static_cast<__nv_fp8_storage_t>((words[i] >> (8 * j)) & 0xffu);
        const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);  // exact: e4m3 is a subset of fp16
        values[4 * i + j] = __half2float(__half(h)) * scale;
      }
    }
    const int64_t o = r * a.k + c;
    if (a.out_f32) {
      auto* out = reinterpret_cast<float4*>(static_cast<float*>(a.out) + o);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[i] = make_float4(values[4 * i], values[4 * i + 1], values[4 * i + 2], values[4 * i + 3]);
      }
    } else {
      uint32_t bits[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(values[2 * i], values[2 * i + 1]);
        bits[i] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      auto* out = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.out) + o);
      out[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
      out[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
    }
  }
}

struct QuantizeArgs {
  const void* x;
  bool x_f32;
  int64_t tokens, k;
  uint8_t* codes;
  float* scale;
};

__global__ void __launch_bounds__(kThreads) quantize_fp8_activations_kernel(const __grid_constant__ QuantizeArgs a) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t k_blocks = a.k / kBlock, total = a.tokens * k_blocks;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  for (int64_t item = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32; item < total; item += warps) {
    const int64_t t = item / k_blocks, b = item % k_blocks;
    const int64_t first = t * a.k + b * kBlock + lane * 4;
    float v[4];
    if (a.x_f32) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + first));
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const uint2 bits = __ldg(reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(a.x) + first));
      const auto lo = *reinterpret_cast<const __nv_bfloat162*>(&bits.x);
      const auto hi = *reinterpret_cast<const __nv_bfloat162*>(&bits.y);
      v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inv = 1.0f / scale;
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE,
                                                             __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE,
                                                             __NV_E4M3);
    *reinterpret_cast<uint32_t*>(a.codes + first) = uint32_t{lo} | (uint32_t{hi} << 16);
    if (lane == 0) a.scale[b * a.tokens + t] = scale;
  }
}

struct RescaleArgs {
  const uint16_t* x;
  int64_t k, row_stride;
  uint16_t* out;
  float* unscale;
};

__device__ __forceinline__ __nv_bfloat162 as_bf16x2(uint32_t bits) { return *reinterpret_cast<__nv_bfloat162*>(&bits); }

// The exponent e of rescale_activations_to_f16 for a row whose largest magnitude is amax: 2^(15 - frexp exponent),
// kept where both 2^e and 2^-e are normal floats.
__device__ __forceinline__ int rescale_exponent(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 0;
  int exponent = 0;
  frexpf(amax, &exponent);  // amax = m * 2^exponent, m in [0.5, 1)
  return min(max(15 - exponent, -126), 126);
}

__global__ void __launch_bounds__(kThreads) rescale_to_f16_kernel(const __grid_constant__ RescaleArgs a) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  __shared__ float warp_amax[kThreads / 32];
  const int64_t t = blockIdx.x, vectors = a.k / 8;
  const auto* row = reinterpret_cast<const uint4*>(a.x + t * a.row_stride);
  __nv_bfloat162 amax2 = __float2bfloat162_rn(0.0f);
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    const uint4 p = __ldg(row + v);
    amax2 = __hmax2(amax2, __hmax2(__hmax2(__habs2(as_bf16x2(p.x)), __habs2(as_bf16x2(p.y))),
                                   __hmax2(__habs2(as_bf16x2(p.z)), __habs2(as_bf16x2(p.w)))));
  }
  float amax = fmaxf(__low2float(amax2), __high2float(amax2));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  const int e = rescale_exponent(amax);
  const float scale = ldexpf(1.0f, e);
  if (threadIdx.x == 0) a.unscale[t] = ldexpf(1.0f, -e);
  auto* out = reinterpret_cast<uint4*>(a.out + t * a.k);
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    const uint4 p = __ldg(row + v);
    const uint32_t in[4] = {p.x, p.y, p.z, p.w};
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(as_bf16x2(in[i]));
      const __half2 pair = __floats2half2_rn(f.x * scale, f.y * scale);
      h[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    out[v] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

unsigned grid_for(int64_t items, int64_t per_cta) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + per_cta - 1) / per_cta, 1, 132 * 16));
}

}  // namespace

void rescale_activations_to_f16(const uint16_t* x, int64_t tokens, int64_t k, int64_t row_stride, uint16_t* out,
                                float* unscale, LaunchStream stream) {
  DI_CHECK(tokens > 0 && tokens <= INT32_MAX && k > 0 && k % 8 == 0 && row_stride % 8 == 0 &&
               reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
           "rescale_activations_to_f16: ", tokens, " tokens of K ", k, " (row stride ", row_stride,
           "): needs K and the stride multiples of 8 and 16-byte aligned rows");
  const RescaleArgs args{.x = x, .k = k, .row_stride = row_stride, .out = out, .unscale = unscale};
  launch_pdl(rescale_to_f16_kernel, {.grid = dim3(static_cast<unsigned>(tokens)), .block = dim3(kThreads)}, stream,
             args);
}

void dequantize_fp8_rows(const uint8_t* codes, const float* scale_inv, int64_t first_row, int64_t rows, int64_t k,
                         void* out, bool out_f32, LaunchStream stream) {
  DI_CHECK(rows > 0 && k > 0 && (k % 16 != 0 || (reinterpret_cast<uintptr_t>(codes) % 16 == 0 &&
                                                   reinterpret_cast<uintptr_t>(out) % 16 == 0)),
           "dequantize_fp8_rows: ", rows, " rows of K ", k, ": rows of whole 16-byte vectors must be aligned");
  const DequantizeArgs args{.codes = codes, .scale_inv = scale_inv, .first_row = first_row, .rows = rows, .k = k,
                            .out = out, .out_f32 = out_f32};
  launch_pdl(dequantize_fp8_rows_kernel, {.grid = dim3(grid_for(rows * std::max<int64_t>(k / 16, 1), kThreads)), .block = dim3(kThreads)},
             stream, args);
}

void quantize_fp8_activations(const void* x, bool x_f32, int64_t tokens, int64_t k, uint8_t* codes, float* scale,
                              LaunchStream stream) {
  DI_CHECK(tokens > 0 && k > 0 && k % kBlock == 0, "quantize_fp8_activations: ", tokens, " tokens of K ", k,
           ": needs K a multiple of ", kBlock);
  const QuantizeArgs args{.x = x, .x_f32 = x_f32, .tokens = tokens, .k = k, .codes = codes, .scale = scale};
  launch_pdl(quantize_fp8_activations_kernel,
             {.grid = dim3(grid_for(tokens * (k / kBlock), kThreads / 32)), .block = dim3(kThreads)}, stream, args);
}

}  // namespace deepinfer::cuda
