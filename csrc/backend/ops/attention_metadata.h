// What attention ops need to find each sequence's queries and its pages in the latent cache.
#pragma once

#include <cstdint>
#include <span>

namespace deepinfer {

// Sequences [0, num_seqs) of a flat batch. Sequence s owns query rows [query_start[s], query_start[s+1]) and,
// after this step's cache write, `context_lens[s]` cached tokens; its query i sits at absolute position
// context_lens[s] - num_queries + i. Page p of sequence s is page_table[s * max_pages_per_seq + p].
struct AttentionMetadata {
  std::span<const int32_t> query_start;   // [num_seqs + 1]
  std::span<const int32_t> context_lens;  // [num_seqs]
  std::span<const int32_t> page_table;    // [num_seqs, max_pages_per_seq]
  int32_t max_pages_per_seq = 0;
  int32_t num_seqs = 0;
  int32_t seq_offset = 0;  // these are sequences [seq_offset, seq_offset + num_seqs) of the whole batch

  int32_t num_queries(int32_t s) const { return query_start[s + 1] - query_start[s]; }
  int32_t page(int32_t s, int32_t p) const { return page_table[static_cast<size_t>(s) * max_pages_per_seq + p]; }
};

}  // namespace deepinfer
