// Quantized-weight products past the skinny kernels' reach (prefill-sized token counts, float32 activations): the
// weight widened into x's dtype a chunk of rows at a time, each chunk's dense cuBLAS GEMM writing its columns of out.
// The FP8 (fp8_linear.cpp) and INT4 (int4_linear.cpp) paths share it.
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace deepinfer::cuda {

class CudaContext;

// Queues the widening of weight rows [first_row, first_row + rows) into `buffer` ([rows, K] row-major, float32 when
// `f32`, bf16 otherwise) on the context's stream.
using WidenRows = std::function<void(int64_t first_row, int64_t rows, void* buffer, bool f32)>;

// out [M, n] (+)= x [M, K] · W^T for the [n, K] weight `widen` produces; chunks are multiples of `row_multiple` rows.
// The chunks share one workspace: each widening waits for the GEMM before it (stream order). Throws UnsupportedOp in a
// build without cuBLAS.
void dequantized_linear(CudaContext& ctx, const ConstTensorView& x, int64_t n, const TensorView& out, bool accumulate,
                        int64_t row_multiple, const WidenRows& widen);

}  // namespace deepinfer::cuda
