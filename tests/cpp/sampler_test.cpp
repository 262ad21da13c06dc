// The host sampler: masks, penalties and distributions checked against hand-computed expectations.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace deepinfer {
namespace {

struct Fixture {
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<int32_t> eos{9};
  std::mt19937_64 rng{0};

  SampleResult sample(std::vector<float> logits) {
    SamplingContext ctx{.params = params, .prompt_token_ids = prompt, .output_token_ids = output,
                        .eos_token_ids = eos, .rng = rng};
    return sample_token(logits, ctx);
  }
};

std::vector<float> logits_of_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(Fixture& f, const std::vector<float>& logits, int draws) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[f.sample(logits).token];
  return counts;
}

TEST(Sampler, GreedyTakesTheArgmaxAndIgnoresTheRng) {
  Fixture f;
  f.params.temperature = 0.0f;
  EXPECT_EQ(f.sample({0.1f, 2.0f, -1.0f, 1.9f}).token, 1);
  EXPECT_EQ(f.sample({0.1f, 2.0f, -1.0f, 1.9f}).token, 1);
}

TEST(Sampler, TemperatureSamplingFollowsTheSoftmax) {
  Fixture f;
  f.params.temperature = 0.5f;
  const std::vector<float> logits{0.0f, 0.5f, 1.0f};
  double z = 0;
  std::vector<double> expected;
  for (float l : logits) expected.push_back(std::exp(l / 0.5));
  for (double e : expected) z += e;
  const int draws = 40000;
  auto counts = histogram(f, logits, draws);
  for (int t = 0; t < 3; ++t) {
    const double p = expected[t] / z;
    const double sigma = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(counts[t] / static_cast<double>(draws), p, 5 * sigma) << "token " << t;
  }
}

TEST(Sampler, TopKTopPAndMinPRestrictTheSupport) {
  const auto logits = logits_of_probs({0.5, 0.3, 0.15, 0.05});
  auto support = [&](auto configure) {
    Fixture f;
    configure(f.params);
    std::set<int32_t> seen;
    for (auto& [token, count] : histogram(f, logits, 3000)) seen.insert(token);
    return seen;
  };
  EXPECT_EQ(support([](SamplingParams& p) { p.top_k = 2; }), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support([](SamplingParams& p) { p.top_p = 0.75f; }), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support([](SamplingParams& p) { p.top_p = 0.85f; }), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(support([](SamplingParams& p) { p.min_p = 0.4f; }), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support([](SamplingParams& p) { p.min_p = 0.05f; }), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(support([](SamplingParams& p) { p.top_k = 3; p.top_p = 0.6f; }), (std::set<int32_t>{0, 1}));
}

TEST(Sampler, SameSeedSameDraws) {
  Fixture a, b, c;
  a.rng.seed(77);
  b.rng.seed(77);
  c.rng.seed(78);
  const std::vector<float> logits(50, 0.0f);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 32; ++i) {
    ta.push_back(a.sample(logits).token);
    tb.push_back(b.sample(logits).token);
    tc.push_back(c.sample(logits).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, PenaltiesChangeTheLogitsAsSpecified) {
  Fixture f;
  f.params.temperature = 0.0f;
  f.params.repetition_penalty = 2.0f;
  f.params.presence_penalty = 0.5f;
  f.params.frequency_penalty = 0.25f;
  f.prompt = {0, 1};
  f.output = {1, 2, 2};
  std::vector<float> logits{4.0f, -4.0f, 3.0f, 1.0f};
  SamplingContext ctx{.params = f.params, .prompt_token_ids = f.prompt, .output_token_ids = f.output,
                      .eos_token_ids = f.eos, .rng = f.rng};
  sample_token(logits, ctx);
  EXPECT_FLOAT_EQ(logits[0], 2.0f);                       // prompt token, positive: divided
  EXPECT_FLOAT_EQ(logits[1], -8.0f - 0.25f - 0.5f);       // negative: multiplied; once in the output
  EXPECT_FLOAT_EQ(logits[2], 1.5f - 2 * 0.25f - 0.5f);    // twice in the output
  EXPECT_FLOAT_EQ(logits[3], 1.0f);                       // untouched
}

TEST(Sampler, MinTokensMasksEosAndStopIds) {
  Fixture f;
  f.params.temperature = 0.0f;
  f.params.min_tokens = 2;
  f.params.stop_token_ids = {3};
  f.output = {5};
  std::vector<float> logits(10, 0.0f);
  logits[9] = 10.0f;  // EOS
  logits[3] = 9.0f;   // a stop id
  logits[4] = 1.0f;
  EXPECT_EQ(f.sample(logits).token, 4);
  f.output = {5, 6};
  EXPECT_EQ(f.sample(logits).token, 9);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxSorted) {
  Fixture f;
  f.params.temperature = 0.0f;
  f.params.repetition_penalty = 3.0f;  // processing must not leak into the reported logprobs
  f.params.logprobs = 2;
  f.prompt = {1};
  const std::vector<float> logits{1.0f, 3.0f, 2.0f};
  const SampleResult r = f.sample(logits);
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  EXPECT_NEAR(r.top_logprobs[0].logprob, 3.0 - z, 1e-6);
  EXPECT_NEAR(r.top_logprobs[1].logprob, 2.0 - z, 1e-6);
  EXPECT_EQ(r.token, 2);  // 3 / 3 = 1 < 2 after the penalty
  EXPECT_NEAR(r.logprob, 2.0 - z, 1e-6);
}

}  // namespace
}  // namespace deepinfer
