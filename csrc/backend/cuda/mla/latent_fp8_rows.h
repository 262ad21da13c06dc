// The host side of the CUDA kernels that write or read FP8 latent cache rows (backend/ops/latent_fp8.h): the checks
// of a cache in that layout, and the row offsets the kernels take.
#pragma once

#include <cstdint>

#include "backend/cuda/mla/latent_fp8_row_params.h"
#include "backend/ops/latent_fp8.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

// The layout of `cache` ([num_pages, page_size, row_bytes], dtype kF8E4M3), whose rows hold latent rows of
// kv_lora_rank `rank` and `rope_dim` rope values. Throws deepinfer::Error naming the values when the rows are not the
// FP8 layout of that rank and rope width, and UnsupportedOp past the kernels' kv_lora_rank (16 groups of 128: 2048).
LatentFp8Layout checked_fp8_latent_layout(const ConstTensorView& cache, int64_t rank, int64_t rope_dim,
                                          const char* op);

// The offsets a kernel takes for rows of `layout`.
LatentFp8RowParams fp8_row_params(const LatentFp8Layout& layout);

}  // namespace deepinfer::cuda
