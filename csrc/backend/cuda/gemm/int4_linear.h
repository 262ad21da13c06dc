// Packed 4-bit (INT4 or FP4) weight products on CUDA past the skinny kernel's reach (prefill-sized token counts,
// float32 activations, K or group sizes it does not take): out (+)= x · dequant(w)^T for a packed w (core/weight.h),
// the weight widened a chunk of rows at a time into x's dtype for the dense cuBLAS GEMM (dequantized_linear.h). At
// M = 4096 the widening reads the 4-bit bytes and writes bf16 ones once, a few percent of the GEMM's time.
#pragma once

#include "core/tensor.h"
#include "core/weight.h"

namespace deepinfer::cuda {

class CudaContext;

// x [M, K] bf16 or float32, out [M, N] x's dtype or float32 (accumulate: out += the product).
void int4_linear_prefill(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                         bool accumulate);

}  // namespace deepinfer::cuda
