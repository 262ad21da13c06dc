// Elementwise ops on CUDA: x += y (add) and the MLP's SiLU gate (silu_mul), float32 or bfloat16 in device memory.
//
// How they run: one grid-stride kernel per op (elementwise.cu), over 16-byte vectors of elements when every pointer
// and row allows it and single elements otherwise, fp32 math; memory-bound, one read of each input and one write of
// the output. The entry points validate the arguments and queue the kernel on the context's stream.
#pragma once

#include "backend/ops/dense.h"

namespace deepinfer::cuda {

class CudaContext;

void add(CudaContext& ctx, const AddArgs& a);
void silu_mul(CudaContext& ctx, const SiluMulArgs& a);

}  // namespace deepinfer::cuda
