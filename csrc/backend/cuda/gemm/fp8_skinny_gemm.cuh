// FP8 skinny GEMM on CUDA (sm_90a): decode-sized token counts against block-scaled FP8 weights, the codes streamed
// from HBM once (half the bytes of a bf16 weight) and widened to fp16 in registers for mma.sync, against the
// activations rescaled into fp16 by a kernel queued just before it. The CUDA backend
// routes FP8 linear, linear_silu_mul and multi_linear here up to kFp8SkinnyMaxTokens tokens when
// fp8_skinny_gemm_fits() holds (fp8_linear.cpp), and to the prefill path otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/gemm/fp8_skinny_gemm_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// Up to 64 tokens, as 1, 2, 4 or 8 MMA column tiles of 8: the weights are read once for all of them.
inline constexpr int64_t kFp8SkinnyMaxTokens = 64;

// Whether the kernel takes these operands: 1..kFp8SkinnyMaxTokens tokens, K a positive multiple of 128, 16-byte
// aligned x rows and weights (codes), 4-byte aligned scales, 1..kFp8SkinnyMaxProblems problems with at least one
// output column each.
bool fp8_skinny_gemm_fits(const Fp8SkinnyGemmParams& p);

// K steps of 64 a warp has in flight (the kernel's unroll), for the host-side tests. Throws deepinfer::Error when
// !fp8_skinny_gemm_fits(p).
int fp8_skinny_gemm_loads_in_flight(const Fp8SkinnyGemmParams& p);

// Queues the two kernels on `stream`: x rescaled into p.x_f16 / p.x_unscale, then the product. Throws
// deepinfer::Error when !fp8_skinny_gemm_fits(p) or those buffers are missing or unaligned.
void fp8_skinny_gemm(const Fp8SkinnyGemmParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
