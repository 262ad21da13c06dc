#include "engine/model_runner.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

PreparedBatch prepare_batch(const SchedulePlan& plan, int32_t page_size) {
  // Single-token chunks take the absorbed decode path; they go first so they form one contiguous range.
  std::vector<size_t> order;
  order.reserve(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.chunks[i].num_tokens == 1) order.push_back(i);
  }
  const auto num_decode = static_cast<int32_t>(order.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.chunks[i].num_tokens != 1) order.push_back(i);
  }

  PreparedBatch out;
  ForwardBatch& b = out.batch;
  b.num_decode_seqs = num_decode;
  int32_t max_pages = 0;
  for (const auto& chunk : plan.chunks) {
    max_pages = std::max(max_pages, static_cast<int32_t>(chunk.request->page_ids.size()));
  }
  b.max_pages_per_seq = max_pages;
  b.query_start.push_back(0);
  std::vector<int32_t> logits_row_of_chunk(plan.chunks.size(), -1);
  for (size_t i : order) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Request& r = *chunk.request;
    const int32_t end = chunk.start + chunk.num_tokens;
    DI_CHECK(static_cast<int64_t>(r.page_ids.size()) * page_size >= end, "request ", r.id, " holds ",
             r.page_ids.size(), " pages for ", end, " tokens");
    r.append_tokens(chunk.start, chunk.num_tokens, b.token_ids);
    for (int32_t pos = chunk.start; pos < end; ++pos) {
      b.positions.push_back(pos);
      b.slot_mapping.push_back(r.page_ids[static_cast<size_t>(pos / page_size)] * page_size + pos % page_size);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lens.push_back(end);
    b.page_table.insert(b.page_table.end(), r.page_ids.begin(), r.page_ids.end());
    b.page_table.insert(b.page_table.end(), static_cast<size_t>(max_pages) - r.page_ids.size(), -1);
    if (chunk.samples) {
      logits_row_of_chunk[i] = static_cast<int32_t>(b.logits_indices.size());
      b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
    }
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.chunks[i].samples) {
      out.sampling_chunks.push_back(&plan.chunks[i]);
      out.logits_row_of_sampling_chunk.push_back(logits_row_of_chunk[i]);
    }
  }
  return out;
}

}  // namespace deepinfer
