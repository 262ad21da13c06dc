#include "engine/model_runner.h"

#include <algorithm>

#include "core/error.h"
#include "engine/sampling_inputs.h"

namespace deepinfer {

StepBatch build_step_batch(const SchedulePlan& plan, int32_t page_size, int32_t vocab_size) {
  // Single-token chunks take the absorbed decode path; they go first so they form one contiguous range. So does a
  // chunk that verifies drafts: each of its positions is a one-token sequence of its own over the request's pages
  // (its context ends at that position), so the verification is a pure decode step, graphs included.
  const auto decodes = [](const ScheduledChunk& c) { return c.num_tokens == 1 || c.num_draft_tokens > 0; };
  std::vector<size_t> order;
  order.reserve(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (decodes(plan.chunks[i])) order.push_back(i);
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (!decodes(plan.chunks[i])) order.push_back(i);
  }
  int32_t max_pages = 0;
  for (const auto& chunk : plan.chunks) {
    max_pages = std::max(max_pages, static_cast<int32_t>(chunk.request->page_ids.size()));
  }

  ForwardBatchBuilder builder(page_size, max_pages);
  std::vector<int32_t> tokens;  // one chunk's
  std::vector<int32_t> logits_row_of_chunk(plan.chunks.size(), -1);
  std::vector<int32_t> first_token_row(plan.chunks.size(), -1);
  std::vector<ScoredRows> scored;
  int32_t num_logits = 0, num_rows = 0;
  for (size_t i : order) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Request& r = *chunk.request;
    const int32_t end = chunk.start + chunk.num_tokens;
    DI_CHECK(static_cast<int64_t>(r.page_ids.size()) * page_size >= end, "request ", r.id, " holds ",
             r.page_ids.size(), " pages for ", end, " tokens");
    first_token_row[i] = num_rows;
    num_rows += chunk.num_tokens;
    tokens.clear();
    const int32_t drafts = chunk.num_draft_tokens;
    r.append_tokens(chunk.start, chunk.num_tokens - drafts, tokens);
    if (drafts > 0) {
      DI_CHECK(static_cast<int32_t>(r.draft_token_ids.size()) >= drafts && chunk.samples, "request ", r.id, ": ",
               drafts, " drafts to verify, ", r.draft_token_ids.size(), " held");
      tokens.insert(tokens.end(), r.draft_token_ids.begin(), r.draft_token_ids.begin() + drafts);
      for (int32_t j = 0; j <= drafts; ++j) {
        builder.add(std::span(tokens).subspan(static_cast<size_t>(j), 1), chunk.start + j, r.page_ids,
                    /*samples=*/true);
      }
      logits_row_of_chunk[i] = num_logits;
      num_logits += drafts + 1;
      continue;
    }
    const std::pair<int32_t, int32_t> to_score = r.positions_to_score(chunk.start, chunk.num_tokens);
    builder.add(tokens, chunk.start, r.page_ids, chunk.samples, to_score);
    if (to_score.second > 0) {
      scored.push_back({.chunk = i, .first_row = num_logits, .first_position = to_score.first,
                        .count = to_score.second});
      num_logits += to_score.second;
    }
    if (chunk.samples) logits_row_of_chunk[i] = num_logits++;
  }

  StepBatch step{.forward = std::move(builder).take(), .logits_row_of_sample = {}, .scored = std::move(scored),
                 .rows_of_sample = {}, .first_token_row = std::move(first_token_row)};
  // The sampling rows go in logits-row order, which puts decode sequences first: a chunk's scored rows, then its
  // sampled ones (a verified draft's row samples the token after it, as if the drafts before it were accepted).
  auto next_scored = step.scored.begin();
  for (size_t i : order) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Request& r = *chunk.request;
    if (next_scored != step.scored.end() && next_scored->chunk == i) {
      append_scoring_inputs(r, next_scored->first_position, next_scored->count, step.forward.sampling);
      ++next_scored;
    }
    if (!chunk.samples) continue;
    for (int32_t j = 0; j <= chunk.num_draft_tokens; ++j) {
      append_sampling_inputs(r, vocab_size, step.forward.sampling,
                             std::span(r.draft_token_ids).first(static_cast<size_t>(j)));
    }
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (!plan.chunks[i].samples) continue;
    step.logits_row_of_sample.push_back(logits_row_of_chunk[i]);
    step.rows_of_sample.push_back(1 + plan.chunks[i].num_draft_tokens);
  }
  return step;
}

}  // namespace deepinfer
