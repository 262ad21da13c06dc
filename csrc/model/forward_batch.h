// One step's flat batch: the tokens of all scheduled sequences concatenated, no padding.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops/attention_metadata.h"

namespace deepinfer {

// Decode sequences (one query token each) come first: rows [0, num_decode_seqs) are their tokens, so the absorbed
// decode path and the decompressing prefill path each see a contiguous range of sequences.
struct ForwardBatch {
  std::vector<int32_t> token_ids;       // [T]
  std::vector<int32_t> positions;       // [T]
  std::vector<int32_t> slot_mapping;    // [T]  page_id * page_size + offset: where each token's latent goes
  std::vector<int32_t> query_start;     // [S + 1]
  std::vector<int32_t> context_lens;    // [S]  cached tokens after this step's write
  std::vector<int32_t> page_table;      // [S, max_pages_per_seq], unused slots -1
  int32_t max_pages_per_seq = 0;
  int32_t num_decode_seqs = 0;
  std::vector<int32_t> logits_indices;  // rows whose next-token logits are wanted

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }

  // Metadata of sequences [first, first + count).
  AttentionMetadata attention(int32_t first, int32_t count) const {
    return {.query_start = std::span<const int32_t>(query_start).subspan(static_cast<size_t>(first)),
            .context_lens = std::span<const int32_t>(context_lens).subspan(static_cast<size_t>(first)),
            .page_table = std::span<const int32_t>(page_table)
                              .subspan(static_cast<size_t>(first) * static_cast<size_t>(max_pages_per_seq)),
            .max_pages_per_seq = max_pages_per_seq,
            .num_seqs = count,
            .seq_offset = first};
  }

  void validate(int32_t vocab_size) const;  // throws on inconsistent sizes or out-of-range ids
};

}  // namespace deepinfer
