// Packed 4-bit (INT4 or FP4) weight rows widened for the dense GEMM past the skinny kernel's reach (int4_linear.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// out[r - first_row][k] = (q[r][k] - z[r][k / G]) * scale[r][k / G] for r in [first_row, first_row + rows), bf16
// (out_f32 false) or fp32, row-major [rows, k_dim]; the operands are core/weight.h's (zeros null: symmetric).
// k_dim and group_size multiples of 8. e2m1: FP4 words, out = e2m1(q[r][k]) * scale[r][k / G] (zeros unused).
void dequantize_int4_rows(const uint32_t* words, const float* scales, const int32_t* zeros, int64_t first_row,
                          int64_t rows, int64_t k_dim, int64_t group_size, void* out, bool out_f32,
                          LaunchStream stream, bool e2m1 = false);

}  // namespace deepinfer::cuda
