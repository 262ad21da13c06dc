// Elementwise ops on CUDA: x += y, and the SiLU-gated activation of the MLPs. Tensors in device memory, float32 or
// bfloat16 (all of one op's tensors the same dtype), fp32 math.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/dense.h"

namespace deepinfer::cuda {

// Check the views (device, dtypes, shapes; throw deepinfer::Error) and queue the kernel on `stream`.
void add(const AddArgs& a, LaunchStream stream);
void silu_mul(const SiluMulArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
