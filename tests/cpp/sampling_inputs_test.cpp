// The engine's side of device sampling: a request's SamplingRow, its penalty lists and its masks.
#include "engine/sampling_inputs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <span>
#include <vector>

#include "backend/ops/sample.h"

namespace deepinfer {
namespace {

SamplingRow row_at(const SamplingBatch& b, size_t i) {
  SamplingRow r;
  std::memcpy(static_cast<void*>(&r), b.rows.data() + i * kSamplingRowWords, sizeof r);
  return r;
}

Request request(std::vector<int32_t> prompt, std::vector<int32_t> output) {
  Request r;
  r.id = 3;
  r.prompt_token_ids = std::move(prompt);
  r.output_token_ids = std::move(output);
  r.eos_token_ids = {1};
  return r;
}

TEST(SamplingInputs, CopiesTheParametersAndCountsTheStep) {
  Request r = request({5, 6}, {7, 8, 9});
  r.params.temperature = 0.7f;
  r.params.top_k = -1;
  r.params.top_p = 0.9f;
  r.params.min_p = 0.05f;
  r.params.logprobs = 3;
  r.seed = 42;
  SamplingBatch b;
  append_sampling_inputs(r, 100, b);
  r.params.top_k = 500;  // beyond the vocabulary: off
  append_sampling_inputs(r, 100, b);
  ASSERT_EQ(b.rows.size(), 2 * static_cast<size_t>(kSamplingRowWords));
  const SamplingRow a = row_at(b, 0), c = row_at(b, 1);
  EXPECT_EQ(a.temperature, 0.7f);
  EXPECT_EQ(a.top_k, 0);
  EXPECT_EQ(c.top_k, 0);
  EXPECT_EQ(a.top_p, 0.9f);
  EXPECT_FLOAT_EQ(a.log_min_p, std::log(0.05f));
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(a.step, 3);  // three tokens generated so far: the RNG's counter
  EXPECT_EQ(a.num_logprobs, 3);
  EXPECT_EQ(a.penalty_begin, a.penalty_end);
  EXPECT_EQ(a.mask_begin, a.mask_end);
  EXPECT_TRUE(b.penalty_tokens.empty() && b.masked_tokens.empty());
  EXPECT_EQ(a.allowed_row, -1);  // no grammar: no mask
  EXPECT_TRUE(b.grammars.empty());
  for (const int32_t w : a.reserved) EXPECT_EQ(w, 0);

  r.params.min_p = 0.0f;
  SamplingBatch d;
  r.seed = 1;
  append_sampling_inputs(r, 100, d);
  EXPECT_EQ(row_at(d, 0).seed, 1u);
  EXPECT_TRUE(std::isinf(row_at(d, 0).log_min_p) && row_at(d, 0).log_min_p < 0);
}

TEST(SamplingInputs, PenaltyListsHoldDistinctTokensWithOutputCounts) {
  Request r = request({5, 6, 5}, {6, 9, 9, 9});
  r.params.repetition_penalty = 1.3f;
  SamplingBatch b;
  append_sampling_inputs(r, 100, b);
  SamplingRow row = row_at(b, 0);
  std::map<int32_t, int32_t> got;
  for (int32_t i = row.penalty_begin; i < row.penalty_end; ++i) got[b.penalty_tokens[i]] = b.penalty_counts[i];
  EXPECT_EQ(got, (std::map<int32_t, int32_t>{{5, 0}, {6, 1}, {9, 3}}));  // the prompt counts, with 0

  // Presence and frequency alone cover the output only.
  Request s = request({5, 6, 5}, {6, 9, 9, 9});
  s.params.presence_penalty = 0.5f;
  append_sampling_inputs(s, 100, b);
  row = row_at(b, 1);
  got.clear();
  for (int32_t i = row.penalty_begin; i < row.penalty_end; ++i) got[b.penalty_tokens[i]] = b.penalty_counts[i];
  EXPECT_EQ(got, (std::map<int32_t, int32_t>{{6, 1}, {9, 3}}));
  EXPECT_EQ(row.penalty_begin, row_at(b, 0).penalty_end);  // rows take consecutive ranges
}

TEST(SamplingInputs, MasksEosAndStopIdsUntilMinTokens) {
  Request r = request({5}, {7});
  r.params.min_tokens = 2;
  r.params.stop_token_ids = {11, 12};
  SamplingBatch b;
  append_sampling_inputs(r, 100, b);
  SamplingRow row = row_at(b, 0);
  EXPECT_EQ(std::vector<int32_t>(b.masked_tokens.begin() + row.mask_begin, b.masked_tokens.begin() + row.mask_end),
            (std::vector<int32_t>{1, 11, 12}));

  r.params.ignore_eos = true;  // EOS is no stop then: only the stop ids are masked
  append_sampling_inputs(r, 100, b);
  row = row_at(b, 1);
  EXPECT_EQ(std::vector<int32_t>(b.masked_tokens.begin() + row.mask_begin, b.masked_tokens.begin() + row.mask_end),
            (std::vector<int32_t>{11, 12}));

  r.output_token_ids.push_back(8);  // min_tokens reached: nothing masked
  append_sampling_inputs(r, 100, b);
  row = row_at(b, 2);
  EXPECT_EQ(row.mask_begin, row.mask_end);
}

// The row of a draft being verified samples the token after the `pending` drafts as if they were outputs already:
// the RNG counter advances over them and presence/frequency penalties count them. The request itself is unchanged.
TEST(SamplingInputs, PendingTokensCountAsOutputsForTheStepAndPenalties) {
  Request r = request({5, 6}, {6, 9});
  r.params.presence_penalty = 0.5f;
  r.params.frequency_penalty = 0.25f;
  SamplingBatch b;
  append_sampling_inputs(r, 100, b);
  const std::vector<int32_t> pending = {9, 4, 4};
  append_sampling_inputs(r, 100, b, pending);
  ASSERT_EQ(b.rows.size(), 2 * static_cast<size_t>(kSamplingRowWords));
  EXPECT_EQ(row_at(b, 0).step, 2);
  EXPECT_EQ(row_at(b, 1).step, 5);  // 2 outputs + 3 pending
  std::map<int32_t, int32_t> got;
  SamplingRow row = row_at(b, 1);
  for (int32_t i = row.penalty_begin; i < row.penalty_end; ++i) got[b.penalty_tokens[i]] = b.penalty_counts[i];
  EXPECT_EQ(got, (std::map<int32_t, int32_t>{{6, 1}, {9, 2}, {4, 2}}));
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{6, 9}));

