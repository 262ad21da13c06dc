// The step's batch on the host: the one ForwardBatch builder, a plan's step (decode rows first, sampled rows mapped
// back to plan order, verified drafts as decode rows) and the packing of the step's arrays.
#include "engine/step_batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "backend/ops/sample.h"
#include "core/error.h"
#include "engine/model_runner.h"
#include "engine/step_runner.h"

namespace deepinfer {
namespace {

TEST(ForwardBatchBuilder, LaysOutDecodeThenPrefillSequences) {
  ForwardBatchBuilder builder(/*page_size=*/4, /*max_pages_per_seq=*/3);
  const std::vector<int32_t> decode_pages = {7, 2};   // a context of 6 tokens
  const std::vector<int32_t> prefill_pages = {5, 1, 9};
  builder.add(std::vector<int32_t>{40}, 5, decode_pages, /*samples=*/true);
  builder.add(std::vector<int32_t>{10, 11, 12, 13, 14}, 3, prefill_pages, /*samples=*/false);
  builder.add(std::vector<int32_t>{20, 21}, 0, std::vector<int32_t>{3}, /*samples=*/true);
  const ForwardBatch b = std::move(builder).take();

  EXPECT_EQ(b.num_decode_seqs, 1);
  EXPECT_EQ(b.token_ids, (std::vector<int32_t>{40, 10, 11, 12, 13, 14, 20, 21}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{5, 3, 4, 5, 6, 7, 0, 1}));
  // Position p goes to page pages[p / 4], offset p % 4.
  EXPECT_EQ(b.slot_mapping, (std::vector<int32_t>{2 * 4 + 1, 5 * 4 + 3, 1 * 4 + 0, 1 * 4 + 1, 1 * 4 + 2, 1 * 4 + 3,
                                                  3 * 4 + 0, 3 * 4 + 1}));
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 1, 6, 8}));
  EXPECT_EQ(b.context_lens, (std::vector<int32_t>{6, 8, 2}));
  EXPECT_EQ(b.page_table, (std::vector<int32_t>{7, 2, -1, 5, 1, 9, 3, -1, -1}));
  EXPECT_EQ(b.logits_indices, (std::vector<int32_t>{0, 7}));  // the second sequence does not sample
  EXPECT_FALSE(b.is_pure_decode());
  EXPECT_NO_THROW(b.validate(/*vocab_size=*/64, /*num_pages=*/10, /*page_size=*/4));
  EXPECT_THROW(b.validate(64, /*num_pages=*/7, 4), Error);  // page 7 is outside the cache
  EXPECT_THROW(b.validate(/*vocab_size=*/40, 10, 4), Error);  // token 40 is outside the vocabulary
}

TEST(ForwardBatchBuilder, RejectsSequencesItCannotLayOut) {
  const std::vector<int32_t> one_page = {0}, three_pages = {0, 1, 2};
  ForwardBatchBuilder builder(4, 2);
  EXPECT_THROW(builder.add(std::vector<int32_t>{}, 0, one_page, true), Error);                // no tokens
  EXPECT_THROW(builder.add(std::vector<int32_t>{1, 2, 3}, 2, one_page, true), Error);        // 5 tokens, 1 page
  EXPECT_THROW(builder.add(std::vector<int32_t>{1}, 0, three_pages, true), Error);           // wider than the table
  builder.add(std::vector<int32_t>{1, 2}, 0, one_page, true);
  EXPECT_THROW(builder.add(std::vector<int32_t>{1}, 3, one_page, true), Error);  // a decode after a prefill
  EXPECT_THROW({ ForwardBatchBuilder no_pages(0, 2); }, Error);
}

SamplingRow sampling_row(const SamplingBatch& b, size_t i) {
  SamplingRow r;
  std::memcpy(static_cast<void*>(&r), b.rows.data() + i * kSamplingRowWords, sizeof r);
  return r;
}

