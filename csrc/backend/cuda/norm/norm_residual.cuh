// RMSNorm with the fused residual add on CUDA (the pre-norm step between sublayers), and the float32 RMSNorm.
// Rows float32 or bfloat16 in device memory, weight float32, fp32 math. bfloat16 RMSNorm without a residual is
// rms_norm() in rms_norm.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/dense.h"

namespace deepinfer::cuda {

// residual += x; out = rms_norm(residual) * weight. residual, x and out share one dtype; out may alias x.
// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel on `stream`. With
// trigger_early the kernel lets the next one launch at its start (the backend's launch ledger decides).
void add_rms_norm(const AddRmsNormArgs& a, bool trigger_early, LaunchStream stream);

// RmsNormArgs on float32 rows (row_stride honoured, in place allowed). Throws for other dtypes.
void rms_norm_f32(const RmsNormArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