  // With the repetition penalty, a prompt token that is pending counts as an output.
  Request s = request({5, 7}, {});
  s.params.repetition_penalty = 1.2f;
  const std::vector<int32_t> five = {5};
  append_sampling_inputs(s, 100, b, five);
  row = row_at(b, 2);
  got.clear();
  for (int32_t i = row.penalty_begin; i < row.penalty_end; ++i) got[b.penalty_tokens[i]] = b.penalty_counts[i];
  EXPECT_EQ(got, (std::map<int32_t, int32_t>{{5, 1}, {7, 0}}));
  EXPECT_EQ(row.step, 1);
}

// The min_tokens mask applies by the output index of the token being sampled: outputs + pending.
TEST(SamplingInputs, PendingTokensCountTowardsMinTokens) {
  Request r = request({5}, {7});
  r.params.min_tokens = 3;
  r.params.stop_token_ids = {11};
  SamplingBatch b;
  const std::vector<int32_t> drafts = {8, 9, 10};
  for (size_t j = 0; j <= drafts.size(); ++j) {
    append_sampling_inputs(r, 100, b, std::span(drafts).first(j));  // samples output 1 + j
  }
  ASSERT_EQ(b.rows.size(), 4 * static_cast<size_t>(kSamplingRowWords));
  const auto masked = [&b](size_t i) {
    const SamplingRow row = row_at(b, i);
    return std::vector<int32_t>(b.masked_tokens.begin() + row.mask_begin, b.masked_tokens.begin() + row.mask_end);
  };
  EXPECT_EQ(masked(0), (std::vector<int32_t>{1, 11}));  // output 1
  EXPECT_EQ(masked(1), (std::vector<int32_t>{1, 11}));  // output 2
  EXPECT_TRUE(masked(2).empty());                       // output 3: min_tokens reached
  EXPECT_TRUE(masked(3).empty());
}

}  // namespace
}  // namespace deepinfer
