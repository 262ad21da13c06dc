// INT4 skinny GEMM on CUDA (sm_90a): decode-sized token counts against packed 4-bit weights (W4A16), the codes
// streamed from HBM once (a quarter of a bf16 weight's bytes) and unpacked to bf16 in registers for mma.sync. The CUDA
// backend routes INT4 linear, linear_silu_mul and multi_linear here up to kInt4SkinnyMaxTokens tokens when
// int4_skinny_gemm_fits() holds (linear_op.cpp), and to the dequantizing prefill path (int4_linear.h) otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/gemm/int4_skinny_gemm_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

inline constexpr int64_t kInt4SkinnyMaxTokens = 64;

// Whether the kernel takes these operands: 1..kInt4SkinnyMaxTokens tokens, K a positive multiple of 128, group sizes
// multiples of 32 dividing K, 16-byte aligned x rows and codes, 4-byte aligned scales and zero points,
// 1..kInt4SkinnyMaxProblems problems with at least one output column each.
bool int4_skinny_gemm_fits(const Int4SkinnyGemmParams& p);

// Queues the kernel on `stream`; throws deepinfer::Error when !int4_skinny_gemm_fits(p).
void int4_skinny_gemm(const Int4SkinnyGemmParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
