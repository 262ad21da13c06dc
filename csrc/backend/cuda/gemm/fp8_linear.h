// FP8-weight products on CUDA past the skinny kernel's reach (prefill-sized token counts, float32 activations, K not
// a multiple of 128): out (+)= x · dequant(w)^T for a block-scaled FP8 w (core/weight.h).
//
// W8A8 (w.fp8_activations): x quantized per token per 128 channels (fp8_convert.cuh), then cuBLASLt's FP8 GEMM with
// 128x128 block scales for the weight and 1x128 vector scales for the activations (cuBLAS 12.9+, Hopper). Where
// cuBLASLt has no such kernel (its heuristic returns none, an older cuBLAS, K not a multiple of 512), and always for
// W8A16: the weight dequantized chunk by chunk of rows into x's dtype and the dense cuBLAS GEMM on each chunk.
#pragma once

#include "core/tensor.h"
#include "core/weight.h"

namespace deepinfer::cuda {

class CudaContext;

// x [M, K] bf16 or float32, out [M, N] x's dtype or float32 (accumulate: out += the product). Throws UnsupportedOp in
// a build without cuBLAS.
void fp8_linear_prefill(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                        bool accumulate);

// Whether the W8A8 path found a cuBLASLt kernel for these sizes (false: it dequantizes), for the tests and the
// benchmark. Host-only: asks cuBLASLt's heuristic, queues nothing.
bool fp8_block_scaled_gemm_available(CudaContext& ctx, int64_t m, int64_t n, int64_t k, DType out_dtype);

// Whether this build has the W8A8 path and its GEMM takes this K (a multiple of 512): what the choice between it and
// the skinny kernel checks at decode sizes, without asking cuBLASLt's heuristic each step.
bool fp8_block_scaled_gemm_takes(int64_t k);

}  // namespace deepinfer::cuda
