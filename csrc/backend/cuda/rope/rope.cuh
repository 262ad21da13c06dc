// Rotary position embedding on CUDA, in place, on float32 or bfloat16 elements in device memory (positions and
// inv_freq in device memory too).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/rope/rope_params.h"
#include "backend/cuda/runtime/launch_stream.h"
#include "core/dtype.h"

namespace deepinfer::cuda {

// Checks the parameters (throws deepinfer::Error) and queues the kernel on `stream`. `dtype` is the type of x's
// elements: float32 or bfloat16.
void rope(const RopeParams& p, DType dtype, LaunchStream stream);

}  // namespace deepinfer::cuda
