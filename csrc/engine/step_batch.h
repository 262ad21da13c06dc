// One step's batch as the engine builds it: the flat arrays of every scheduled sequence (ForwardBatch, built by
// ForwardBatchBuilder), the sampling inputs of the rows that sample, the packing of all of them into one buffer for
// one host-to-device copy, and the device views the model and the sampler take of that buffer.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "backend/ops/sample.h"
#include "engine/grammar/grammar_matcher.h"
#include "model/model_inputs.h"

namespace deepinfer {

// The sampling inputs of the rows of logits_indices (backend/ops/sample.h), uploaded with the index arrays.
struct SamplingBatch {
  std::vector<int32_t> rows;            // [N * kSamplingRowWords]: the SamplingRow of each logits row
  std::vector<int32_t> penalty_tokens;  // [P]
  std::vector<int32_t> penalty_counts;  // [P]
  std::vector<int32_t> masked_tokens;   // [M]
  // Structured outputs: the matchers whose masks are the rows of the sampler's allowed_tokens (SamplingRow::
  // allowed_row indexes this), each after the draft tokens its row follows (a verification row samples as if the
  // drafts before it were accepted). A request's rows come together, fewest drafts first. Host-side only: the step
  // fills their masks, rank 0 samples.
  struct GrammarRow {
    GrammarMatcher* matcher = nullptr;
    std::span<const int32_t> after;  // drafts the grammar allows (the scheduler kept only those)
  };
  std::vector<GrammarRow> grammars;
  // Or the masks themselves, filled elsewhere: a data-parallel rank's lane's, which rank 0 (holding the matchers)
  // fills and sends with the step. Rows of allowed_token_words(vocab) words.
  std::vector<int32_t> given_masks;
};

// The tokens of all scheduled sequences concatenated, no padding. Decode sequences (one query token each) come
// first: rows [0, num_decode_seqs) are their tokens, so the absorbed decode path and the decompressing prefill path
// each see a contiguous range of sequences.
//
// Host vectors. They go to the device once per step (pack_step, then bind_step over the uploaded buffer) after
// validate() has checked every value on the host: device ops do not re-check.
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
  // Data-parallel attention: the most tokens any rank computes this step (the MoE layers pad to it); 0 otherwise.
  int32_t dp_max_tokens = 0;

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

// Lays out a ForwardBatch one sequence at a time: the one place that derives a sequence's slots, query range,
// context length, page-table row and logits row from its tokens and pages. A sequence of one token takes the
// absorbed decode path, so those come first.
class ForwardBatchBuilder {
 public:
  // Throws unless page_size > 0 and max_pages_per_seq >= 0.
  ForwardBatchBuilder(int32_t page_size, int32_t max_pages_per_seq);

  // Appends a sequence that computes its tokens [start, start + tokens.size()) this step, with the latents of token
  // i in pages[i / page_size] (its page table, at most max_pages_per_seq pages; the rest of its row is -1). The
  // logits of positions [scored.first, scored.first + scored.second) are wanted (a prompt being scored), then, when
  // `samples`, those of its last token. Throws on an empty chunk, too few or too many pages, scored positions
  // outside the chunk or overlapping the sampled one, or a one-token sequence after a longer one.
  void add(std::span<const int32_t> tokens, int32_t start, std::span<const int32_t> pages, bool samples,
           std::pair<int32_t, int32_t> scored = {0, 0});

  // The batch built; the builder is spent.
  ForwardBatch take() &&;

 private:
  int32_t page_size_;
  ForwardBatch batch_;
};

// The logits rows of a chunk's scored prompt positions: rows [first_row, first_row + count) of the batch's logits
// score the prompt tokens after positions [first_position, first_position + count) of plan.chunks[chunk].
struct ScoredRows {
  size_t chunk = 0;
  int32_t first_row = 0;
  int32_t first_position = 0;
  int32_t count = 0;
};

// A plan's step: its batch (with the sampling inputs of every logits row) and, for each sampling chunk of the plan in
// plan order, its row of the batch's logits, so the sampled tokens can come back in the plan's order; and the rows
// that score prompt tokens.
struct StepBatch {
  ForwardBatch forward;
  std::vector<int32_t> logits_row_of_sample;
  std::vector<ScoredRows> scored;
  // Speculative decoding: a sampling chunk that verifies d drafts samples d + 1 consecutive rows from its
  // logits_row_of_sample on (empty: one row each).
  std::vector<int32_t> rows_of_sample;
  // Where each plan chunk's tokens start among the batch's token rows (plan order): the drafter reads their hidden
  // states.
  std::vector<int32_t> first_token_row;

  int32_t num_rows_of_sample(size_t i) const { return rows_of_sample.empty() ? 1 : rows_of_sample[i]; }
};

// What a step returns: the sampled rows of each sampling chunk (plan order, one each without drafts), and per
// ScoredRows entry its scored tokens.
struct StepResult {
  std::vector<SampledToken> sampled;
  std::vector<std::vector<SampledToken>> scored;
};

// Where each array starts in the packed buffer (elements). The index arrays come first, in an order that depends
// only on the batch's shape (tokens, sequences, page-table width), so a graph recorded for one shape finds them at
// the same place in every later step of that shape; the sampling inputs follow. Every array starts at a multiple of
// kAlignment elements (16 bytes), since kernels load some of them (the sampling rows) as vectors or structs.
struct StepLayout {
  enum Part : uint8_t {
    kTokenIds, kPositions, kSlotMapping, kLogitsIndices, kQueryStart, kContextLens, kPageTable,
    kSamplingRows, kPenaltyTokens, kPenaltyCounts, kMaskedTokens, kNumParts,
  };
  static constexpr int64_t kAlignment = 4;
  std::array<int64_t, kNumParts> start{};
  std::array<int64_t, kNumParts> count{};
  int64_t packed_size = 0;  // elements, padding included

  int64_t begin(Part p) const { return start[p]; }
  int64_t size(Part p) const { return count[p]; }
  int64_t total() const { return packed_size; }
};

// The batch, with its sampling inputs, as int32 words and back: what rank 0 sends the other ranks of a parallel model
// each step. decode_forward_batch throws on malformed words.
std::vector<int32_t> encode_forward_batch(const ForwardBatch& batch);
ForwardBatch decode_forward_batch(std::span<const int32_t> words);

// Appends the batch's arrays to `out` (cleared first) and returns their layout.
StepLayout pack_step(const ForwardBatch& batch, std::vector<int32_t>& out);

// The views of one step's arrays in device memory (or host memory, on the CPU): what the model's layers read, and
// the sampler's inputs.
struct StepInputs {
  ModelInputs model;
  ConstTensorView sampling_rows;   // [N, kSamplingRowWords] (empty without sampling inputs)
  ConstTensorView penalty_tokens;  // [P]
  ConstTensorView penalty_counts;  // [P]
  ConstTensorView masked_tokens;   // [M]
};

// Views of `packed` (laid out by pack_step for `batch`) as the step's inputs.
StepInputs bind_step(ConstTensorView packed, const StepLayout& layout, const ForwardBatch& batch);

}  // namespace deepinfer
