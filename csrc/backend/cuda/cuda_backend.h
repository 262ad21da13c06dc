// The CUDA backend: the op interface of backend.h on one GPU. Activations and weights are bfloat16 (float32 is
// accepted too, for the shared op tests), with fp32 accumulation; norm weights are float32. Every op is queued on the
// backend's own stream, takes its outputs from the caller, and neither allocates nor synchronizes with the host --
// except, for now, the ops whose arguments still carry host arrays (embedding, rope, mla_cache_write): they copy
// those to the device through a staging buffer the backend owns (grown when a larger batch comes).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace deepinfer {

// Makes `device_index` the calling thread's current device and builds the backend on it (its stream, its cuBLAS
// handle and workspace). Ops must later be called from a thread whose current device is that one.
// Throws deepinfer::Error when the device does not exist or CUDA cannot be initialized.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);

}  // namespace deepinfer
