// Embedding lookup on CUDA: a row gather from the table in device memory (any element type; out has the table's).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/ops/dense.h"

namespace deepinfer::cuda {

// `token_ids` is the device copy of a.token_ids (EmbeddingArgs holds a host span; the ids it names are the ones
// checked). Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the kernel on `stream`.
void embedding(const EmbeddingArgs& a, const int32_t* token_ids, cudaStream_t stream);

}  // namespace deepinfer::cuda
