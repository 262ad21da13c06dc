// Device sampling (ops/sample.h): one CTA per row.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/sample.h"

namespace deepinfer::cuda {

// Queues the sampling kernels for args.logits.shape[0] rows on `stream`. Allocates nothing.
void sample(const SampleArgs& args, LaunchStream stream);

}  // namespace deepinfer::cuda
