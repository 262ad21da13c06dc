// The engine's side of device sampling: a request's SamplingRow, its penalty lists and its masks.
#include "engine/sampling_inputs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
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

}  // namespace
}  // namespace deepinfer