// A plan whose prefill chunk comes before a decode: the batch puts the decode first, and the sampled rows map back
// to the plan's order.
TEST(BuildStepBatch, PutsDecodesFirstAndMapsSampledRowsToPlanOrder) {
  Request prefilling, decoding, chunked;
  prefilling.id = 1;
  prefilling.prompt_token_ids = {3, 4, 5, 6, 7};
  prefilling.page_ids = {4, 5};
  prefilling.seed = 11;
  decoding.id = 2;
  decoding.prompt_token_ids = {8, 9, 10};
  decoding.output_token_ids = {12};
  decoding.num_computed_tokens = 3;
  decoding.page_ids = {0};
  decoding.seed = 22;
  chunked.id = 3;
  chunked.prompt_token_ids = {1, 2, 3, 4, 5, 6};
  chunked.page_ids = {7};
  SchedulePlan plan;
  plan.chunks = {{.request = &prefilling, .start = 0, .num_tokens = 5, .samples = true},
                 {.request = &chunked, .start = 0, .num_tokens = 4, .samples = false},
                 {.request = &decoding, .start = 3, .num_tokens = 1, .samples = true}};

  const StepBatch step = build_step_batch(plan, /*page_size=*/4, /*vocab_size=*/100);
  const ForwardBatch& b = step.forward;
  EXPECT_EQ(b.num_decode_seqs, 1);
  EXPECT_EQ(b.token_ids, (std::vector<int32_t>{12, 3, 4, 5, 6, 7, 1, 2, 3, 4}));
  EXPECT_EQ(b.slot_mapping.front(), 0 * 4 + 3);
  EXPECT_EQ(b.max_pages_per_seq, 2);
  EXPECT_EQ(b.logits_indices, (std::vector<int32_t>{0, 5}));
  // Logits rows: the decode's, then the prefill's; plan order: the prefill, then the decode.
  EXPECT_EQ(step.logits_row_of_sample, (std::vector<int32_t>{1, 0}));
  ASSERT_EQ(b.sampling.rows.size(), 2 * static_cast<size_t>(kSamplingRowWords));
  EXPECT_EQ(sampling_row(b.sampling, 0).seed, 22u);
  EXPECT_EQ(sampling_row(b.sampling, 0).step, 1);  // one token generated so far
  EXPECT_EQ(sampling_row(b.sampling, 1).seed, 11u);
  EXPECT_NO_THROW(b.validate(100, 8, 4));

  decoding.page_ids.clear();  // a request without the pages its chunk needs
  EXPECT_THROW(build_step_batch(plan, 4, 100), Error);
}

// The distinct tokens of row i's penalty list, with their counts.
std::map<int32_t, int32_t> penalties_of(const SamplingBatch& b, size_t i) {
  const SamplingRow row = sampling_row(b, i);
  std::map<int32_t, int32_t> counts;
  for (int32_t k = row.penalty_begin; k < row.penalty_end; ++k) {
    counts[b.penalty_tokens[static_cast<size_t>(k)]] = b.penalty_counts[static_cast<size_t>(k)];
  }
  return counts;
}

std::vector<int32_t> masked_of(const SamplingBatch& b, size_t i) {
  const SamplingRow row = sampling_row(b, i);
  return {b.masked_tokens.begin() + row.mask_begin, b.masked_tokens.begin() + row.mask_end};
}

