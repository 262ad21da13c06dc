#include "engine/step_batch.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "backend/ops/sample.h"
#include "core/error.h"

namespace deepinfer {

int32_t ForwardBatch::max_context_len(int32_t first, int32_t count) const {
  int32_t longest = 0;
  for (int32_t s = first; s < first + count; ++s) longest = std::max(longest, context_lens[static_cast<size_t>(s)]);
  return longest;
}

void ForwardBatch::validate(int32_t vocab_size, int32_t num_pages, int32_t page_size) const {
  const size_t t = token_ids.size();
  const auto seqs = static_cast<size_t>(num_seqs());
  DI_CHECK(positions.size() == t && slot_mapping.size() == t, "forward batch: ", t, " tokens but ",
           positions.size(), " positions and ", slot_mapping.size(), " slots");
  DI_CHECK(query_start.size() == seqs + 1 && query_start.front() == 0 && query_start.back() == static_cast<int32_t>(t),
           "forward batch: query_start does not cover the ", t, " tokens");
  DI_CHECK(max_pages_per_seq >= 0 && page_table.size() == seqs * static_cast<size_t>(max_pages_per_seq),
           "forward batch: page table size ", page_table.size(), " for ", seqs, " sequences of ", max_pages_per_seq,
           " pages");
  DI_CHECK(num_decode_seqs >= 0 && num_decode_seqs <= num_seqs(), "forward batch: ", num_decode_seqs,
           " decode sequences of ", num_seqs());
  for (size_t s = 0; s < seqs; ++s) {
    const int32_t queries = query_start[s + 1] - query_start[s], ctx = context_lens[s];
    DI_CHECK(queries >= 0 && queries <= ctx, "forward batch: sequence ", s, " has ", queries,
             " queries and a context of ", ctx);
    DI_CHECK(s >= static_cast<size_t>(num_decode_seqs) || queries == 1, "forward batch: decode sequence ", s, " has ",
             queries, " queries");
    const int64_t pages = (static_cast<int64_t>(ctx) + page_size - 1) / page_size;
    DI_CHECK(pages <= max_pages_per_seq, "forward batch: sequence ", s, " needs ", pages, " pages, the table holds ",
             max_pages_per_seq);
    for (int64_t p = 0; p < pages; ++p) {
      const int32_t page = page_table[s * static_cast<size_t>(max_pages_per_seq) + static_cast<size_t>(p)];
      DI_CHECK(page >= 0 && page < num_pages, "forward batch: page ", page, " of sequence ", s, " outside [0, ",
               num_pages, ")");
    }
  }
  const int64_t num_slots = static_cast<int64_t>(num_pages) * page_size;
  for (size_t i = 0; i < t; ++i) {
    DI_CHECK(token_ids[i] >= 0 && token_ids[i] < vocab_size, "forward batch: token id ", token_ids[i],
             " outside [0, ", vocab_size, ")");
    DI_CHECK(slot_mapping[i] >= 0 && slot_mapping[i] < num_slots, "forward batch: slot ", slot_mapping[i],
             " outside [0, ", num_slots, ")");
  }
  for (int32_t r : logits_indices) {
    DI_CHECK(r >= 0 && r < static_cast<int32_t>(t), "forward batch: logits row ", r, " of ", t);
  }
  if (decode_context_bound > 0) {
    DI_CHECK(decode_context_bound >= max_context_len(0, num_decode_seqs) &&
                 decode_context_bound <= static_cast<int64_t>(max_pages_per_seq) * page_size,
             "forward batch: decode context bound ", decode_context_bound, " below the longest decode context ",
             max_context_len(0, num_decode_seqs), " or beyond the page table's ", max_pages_per_seq, " pages");
  }
  DI_CHECK(sampling.penalty_tokens.size() == sampling.penalty_counts.size(), "forward batch: ",
           sampling.penalty_tokens.size(), " penalty tokens but ", sampling.penalty_counts.size(), " counts");
}

ForwardBatchBuilder::ForwardBatchBuilder(int32_t page_size, int32_t max_pages_per_seq) : page_size_(page_size) {
  DI_CHECK(page_size > 0 && max_pages_per_seq >= 0, "forward batch: pages of ", page_size, " tokens, ",
           max_pages_per_seq, " a sequence");
  batch_.max_pages_per_seq = max_pages_per_seq;
  batch_.query_start.push_back(0);
}

void ForwardBatchBuilder::add(std::span<const int32_t> tokens, int32_t start, std::span<const int32_t> pages,
                              bool samples, std::pair<int32_t, int32_t> scored) {
  ForwardBatch& b = batch_;
  const auto count = static_cast<int32_t>(tokens.size());
  const int64_t end = static_cast<int64_t>(start) + count;
  const auto max_pages = static_cast<size_t>(b.max_pages_per_seq);
  DI_CHECK(count > 0 && start >= 0, "forward batch: sequence ", b.num_seqs(), " computes tokens [", start, ", ", end,
           ")");
  DI_CHECK(pages.size() <= max_pages && static_cast<int64_t>(pages.size()) * page_size_ >= end, "forward batch: ",
           "sequence ", b.num_seqs(), " has ", pages.size(), " pages for ", end, " tokens; the table holds ",
           max_pages);
  const auto [first_scored, num_scored] = scored;
  DI_CHECK(num_scored == 0 || (first_scored >= start && first_scored + num_scored <= end - (samples ? 1 : 0)),
           "forward batch: sequence ", b.num_seqs(), " scores positions [", first_scored, ", ",
           first_scored + num_scored, ") of its chunk [", start, ", ", end, ")", samples ? ", which samples" : "");
  const bool decode = count == 1;
  DI_CHECK(!decode || b.num_decode_seqs == b.num_seqs(), "forward batch: a one-token sequence after ",
           b.num_seqs() - b.num_decode_seqs, " longer ones (decode sequences come first)");
  b.token_ids.insert(b.token_ids.end(), tokens.begin(), tokens.end());
  for (int32_t pos = start; pos < end; ++pos) {
    b.positions.push_back(pos);
    b.slot_mapping.push_back(pages[static_cast<size_t>(pos / page_size_)] * page_size_ + pos % page_size_);
  }
  b.query_start.push_back(b.num_tokens());
  b.context_lens.push_back(static_cast<int32_t>(end));
  b.page_table.insert(b.page_table.end(), pages.begin(), pages.end());
  b.page_table.insert(b.page_table.end(), max_pages - pages.size(), -1);
  const int32_t first_row = b.num_tokens() - count;
  for (int32_t pos = first_scored; pos < first_scored + num_scored; ++pos) {
    b.logits_indices.push_back(first_row + (pos - start));
  }
  if (samples) b.logits_indices.push_back(b.num_tokens() - 1);
  if (decode) ++b.num_decode_seqs;
}

ForwardBatch ForwardBatchBuilder::take() && { return std::move(batch_); }

StepLayout pack_step(const ForwardBatch& b, std::vector<int32_t>& out) {
  const std::vector<int32_t>* const parts[StepLayout::kNumParts] = {
      &b.token_ids,     &b.positions,      &b.slot_mapping,           &b.logits_indices,
      &b.query_start,   &b.context_lens,   &b.page_table,             &b.sampling.rows,
      &b.sampling.penalty_tokens, &b.sampling.penalty_counts, &b.sampling.masked_tokens};
  StepLayout layout;
  int64_t end = 0;
  for (size_t i = 0; i < StepLayout::kNumParts; ++i) {
    layout.start[i] = (end + StepLayout::kAlignment - 1) / StepLayout::kAlignment * StepLayout::kAlignment;
    layout.count[i] = static_cast<int64_t>(parts[i]->size());
    end = layout.start[i] + layout.count[i];
  }
  layout.packed_size = end;
  out.assign(static_cast<size_t>(end), 0);
  for (size_t i = 0; i < StepLayout::kNumParts; ++i) {
    std::copy(parts[i]->begin(), parts[i]->end(), out.begin() + static_cast<std::ptrdiff_t>(layout.start[i]));
  }
  return layout;
}

StepInputs bind_step(ConstTensorView packed, const StepLayout& layout, const ForwardBatch& b) {
  DI_CHECK(packed.numel() >= layout.total(), "step inputs: ", packed.numel(), " packed elements for a layout of ",
           layout.total());
  const auto part = [&](StepLayout::Part p) { return packed.rows(layout.begin(p), layout.size(p)); };
  StepInputs in;
  ModelInputs& m = in.model;
  m.token_ids = part(StepLayout::kTokenIds);
  m.positions = part(StepLayout::kPositions);
  m.slot_mapping = part(StepLayout::kSlotMapping);
  m.logits_indices = part(StepLayout::kLogitsIndices);
  const ConstTensorView query_start = part(StepLayout::kQueryStart);
  const ConstTensorView context_lens = part(StepLayout::kContextLens);
  const ConstTensorView page_table = part(StepLayout::kPageTable).reshaped({b.num_seqs(), b.max_pages_per_seq});
  const auto sequences = [&](int32_t first, int32_t count, int32_t bound) -> AttentionMetadata {
    return {.query_start = query_start.rows(first, count + 1), .context_lens = context_lens.rows(first, count),
            .page_table = page_table.rows(first, count), .num_seqs = count,
            .max_pages_per_seq = b.max_pages_per_seq,
            .max_context_len = bound > 0 ? bound : b.max_context_len(first, count),
            .total_context_len = std::accumulate(b.context_lens.begin() + first,
                                                 b.context_lens.begin() + first + count, int64_t{0})};
  };
  m.decode = sequences(0, b.num_decode_seqs, b.decode_context_bound);
  m.prefill = sequences(b.num_decode_seqs, b.num_seqs() - b.num_decode_seqs, 0);
  m.num_tokens = b.num_tokens();
  m.num_decode_seqs = b.num_decode_seqs;
  m.num_logits = static_cast<int64_t>(b.logits_indices.size());
  m.dp_max_tokens = b.dp_max_tokens;
  const int64_t rows = layout.size(StepLayout::kSamplingRows) / kSamplingRowWords;
  in.sampling_rows = part(StepLayout::kSamplingRows).reshaped({rows, kSamplingRowWords});
  in.penalty_tokens = part(StepLayout::kPenaltyTokens);
  in.penalty_counts = part(StepLayout::kPenaltyCounts);
  in.masked_tokens = part(StepLayout::kMaskedTokens);
  return in;
}

namespace {
// The arrays in the order they are encoded, each preceded by its length.
template <typename Batch>
auto encoded_arrays(Batch& b) {
  return std::array{&b.token_ids,           &b.positions,         &b.slot_mapping,           &b.query_start,
                    &b.context_lens,        &b.page_table,        &b.logits_indices,         &b.sampling.rows,
                    &b.sampling.penalty_tokens, &b.sampling.penalty_counts, &b.sampling.masked_tokens,
                    &b.sampling.given_masks};
}
}  // namespace

std::vector<int32_t> encode_forward_batch(const ForwardBatch& batch) {
  std::vector<int32_t> words{batch.max_pages_per_seq, batch.num_decode_seqs, batch.decode_context_bound,
                             batch.dp_max_tokens};
  for (const std::vector<int32_t>* a : encoded_arrays(batch)) {
    words.push_back(static_cast<int32_t>(a->size()));
    words.insert(words.end(), a->begin(), a->end());
  }
  return words;
}

ForwardBatch decode_forward_batch(std::span<const int32_t> words) {
  ForwardBatch b;
  DI_CHECK(words.size() >= 4, "a step batch of ", words.size(), " words");
  b.max_pages_per_seq = words[0];
  b.num_decode_seqs = words[1];
  b.decode_context_bound = words[2];
  b.dp_max_tokens = words[3];
  size_t at = 4;
  for (std::vector<int32_t>* a : encoded_arrays(b)) {
    DI_CHECK(at < words.size() && words[at] >= 0 && static_cast<size_t>(words[at]) <= words.size() - at - 1,
             "a step batch cut short at word ", at, " of ", words.size());
    const auto n = static_cast<size_t>(words[at++]);
    a->assign(words.begin() + static_cast<std::ptrdiff_t>(at), words.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  DI_CHECK(at == words.size(), "a step batch with ", words.size() - at, " words left over");
  return b;
}

}  // namespace deepinfer
