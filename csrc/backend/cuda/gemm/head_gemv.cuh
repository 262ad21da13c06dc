// Per-head GEMV on CUDA: the absorbed decode's products by W_UK and W_UV (head_linear) for a few tokens, in one
// kernel whose weight loads come before its wait on the previous kernel (programmatic dependent launch), so they
// overlap that kernel instead of following it as cuBLAS's launches do.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/gemm/head_gemv_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// Whether the kernel takes these shapes: 1..kHeadGemvMaxTokens tokens, K = 64, 128, 256 or 512, N a multiple of the
// rows one warp computes (16 / 8 / 4 / 4 for those K), 16-byte aligned x and w rows, and a grid that fits on the
// device in one wave (V2-Lite's 16 heads; not V3's 128, which stay on cuBLAS).
bool head_gemv_fits(const HeadGemvParams& p);

// Queues the kernel on `stream`; throws deepinfer::Error when !head_gemv_fits(p).
void head_gemv(const HeadGemvParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
