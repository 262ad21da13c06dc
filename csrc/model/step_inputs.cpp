#include "model/step_inputs.h"

#include <algorithm>
#include <numeric>

#include "backend/ops/sample.h"

namespace deepinfer {

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
  in.token_ids = part(StepLayout::kTokenIds);
  in.positions = part(StepLayout::kPositions);
  in.slot_mapping = part(StepLayout::kSlotMapping);
  in.logits_indices = part(StepLayout::kLogitsIndices);
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
  in.decode = sequences(0, b.num_decode_seqs, b.decode_context_bound);
  in.prefill = sequences(b.num_decode_seqs, b.num_seqs() - b.num_decode_seqs, 0);
  const int64_t rows = layout.size(StepLayout::kSamplingRows) / kSamplingRowWords;
  in.sampling_rows = part(StepLayout::kSamplingRows).reshaped({rows, kSamplingRowWords});
  in.penalty_tokens = part(StepLayout::kPenaltyTokens);
  in.penalty_counts = part(StepLayout::kPenaltyCounts);
  in.masked_tokens = part(StepLayout::kMaskedTokens);
  in.num_tokens = b.num_tokens();
  in.num_decode_seqs = b.num_decode_seqs;
  in.num_logits = static_cast<int64_t>(b.logits_indices.size());
  return in;
}

}  // namespace deepinfer
