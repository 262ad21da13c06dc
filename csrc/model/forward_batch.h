// One step's flat batch: the tokens of all scheduled sequences concatenated, no padding.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer {

// Decode sequences (one query token each) come first: rows [0, num_decode_seqs) are their tokens, so the absorbed
// decode path and the decompressing prefill path each see a contiguous range of sequences.
//
// Host vectors, filled by the model runner. The model uploads them to the backend's device once per forward
// (DeepseekModel::upload_step) after validate() has checked every value on the host: device ops do not re-check.
// The sampling inputs of the rows of logits_indices (backend/ops/sample.h), uploaded with the index arrays.
struct SamplingBatch {
  std::vector<int32_t> rows;            // [N * kSamplingRowWords]: the SamplingRow of each logits row
  std::vector<int32_t> penalty_tokens;  // [P]
  std::vector<int32_t> penalty_counts;  // [P]
  std::vector<int32_t> masked_tokens;   // [M]
};

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
  // A bound on the decode sequences' contexts given to the attention kernel instead of their longest (0 = the
  // longest): a recorded graph keeps the split plan it was recorded with, so it is recorded for a bound.
  int32_t decode_context_bound = 0;
  SamplingBatch sampling;               // empty when nothing samples from this step's logits on the device

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  // Every sequence decodes one token (no prefill chunk): the steps decode graphs serve.
  bool is_pure_decode() const { return num_seqs() > 0 && num_decode_seqs == num_seqs() && num_tokens() == num_seqs(); }
  // The longest context among sequences [first, first + count).
  int32_t max_context_len(int32_t first, int32_t count) const;

  // Throws on inconsistent sizes or any value out of range: token ids, slots and the used page-table entries of a
  // cache of `num_pages` pages of `page_size` tokens, query starts, context lengths, logits rows.
  void validate(int32_t vocab_size, int32_t num_pages, int32_t page_size) const;
};

}  // namespace deepinfer
