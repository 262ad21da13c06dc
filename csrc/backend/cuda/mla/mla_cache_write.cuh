// Writes this step's latent rows into the paged latent cache on CUDA (device memory): copied when the cache holds the
// latent's element type (normally bfloat16), quantized into FP8 rows (backend/ops/latent_fp8.h) when its dtype is
// kF8E4M3, from float32 or bfloat16 latents of MlaCacheWriteArgs::kv_lora_rank c_kv values.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/mla.h"

namespace deepinfer::cuda {

// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel. The slots are not read on
// the host: a slot outside the cache is skipped (ForwardBatch::validate checks them before upload).
void mla_cache_write(const MlaCacheWriteArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