// A chunk that verifies 2 drafts becomes 3 one-token sequences (its real token, then each draft) over the request's
// whole page table, each sampling, in the decode range before a prefill chunk that comes first in the plan. Each
// position's sampling row samples as if the drafts before it were accepted: the RNG counter, the penalties and the
// min_tokens mask count them as outputs.
TEST(BuildStepBatch, VerifiedDraftsAreOneDecodeSequenceEach) {
  Request prefilling, verifying;
  prefilling.id = 1;
  prefilling.prompt_token_ids = {3, 4, 5, 6, 7};
  prefilling.page_ids = {4, 5};
  prefilling.seed = 11;
  verifying.id = 2;
  verifying.prompt_token_ids = {8, 9, 10};
  verifying.output_token_ids = {12, 13};  // 13, at position 4, is the real token to compute
  verifying.draft_token_ids = {20, 21};   // positions 5 and 6
  verifying.num_computed_tokens = 4;
  verifying.page_ids = {6, 3};
  verifying.seed = 22;
  verifying.eos_token_ids = {1};
  verifying.params.presence_penalty = 0.5f;
  verifying.params.min_tokens = 3;  // outputs 0..2 may not be EOS: only position 4's row (output 2) masks it
  SchedulePlan plan;
  plan.chunks = {{.request = &prefilling, .start = 0, .num_tokens = 5, .samples = true},
                 {.request = &verifying, .start = 4, .num_tokens = 3, .samples = true, .num_draft_tokens = 2}};

  const StepBatch step = build_step_batch(plan, /*page_size=*/4, /*vocab_size=*/100);
  const ForwardBatch& b = step.forward;
  EXPECT_EQ(b.num_decode_seqs, 3);
  EXPECT_EQ(b.token_ids, (std::vector<int32_t>{13, 20, 21, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{4, 5, 6, 0, 1, 2, 3, 4}));
  // Positions 4..6 are offsets 0..2 of page 3; the prefill's 0..3 fill page 4, its 4 starts page 5.
  EXPECT_EQ(b.slot_mapping, (std::vector<int32_t>{3 * 4 + 0, 3 * 4 + 1, 3 * 4 + 2, 4 * 4 + 0, 4 * 4 + 1, 4 * 4 + 2,
                                                  4 * 4 + 3, 5 * 4 + 0}));
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 1, 2, 3, 8}));
  EXPECT_EQ(b.context_lens, (std::vector<int32_t>{5, 6, 7, 5}));  // each verified position sees the ones before it
  EXPECT_EQ(b.max_pages_per_seq, 2);
  EXPECT_EQ(b.page_table, (std::vector<int32_t>{6, 3, 6, 3, 6, 3, 4, 5}));
  EXPECT_EQ(b.logits_indices, (std::vector<int32_t>{0, 1, 2, 7}));
  EXPECT_FALSE(b.is_pure_decode());
  EXPECT_NO_THROW(b.validate(100, 8, 4));

  // Plan order: the prefill (logits row 3, one row), then the verification (rows 0..2).
  EXPECT_EQ(step.logits_row_of_sample, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(step.rows_of_sample, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(step.num_rows_of_sample(0), 1);
  EXPECT_EQ(step.num_rows_of_sample(1), 3);
  EXPECT_EQ(step.first_token_row, (std::vector<int32_t>{3, 0}));
  EXPECT_TRUE(step.scored.empty());

  // Sampling rows in logits-row order: the three verification rows, then the prefill's.
  ASSERT_EQ(b.sampling.rows.size(), 4 * static_cast<size_t>(kSamplingRowWords));
  for (size_t j = 0; j < 3; ++j) {
    SCOPED_TRACE(::testing::Message() << "verification row " << j);
    EXPECT_EQ(sampling_row(b.sampling, j).seed, 22u);
    EXPECT_EQ(sampling_row(b.sampling, j).step, 2 + static_cast<int32_t>(j));  // 2 outputs + j drafts before it
  }
  EXPECT_EQ(penalties_of(b.sampling, 0), (std::map<int32_t, int32_t>{{12, 1}, {13, 1}}));
  EXPECT_EQ(penalties_of(b.sampling, 1), (std::map<int32_t, int32_t>{{12, 1}, {13, 1}, {20, 1}}));
  EXPECT_EQ(penalties_of(b.sampling, 2), (std::map<int32_t, int32_t>{{12, 1}, {13, 1}, {20, 1}, {21, 1}}));
  EXPECT_EQ(masked_of(b.sampling, 0), (std::vector<int32_t>{1}));
  EXPECT_TRUE(masked_of(b.sampling, 1).empty());
  EXPECT_TRUE(masked_of(b.sampling, 2).empty());
  EXPECT_EQ(sampling_row(b.sampling, 3).seed, 11u);
  EXPECT_EQ(sampling_row(b.sampling, 3).step, 0);

  // The step's result: per sampling chunk in plan order, its rows: the prefill's row 3, then rows 0, 1, 2.
  std::vector<SampledToken> rows(4);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].token = 50 + static_cast<int32_t>(i);
  const StepResult result = collect_step_result(step, rows);
  std::vector<int32_t> tokens;
  for (const SampledToken& t : result.sampled) tokens.push_back(t.token);
  EXPECT_EQ(tokens, (std::vector<int32_t>{53, 50, 51, 52}));
  EXPECT_THROW(collect_step_result(step, std::span(rows).first(3)), Error);  // row 3 missing

  // The verification alone is a pure decode step (what decode graphs serve).
  SchedulePlan alone;
  alone.chunks = {plan.chunks[1]};
  const StepBatch only = build_step_batch(alone, 4, 100);
  EXPECT_TRUE(only.forward.is_pure_decode());
  EXPECT_EQ(only.first_token_row, (std::vector<int32_t>{0}));
  EXPECT_EQ(only.logits_row_of_sample, (std::vector<int32_t>{0}));
  EXPECT_EQ(only.rows_of_sample, (std::vector<int32_t>{3}));

  verifying.draft_token_ids = {20};  // fewer drafts held than the chunk verifies
  EXPECT_THROW(build_step_batch(plan, 4, 100), Error);
}

TEST(PackStep, EveryArrayStartsSixteenBytesAligned) {
  ForwardBatchBuilder builder(/*page_size=*/4, /*max_pages_per_seq=*/1);
  builder.add(std::vector<int32_t>{1, 2, 3}, 0, std::vector<int32_t>{1}, /*samples=*/true);
  ForwardBatch b = std::move(builder).take();
  b.sampling.rows.assign(kSamplingRowWords, 7);
  b.sampling.penalty_tokens = {9};
  b.sampling.penalty_counts = {1};
  std::vector<int32_t> packed;
  const StepLayout layout = pack_step(b, packed);
  EXPECT_EQ(static_cast<int64_t>(packed.size()), layout.total());
  for (int p = 0; p < StepLayout::kNumParts; ++p) {
    const auto part = static_cast<StepLayout::Part>(p);
    EXPECT_EQ(layout.begin(part) % 4, 0) << "part " << p;
  }
  EXPECT_EQ(packed[static_cast<size_t>(layout.begin(StepLayout::kSamplingRows))], 7);
  EXPECT_EQ(layout.size(StepLayout::kSamplingRows), kSamplingRowWords);
  EXPECT_EQ(packed[static_cast<size_t>(layout.begin(StepLayout::kPenaltyCounts))], 1);
  EXPECT_EQ(layout.size(StepLayout::kMaskedTokens), 0);
}

}  // namespace
}  // namespace deepinfer
