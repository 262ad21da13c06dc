// The step between the projections and MLA on CUDA, fused into one kernel: kv_a_layernorm of c_kv, rope of q_pe and
// k_pe, the latent-cache write and the decode query's rope columns (MlaPrepareArgs in ops/mla.h defines the op).
// Tensors in device memory; activations float32 or bfloat16, norm weight and inv_freq float32.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/mla.h"

namespace deepinfer::cuda {

// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel on `stream`. Neither reads
// device memory on the host nor allocates, so it can be recorded in a CUDA graph. The slots are not read on the host:
// a slot outside the cache is skipped (ForwardBatch::validate checks them before upload).
void mla_prepare(const MlaPrepareArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
