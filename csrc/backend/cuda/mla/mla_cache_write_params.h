// Parameters of the latent-cache write: cache row slot_mapping[t] = latent row t, for every token t. Rows are copied
// as bytes (the cache holds the latent's element type). A slot outside [0, num_slots) is skipped: -1 marks a
// padding token, as in other engines (slots are validated on the host before they are uploaded).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct MlaCacheWriteParams {
  const void* latent = nullptr;           // [num_tokens, row_bytes]: c_kv | k_pe
  void* cache = nullptr;                  // [num_slots, row_bytes] = [num_pages, page_size, latent_dim]
  const int32_t* slot_mapping = nullptr;  // [num_tokens], device memory: page * page_size + offset
  int64_t num_tokens = 0;
  int64_t num_slots = 0;
  int64_t row_bytes = 0;                  // latent_dim * element size
};

}  // namespace deepinfer::cuda
