// The CUDA backend: the op interface of backend.h on one GPU. Activations and weights are bfloat16 (float32 is
// accepted too, for the shared op tests), with fp32 accumulation; norm weights are float32. Every op is queued on the
// backend's own stream, takes its outputs and its index arrays (token ids, positions, slots, attention metadata) as
// device tensors from the caller, and neither allocates per call nor synchronizes with the host. Memory comes from
// the backend's own stream-ordered pool (empty(), zeros(), upload()); copy_to_host() is the one synchronizing call.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/runtime/tuning.h"

namespace deepinfer {

namespace cuda {
class CudaContext;
}  // namespace cuda

// Makes `device_index` the calling thread's current device and builds the backend on it (its stream, memory pool,
// cuBLAS handle and workspaces), with the tuning record the environment asks for (cuda::CudaTuning::from_env, read
// once here) or the one given. Ops must later be called from a thread whose current device is that one.
// Throws deepinfer::Error when the device does not exist or CUDA cannot be initialized.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);
std::unique_ptr<Backend> make_cuda_backend(int device_index, const cuda::CudaTuning& tuning);

// The context of a backend make_cuda_backend built: for code beside the ops that queues work on the backend's stream
// (the NCCL communicator) and must tell its launch ledger. Throws deepinfer::Error for any other backend.
cuda::CudaContext& cuda_context_of(Backend& backend);

}  // namespace deepinfer
