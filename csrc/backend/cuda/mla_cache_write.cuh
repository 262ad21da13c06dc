// Writes this step's latent rows into the paged latent cache on CUDA (device memory, the same element type on both
// sides, normally bfloat16).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/ops/mla.h"

namespace deepinfer::cuda {

// `slot_mapping` is the device copy of a.slot_mapping (MlaCacheWriteArgs holds a host span; the slots it names are
// the ones checked). Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel.
void mla_cache_write(const MlaCacheWriteArgs& a, const int32_t* slot_mapping, cudaStream_t stream);

}  // namespace deepinfer::cuda
