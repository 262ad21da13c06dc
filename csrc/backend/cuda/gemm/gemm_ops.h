// GEMMs on CUDA: the dense projections (linear, linear_silu_mul, multi_linear) and the absorbed decode's per-head
// products (head_linear).
//
// How they run. Decode-sized bfloat16 projections go to the skinny GEMM (skinny_gemm.cu: weights streamed once
// through mma.sync with the tokens as the MMA's narrow side, several products of one x in one launch, the SiLU gate as
// an epilogue) wherever the rule in linear_op.cpp (use_skinny) allows and the kernel takes the operands; every other
// product is one cuBLAS GEMM (the row-major operands seen column-major), and linear_silu_mul / multi_linear fall back
// to the ops they stand for. head_linear runs on the per-head GEMV (head_gemv.cu: weights loaded before the grid
// dependency wait, so they overlap the previous kernel) at decode sizes, and on cuBLAS's strided batched GEMM
// otherwise. Each entry point checks its arguments on the host and queues its kernels on the context's stream.
#pragma once

#include "backend/ops/dense.h"

namespace deepinfer::cuda {

class CudaContext;

void linear(CudaContext& ctx, const LinearArgs& a);
void linear_silu_mul(CudaContext& ctx, const LinearSiluMulArgs& a);
void multi_linear(CudaContext& ctx, const MultiLinearArgs& a);
void head_linear(CudaContext& ctx, const HeadLinearArgs& a);

}  // namespace deepinfer::cuda
