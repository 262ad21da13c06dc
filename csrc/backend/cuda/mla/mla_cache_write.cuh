// Writes this step's latent rows into the paged latent cache on CUDA (device memory, the same element type on both
// sides, normally bfloat16).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/mla.h"

namespace deepinfer::cuda {

// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel. The slots are not read on
// the host: a slot outside the cache is skipped (ForwardBatch::validate checks them before upload).
void mla_cache_write(const MlaCacheWriteArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
