// Strided 2-D copy on CUDA: a column block of one row-major tensor into a column block of another (both in device
// memory, one element type), like the rotated q_pe into the absorbed decode's query.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/copy.h"

namespace deepinfer::cuda {

// Checks the views (device, dtypes, shapes, strides; throws deepinfer::Error) and queues the kernel on `stream`.
void copy_strided(const CopyStridedArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
