// Parameters of the row gather (embedding, gather_rows): out[t, :] = table[token_ids[t] - first_row, :]. Rows are
// copied as bytes, so any element type works; an id outside [first_row, first_row + vocab) gives a zero row (another
// rank's shard of the vocabulary; ids are validated on the host before they are uploaded).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct EmbeddingParams {
  const int32_t* token_ids = nullptr;  // [num_tokens], device memory
  const void* table = nullptr;         // [vocab, row_bytes]
  void* out = nullptr;                 // [num_tokens, row_bytes]
  int64_t num_tokens = 0;
  int64_t vocab = 0;
  int64_t row_bytes = 0;               // bytes of one row: dim * element size
  int64_t first_row = 0;               // the vocabulary row the table's row 0 is
};

}  // namespace deepinfer::cuda
