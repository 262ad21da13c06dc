// RMSNorm on CUDA: rms_norm (rows float32 or bfloat16, a row stride allowed, in place allowed) and add_rms_norm (the
// pre-norm step between sublayers: residual += x, then out = rms_norm(residual)). Weights float32, math fp32.
//
// How they run: one block per row. Each thread sums the squares of a strided slice of the row in fp32, the block
// reduces them, and the threads scale their slice; values a thread read stay in its registers between the two
// passes. bfloat16 rms_norm runs rms_norm.cu (the row code in rms_norm_row.cuh, which mla_prepare's kernel shares, so
// both normalize c_kv to the same bits); float32 rms_norm and add_rms_norm run norm_residual.cu. The entry points
// validate the arguments and queue the kernel on the context's stream.
#pragma once

#include "backend/ops/dense.h"

namespace deepinfer::cuda {

class CudaContext;

void rms_norm(CudaContext& ctx, const RmsNormArgs& a);
void add_rms_norm(CudaContext& ctx, const AddRmsNormArgs& a);

}  // namespace deepinfer::cuda
