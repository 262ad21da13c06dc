// RMSNorm on CUDA: out = x / rms(x) * weight for every row; x and out bfloat16 in device memory, weight float32,
// math in fp32. Rows may be `row_stride` elements apart (0 = dim), for both x and out, which may alias (in place).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/dense.h"

namespace deepinfer::cuda {

// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel on `stream`.
void rms_norm(const RmsNormArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
