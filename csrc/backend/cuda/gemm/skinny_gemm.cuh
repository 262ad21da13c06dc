// Skinny GEMM on CUDA (sm_90a): decode-sized token counts against bf16 weights read once at full bandwidth, where
// cuBLAS spends several microseconds of fixed cost per call; several products of the same activations share one
// launch. The CUDA backend routes linear, linear_silu_mul and multi_linear here when its measured rule allows and
// skinny_gemm_fits() holds, and to cuBLAS otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/gemm/skinny_gemm_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// The most tokens the kernel takes: one 8-column MMA tile. (A second tile doubles the activation reads per weight
// byte; at 16 tokens cuBLAS was faster on every shape measured.)
inline constexpr int64_t kSkinnyMaxTokens = 8;

// Whether the kernel takes these operands: 1..kSkinnyMaxTokens tokens, K a positive multiple of 32, 16-byte aligned
// x rows and weights, 1..kSkinnyMaxProblems problems with at least one output column each.
bool skinny_gemm_fits(const SkinnyGemmParams& p);

// How many CTAs (a thread-block cluster) share each block of output tiles, each taking a slice of K: 1 (no split)
// unless the grid would fill less than half of p.num_sms. Throws deepinfer::Error when !skinny_gemm_fits(p).
int skinny_gemm_split(const SkinnyGemmParams& p);

// K steps of 32 a warp has in flight: 4 (the next group loads while the current one multiplies), or 8 when every
// warp's range is 5..8 steps, all of it then loaded before the grid dependency wait. Throws deepinfer::Error when
// !skinny_gemm_fits(p).
int skinny_gemm_loads_in_flight(const SkinnyGemmParams& p);

// Queues the kernel on `stream`; throws deepinfer::Error when !skinny_gemm_fits(p).
void skinny_gemm(const SkinnyGemmParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
