// Row gathers on CUDA: the embedding lookup and gather_rows, from a table in device memory (any element type; out
// has the table's), by int32 ids in device memory.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/launch_stream.h"
#include "backend/ops/copy.h"
#include "backend/ops/dense.h"

namespace deepinfer::cuda {

// Check the views (device, dtypes, shapes; throw deepinfer::Error) and queue the kernel on `stream`. The ids are not
// read on the host: an id outside the table gives a zero row (ForwardBatch::validate checks them before upload).
void embedding(const EmbeddingArgs& a, LaunchStream stream);
void gather_rows(const GatherRowsArgs& a, LaunchStream stream);

}  // namespace deepinfer::cuda
