// Parameters of the latent-cache write: cache row slot_mapping[t] = latent row t, for every token t. Rows are copied
// as bytes when the cache holds the latent's element type (MlaCacheWriteParams), or quantized into the FP8 row layout
// (MlaCacheWriteFp8Params, backend/ops/latent_fp8.h). A slot outside [0, num_slots) is skipped: -1 marks a padding
// token, as in other engines (slots are validated on the host before they are uploaded).
#pragma once

#include <cstdint>

#include "backend/cuda/mla/latent_fp8_row_params.h"

namespace deepinfer::cuda {

struct MlaCacheWriteParams {
  const void* latent = nullptr;           // [num_tokens, row_bytes]: c_kv | k_pe
  void* cache = nullptr;                  // [num_slots, row_bytes] = [num_pages, page_size, latent_dim]
  const int32_t* slot_mapping = nullptr;  // [num_tokens], device memory: page * page_size + offset
  int64_t num_tokens = 0;
  int64_t num_slots = 0;
  int64_t row_bytes = 0;                  // latent_dim * element size
};

struct MlaCacheWriteFp8Params {
  const void* latent = nullptr;           // [num_tokens, rank + rope_dim], float32 or bfloat16 (the kernel's type)
  uint8_t* cache = nullptr;               // [num_slots, row.row_bytes] = [num_pages, page_size, row_bytes]
  const int32_t* slot_mapping = nullptr;  // [num_tokens], device memory: page * page_size + offset
  int64_t num_tokens = 0;
  int64_t num_slots = 0;
  LatentFp8RowParams row;
};

}  // namespace deepinfer::cuda
