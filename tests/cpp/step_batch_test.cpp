// The step's batch on the host: the one ForwardBatch builder, a plan's step (decode rows first, sampled rows mapped
// back to plan order) and the packing of the step's arrays.
#include "engine/step_batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "backend/ops/sample.h"
#include "core/error.h"
#include "engine/model_runner.h"

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
