// The counter RNG (core/counter_rng.h) and the sampling op on the CPU backend (ops/sample.h): known answers,
// uniformity and independence of the noise; chi-square fits of the sampled frequencies to the renormalized kept
// distribution; what a seed fixes and what it does not; penalties, masks, grammar masks and logprobs; validation
// messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/counter_rng.h"
#include "op_test_harness.h"

namespace deepinfer {
namespace {

using op_test::SampleBatch;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------------------------
// The counter RNG

// splitmix64 from seed 1234567: the published first outputs of the generator whose finalizer mix64 is.
TEST(CounterRng, Mix64IsSplitmix64sFinalizer) {
  const uint64_t expected[] = {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                               4593380528125082431ull, 16408922859458223821ull};
  uint64_t state = 1234567;
  for (uint64_t want : expected) {
    state += counter_rng::kGolden;
    EXPECT_EQ(counter_rng::mix64(state), want);
  }
}

// Values fixed by the definition (computed by an independent implementation of the formula in counter_rng.h).
// Changing them changes every seeded request's output.
TEST(CounterRng, KnownAnswers) {
  EXPECT_EQ(counter_rng::uniform01(0, 0, 0), 0x1.4e0dbap-1f);
  EXPECT_EQ(counter_rng::uniform01(42, 7, 129279), 0x1.624cbp-4f);
  EXPECT_EQ(counter_rng::uniform01(~0ull, std::numeric_limits<int32_t>::max(), 0), 0x1.d95566p-1f);
  EXPECT_EQ(counter_rng::uniform01(1234567, 1, 1), 0x1.9137f4p-2f);
  EXPECT_EQ(counter_rng::uniform01_at(counter_rng::stream_key(42, 7), 129279), counter_rng::uniform01(42, 7, 129279));
}

// An upper quantile of the chi-square distribution (Wilson-Hilferty), z standard deviations out.
double chi_square_bound(int degrees, double z = 3.719) {  // z = 3.719: p = 1e-4
  const double d = degrees;
  return d * std::pow(1.0 - 2.0 / (9.0 * d) + z * std::sqrt(2.0 / (9.0 * d)), 3.0);
}

TEST(CounterRng, UniformOnTheOpenInterval) {
  constexpr int kBins = 64;
  std::vector<int64_t> bins(kBins, 0);
  double sum = 0.0, low = 1.0, high = 0.0;
  int64_t n = 0;
  for (uint64_t seed : {0ull, 1ull, 0x123456789abcdefull}) {
    for (int32_t step = 0; step < 8; ++step) {
      for (int32_t i = 0; i < 50000; ++i) {
        const float u = counter_rng::uniform01(seed, step, i);
        sum += u;
        low = std::min<double>(low, u);
        high = std::max<double>(high, u);
        ++bins[static_cast<size_t>(u * kBins)];
        ++n;
      }
    }
  }
  EXPECT_GT(low, 0.0);
  EXPECT_LT(high, 1.0);
  EXPECT_NEAR(sum / double(n), 0.5, 5.0 * std::sqrt(1.0 / 12.0 / double(n)));
  double chi2 = 0.0;
  for (int64_t b : bins) chi2 += std::pow(double(b) - double(n) / kBins, 2) / (double(n) / kBins);
  EXPECT_LT(chi2, chi_square_bound(kBins - 1)) << "uniformity over " << kBins << " bins";
}

// Neighbouring steps, indices and seeds give uncorrelated numbers, and pairs are uniform on the square.
TEST(CounterRng, IndependentAcrossStepsIndicesAndSeeds) {
  constexpr int kPairs = 200000, kGrid = 8;
  struct Neighbour {
    const char* what;
    std::function<float(int32_t)> a, b;
  };
  const Neighbour neighbours[] = {
      {"step", [](int32_t i) { return counter_rng::uniform01(7, i % 97, i / 97); },
       [](int32_t i) { return counter_rng::uniform01(7, i % 97 + 1, i / 97); }},
      {"index", [](int32_t i) { return counter_rng::uniform01(7, 3, i); },
       [](int32_t i) { return counter_rng::uniform01(7, 3, i + 1); }},
      {"seed", [](int32_t i) { return counter_rng::uniform01(i, 0, 5); },
       [](int32_t i) { return counter_rng::uniform01(i + 1, 0, 5); }},
  };
  for (const Neighbour& nb : neighbours) {
    double sa = 0, sb = 0, sab = 0, saa = 0, sbb = 0;
    std::vector<int64_t> grid(kGrid * kGrid, 0);
    for (int32_t i = 0; i < kPairs; ++i) {
      const double a = nb.a(i), b = nb.b(i);
      sa += a;
      sb += b;
      sab += a * b;
      saa += a * a;
      sbb += b * b;
      ++grid[static_cast<size_t>(int(a * kGrid) * kGrid + int(b * kGrid))];
    }
    const double n = kPairs;
    const double corr = (sab / n - sa / n * sb / n) /
                        std::sqrt((saa / n - sa / n * sa / n) * (sbb / n - sb / n * sb / n));
    EXPECT_LT(std::abs(corr), 5.0 / std::sqrt(n)) << "neighbouring " << nb.what;
    double chi2 = 0.0;
    for (int64_t c : grid) chi2 += std::pow(double(c) - n / grid.size(), 2) / (n / grid.size());
    EXPECT_LT(chi2, chi_square_bound(kGrid * kGrid - 1)) << "pairs of neighbouring " << nb.what;
  }
}

// The portable log and exp are within a few float ulps of the library's (in double).
TEST(CounterRng, DeterministicLogAndExpAreAccurate) {
  double worst_log = 0.0, worst_exp = 0.0;
  for (float x = 5.9604645e-8f; x < 20.0f; x *= 1.0001f) {
    const double want = std::log(double(x));
    const double err = std::abs(counter_rng::det_log(x) - want) / std::max(std::abs(want), 1e-30);
    if (std::abs(want) > 1e-3) worst_log = std::max(worst_log, err);
  }
  for (float x = -23.0f; x <= 0.0f; x += 1.0f / 1024) {
    worst_exp = std::max(worst_exp, std::abs(counter_rng::det_exp(x) - std::exp(double(x))) / std::exp(double(x)));
  }
  EXPECT_LT(worst_log, 4 * 0x1p-23);
  EXPECT_LT(worst_exp, 4 * 0x1p-23);
  EXPECT_EQ(counter_rng::det_exp(0.0f), 1.0f);
  EXPECT_EQ(counter_rng::det_log(1.0f), 0.0f);
  EXPECT_EQ(counter_rng::softmax_mass(0.0f), uint64_t{1} << 32);
  EXPECT_EQ(counter_rng::softmax_mass(-24.0f), 0u);
  EXPECT_EQ(counter_rng::softmax_mass(-std::numeric_limits<float>::infinity()), 0u);
}

// Gumbel noise: inside its stated bounds, with the distribution's mean (Euler's gamma) and variance (pi^2 / 6).
TEST(CounterRng, GumbelNoiseHasTheGumbelMoments) {
  const uint64_t key = counter_rng::stream_key(99, 4);
  constexpr int kDraws = 400000;
  double sum = 0.0, sum_sq = 0.0;
  for (int32_t i = 0; i < kDraws; ++i) {
    const float g = counter_rng::gumbel_at(key, i);
    ASSERT_GE(g, counter_rng::kGumbelMin);
    ASSERT_LE(g, counter_rng::kGumbelMax);
    sum += g;
    sum_sq += double(g) * g;
  }
  const double mean = sum / kDraws, variance = sum_sq / kDraws - mean * mean;
  const double pi2_6 = M_PI * M_PI / 6.0;
  EXPECT_NEAR(mean, 0.5772156649, 5.0 * std::sqrt(pi2_6 / kDraws));
  EXPECT_NEAR(variance, pi2_6, 0.03);
  // Both extremes of u map inside the bounds.
  EXPECT_GE(-counter_rng::det_log(-counter_rng::det_log(0x1p-24f)), counter_rng::kGumbelMin);
  EXPECT_LE(-counter_rng::det_log(-counter_rng::det_log(1.0f - 0x1p-24f)), counter_rng::kGumbelMax);
}

// ---------------------------------------------------------------------------------------------------------------
// The sampling op on the CPU backend

// Runs the op on a host batch; returns each row's result.
std::vector<SampledToken> run_sample(Backend& cpu, const SampleBatch& b) {
  const int64_t n = b.num_rows();
  std::vector<SampledToken> out(static_cast<size_t>(n));
  const std::vector<int32_t> words = b.row_words();
  const auto list = [](const std::vector<int32_t>& v) {
    return ConstTensorView(v.data(), DType::kI32, {static_cast<int64_t>(v.size())}, Device::kCpu);
  };
  cpu.sample({.logits = {b.logits.data(), DType::kF32, {n, b.vocab}, Device::kCpu},
              .rows = {words.data(), DType::kI32, {n, kSamplingRowWords}, Device::kCpu},
              .penalty_tokens = list(b.penalty_tokens), .penalty_counts = list(b.penalty_counts),
              .masked_tokens = list(b.masked_tokens),
              .allowed_tokens = b.allowed_tokens.empty()
                                    ? ConstTensorView{}
                                    : ConstTensorView(b.allowed_tokens.data(), DType::kI32,
                                                      {b.num_allowed_rows(), b.allowed_words()}, Device::kCpu),
              .out = {static_cast<void*>(out.data()), DType::kI32, {n, kSampledTokenWords}, Device::kCpu}});
  return out;
}

// `draws` rows of the same logits and parameters, steps 0, 1, 2, ...: the tokens drawn. With `allowed`, every row
// has the grammar mask that allows those tokens.
std::vector<int32_t> draw(Backend& cpu, const std::vector<float>& logits, SamplingRow p, int draws,
                          const std::optional<std::vector<int32_t>>& allowed = std::nullopt) {
  SampleBatch b{.vocab = static_cast<int64_t>(logits.size())};
  if (allowed) p.allowed_row = b.add_allowed(*allowed);
  for (int i = 0; i < draws; ++i) {
    p.step = i;
    b.add(logits, p);
  }
  std::vector<int32_t> tokens;
  for (const SampledToken& t : run_sample(cpu, b)) tokens.push_back(t.token);
  return tokens;
}

std::vector<float> logits_of_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// The distribution ops/sample.h samples from, in double: softmax(l / T) over the kept tokens, renormalized.
std::vector<double> kept_distribution(const std::vector<float>& l, const SamplingRow& p) {
  const size_t v = l.size();
  std::vector<double> s(v);
  for (size_t i = 0; i < v; ++i) s[i] = double(l[i]) / p.temperature;
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
  const double max_s = s[order[0]];
  std::vector<double> w(v);
  for (size_t i = 0; i < v; ++i) w[i] = std::exp(s[i] - max_s);
  size_t kept = v;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < v) kept = static_cast<size_t>(p.top_k);
  double total = 0.0, cumulative = 0.0;
  for (size_t j = 0; j < kept; ++j) total += w[order[j]];
  if (p.top_p < 1.0f) {
    for (size_t j = 0; j < kept; ++j) {
      cumulative += w[order[j]];
      if (cumulative >= p.top_p * total) {
        kept = j + 1;
        break;
      }
    }
  }
  std::vector<double> dist(v, 0.0);
  double z = 0.0;
  for (size_t j = 0; j < kept; ++j) {
    if (s[order[j]] - max_s >= p.log_min_p) z += w[order[j]];
  }
  for (size_t j = 0; j < kept; ++j) {
    if (s[order[j]] - max_s >= p.log_min_p) dist[order[j]] = w[order[j]] / z;
  }
  return dist;
}

// 20000 draws (steps 0..19999) against the kept distribution: no token outside it, and a chi-square fit inside.
// With `allowed` (a grammar mask), the kept distribution is that of the logits with every other token at -inf.
void expect_fits(Backend& cpu, const std::vector<float>& logits, SamplingRow p, const std::string& what,
                 const std::optional<std::vector<int32_t>>& allowed = std::nullopt) {
  constexpr int kDraws = 20000;
  std::vector<float> kept_logits = logits;
  if (allowed) {
    kept_logits.assign(logits.size(), kNegInf);
    for (const int32_t t : *allowed) kept_logits[static_cast<size_t>(t)] = logits[static_cast<size_t>(t)];
  }
  const std::vector<double> want = kept_distribution(kept_logits, p);
  std::vector<int64_t> counts(logits.size(), 0);
  for (int32_t t : draw(cpu, logits, p, kDraws, allowed)) ++counts[static_cast<size_t>(t)];
  double chi2 = 0.0;
  int kept = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    if (want[t] == 0.0) {
      EXPECT_EQ(counts[t], 0) << what << ": token " << t << " is outside the kept set";
      continue;
    }
    ++kept;
    const double expected = want[t] * kDraws;
    chi2 += std::pow(double(counts[t]) - expected, 2) / expected;
  }
  ASSERT_GT(kept, 1) << what << ": a test of one kept token says nothing about the frequencies";
  EXPECT_LT(chi2, chi_square_bound(kept - 1)) << what << ": " << kept << " kept tokens";
}

TEST(SampleOp, FrequenciesFitTheKeptDistribution) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> eight = logits_of_probs({0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02});
  expect_fits(*cpu, eight, {.temperature = 1.0f, .seed = 11}, "temperature 1");
  expect_fits(*cpu, eight, {.temperature = 0.5f, .seed = 12}, "temperature 0.5");
  expect_fits(*cpu, eight, {.temperature = 2.0f, .seed = 13}, "temperature 2");
  expect_fits(*cpu, eight, {.temperature = 1.0f, .top_k = 3, .seed = 14}, "top_k 3");
  expect_fits(*cpu, eight, {.temperature = 1.0f, .top_p = 0.6f, .seed = 15}, "top_p 0.6");
  expect_fits(*cpu, eight, {.temperature = 1.0f, .top_p = 0.9f, .seed = 16}, "top_p 0.9");
  expect_fits(*cpu, eight, {.temperature = 1.0f, .log_min_p = std::log(0.3f), .seed = 17}, "min_p 0.3");
  expect_fits(*cpu, eight, {.temperature = 0.8f, .top_k = 6, .top_p = 0.8f, .log_min_p = std::log(0.1f),
                            .seed = 18}, "top_k 6, top_p 0.8, min_p 0.1, temperature 0.8");
  // A wider vocabulary: 50 tokens of random logits, temperature and top-p.
  op_test::Rng rng(19);
  const std::vector<float> fifty = rng.uniform(50, -2.0f, 2.0f);
  expect_fits(*cpu, fifty, {.temperature = 1.0f, .seed = 20}, "50 tokens");
  expect_fits(*cpu, fifty, {.temperature = 0.7f, .top_p = 0.7f, .seed = 21}, "50 tokens, top_p 0.7");
}

// Ported from the host sampler's tests: which tokens each filter can return.
TEST(SampleOp, TopKTopPAndMinPRestrictTheSupport) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> logits = logits_of_probs({0.5, 0.3, 0.15, 0.05});
  const auto support = [&](SamplingRow p) {
    const std::vector<int32_t> tokens = draw(*cpu, logits, p, 3000);
    return std::set<int32_t>(tokens.begin(), tokens.end());
  };
  EXPECT_EQ(support({.temperature = 1.0f, .top_k = 2}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support({.temperature = 1.0f, .top_p = 0.75f}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support({.temperature = 1.0f, .top_p = 0.85f}), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(support({.temperature = 1.0f, .log_min_p = std::log(0.4f)}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(support({.temperature = 1.0f, .log_min_p = std::log(0.05f)}), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(support({.temperature = 1.0f, .top_k = 3, .top_p = 0.6f}), (std::set<int32_t>{0, 1}));
}

TEST(SampleOp, SameSeedAndStepGiveTheSameToken) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> flat(50, 0.0f);
  SampleBatch b{.vocab = 50};
  for (int i = 0; i < 3; ++i) b.add(flat, {.temperature = 1.0f, .seed = 77, .step = 5});
  b.add(flat, {.temperature = 1.0f, .seed = 78, .step = 5});
  const std::vector<SampledToken> out = run_sample(*cpu, b);
  EXPECT_EQ(out[0].token, out[1].token);
  EXPECT_EQ(out[0].token, out[2].token);
  EXPECT_EQ(out[0].token, run_sample(*cpu, b)[0].token);  // and again in another call
  // Different steps draw differently: 32 steps of a flat 50-token row are not all one token, and a seed's sequence
  // differs from another seed's.
  const std::vector<int32_t> a = draw(*cpu, flat, {.temperature = 1.0f, .seed = 77}, 32);
  const std::vector<int32_t> c = draw(*cpu, flat, {.temperature = 1.0f, .seed = 78}, 32);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 10u);
  EXPECT_NE(a, c);
  EXPECT_EQ(a, draw(*cpu, flat, {.temperature = 1.0f, .seed = 77}, 32));
}

// A seeded row draws the same token whatever else the batch holds (the noise is a function of seed, step, token),
// wherever it sits, and whatever penalties and masks the other rows carry.
TEST(SampleOp, ASeededRowIgnoresTheRestOfTheBatch) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  op_test::Rng rng(5);
  const std::vector<float> mine = rng.uniform(300, -1.0f, 1.0f);
  const SamplingRow p{.temperature = 0.9f, .top_p = 0.95f, .seed = 31337, .step = 12};
  const std::vector<std::pair<int32_t, int32_t>> my_penalties{{1, 2}, {250, 0}};
  SampleBatch alone{.vocab = 300};
  alone.add(mine, p, my_penalties);
  const int32_t token = run_sample(*cpu, alone)[0].token;
  for (int position = 0; position < 4; ++position) {
    SampleBatch batch{.vocab = 300};
    for (int i = 0; i < 4; ++i) {
      if (i == position) batch.add(mine, p, my_penalties);
      batch.add(rng.uniform(300, -3.0f, 3.0f), {.temperature = 1.0f, .top_k = 7, .seed = uint64_t(i), .step = i},
                {{7, 1}, {8, 0}}, {9});
    }
    EXPECT_EQ(run_sample(*cpu, batch)[static_cast<size_t>(position)].token, token) << "at row " << position;
  }
}

TEST(SampleOp, GreedyIgnoresTheSeed) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> l{0.1f, 2.0f, -1.0f, 1.9f, 2.0f};  // a tie: the lower index wins
  SampleBatch b{.vocab = 5};
  for (uint64_t seed = 0; seed < 4; ++seed) b.add(l, {.temperature = 0.0f, .seed = seed, .step = int32_t(seed)});
  for (const SampledToken& t : run_sample(*cpu, b)) EXPECT_EQ(t.token, 1);
}

// Ported from the host sampler's tests: logits {4, -4, 3, 1}, prompt {0, 1}, output {1, 2, 2} give the penalized
// values {2, -8.75, 0.5, 1}; masks single out the pairs whose order shows each value.
TEST(SampleOp, PenaltiesChangeTheLogitsAsSpecified) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> l{4.0f, -4.0f, 3.0f, 1.0f};
  const SamplingRow p{.temperature = 0.0f, .repetition_penalty = 2.0f, .presence_penalty = 0.5f,
                      .frequency_penalty = 0.25f};
  const std::vector<std::pair<int32_t, int32_t>> penalties{{0, 0}, {1, 1}, {2, 2}};
  SampleBatch b{.vocab = 4};
  b.add(l, p, penalties);             // 2 > 1 > 0.5 > -8.75: token 0
  b.add(l, p, penalties, {0});        // 1 > 0.5: token 3 (unpenalized, token 2 would win with 3.0)
  b.add(l, p, penalties, {0, 3});     // 0.5 > -8.75: token 2
  b.add(l, p, penalties, {0, 2, 3});  // only token 1 is left
  const std::vector<SampledToken> out = run_sample(*cpu, b);
  EXPECT_EQ(out[0].token, 0);
  EXPECT_EQ(out[1].token, 3);
  EXPECT_EQ(out[2].token, 2);
  EXPECT_EQ(out[3].token, 1);
  // The exact values: the pairs (2.0 vs 2.0 + d) tie only for d = 0; shift token 3's logit to meet each value.
  for (const auto& [token, value] : std::vector<std::pair<int32_t, float>>{{0, 2.0f}, {2, 0.5f}}) {
    std::vector<float> shifted = l;
    shifted[3] = value;  // token 3 (unpenalized) equals the penalized value: the lower index wins the tie
    SampleBatch tie{.vocab = 4};
    std::vector<int32_t> masked;
    for (int32_t t = 0; t < 3; ++t) {
      if (t != token) masked.push_back(t);
    }
    tie.add(shifted, p, penalties, masked);
    EXPECT_EQ(run_sample(*cpu, tie)[0].token, token) << "penalized value of token " << token;
  }
}

// Ported: EOS and stop ids are masked before min_tokens (the engine lists them); after, they can win.
TEST(SampleOp, MasksRemoveEosAndStopIds) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::vector<float> l(10, 0.0f);
  l[9] = 10.0f;  // EOS
  l[3] = 9.0f;   // a stop id
  l[4] = 1.0f;
  SampleBatch b{.vocab = 10};
  b.add(l, {.temperature = 0.0f}, {}, {9, 3});
  b.add(l, {.temperature = 0.0f});
  b.add(l, {.temperature = 0.5f, .seed = 3}, {}, {9, 3});
  const std::vector<SampledToken> out = run_sample(*cpu, b);
  EXPECT_EQ(out[0].token, 4);
  EXPECT_EQ(out[1].token, 9);
  EXPECT_NE(out[2].token, 9);
  EXPECT_NE(out[2].token, 3);
}

// Ported: logprobs are the raw log-softmax (penalties do not leak into them), the top ones sorted.
TEST(SampleOp, LogprobsAreTheRawLogSoftmaxSorted) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  SampleBatch b{.vocab = 3};
  b.add(std::vector<float>{1.0f, 3.0f, 2.0f}, {.temperature = 0.0f, .repetition_penalty = 3.0f, .num_logprobs = 2},
        {{1, 0}});
  b.add(std::vector<float>{1.0f, 3.0f, 2.0f}, {.temperature = 0.0f});
  const std::vector<SampledToken> out = run_sample(*cpu, b);
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(out[0].token, 2);  // 3 / 3 = 1 < 2 after the penalty
  EXPECT_NEAR(out[0].logprob, 2.0 - z, 1e-6);
  ASSERT_EQ(out[0].num_top, 2);
  EXPECT_EQ(out[0].top_ids[0], 1);
  EXPECT_EQ(out[0].top_ids[1], 2);
  EXPECT_NEAR(out[0].top_logprobs[0], 3.0 - z, 1e-6);
  EXPECT_NEAR(out[0].top_logprobs[1], 2.0 - z, 1e-6);
  EXPECT_EQ(out[0].top_ids[2], 0);  // unused entries are zero
  // Without logprobs every logprob field stays zero.
  EXPECT_EQ(out[1].token, 1);
  EXPECT_EQ(out[1].logprob, 0.0f);
  EXPECT_EQ(out[1].num_top, 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Grammar masks (SamplingRow::allowed_row)

// Over many seeds and every kind of parameters, with penalties and masked lists besides, no drawn token is outside
// the grammar's set (nor on the masked list), and a set of several tokens is not collapsed to one.
TEST(SampleOp, AGrammarMaskBoundsEveryDraw) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  op_test::Rng rng(50);
  constexpr int64_t kVocab = 300;
  const std::vector<SamplingRow> params = {{.temperature = 1.0f},
                                           {.temperature = 0.7f, .top_k = 5},
                                           {.temperature = 1.0f, .top_k = 400},
                                           {.temperature = 1.0f, .top_p = 0.9f},
                                           {.temperature = 1.3f, .log_min_p = std::log(0.1f)},
                                           {.temperature = 0.8f, .top_k = 20, .top_p = 0.8f,
                                            .log_min_p = std::log(0.02f), .repetition_penalty = 1.3f,
                                            .presence_penalty = 0.5f}};
  for (const int64_t count : {int64_t{1}, int64_t{3}, int64_t{30}, kVocab / 2}) {
    const std::vector<int32_t> allowed = op_test::random_tokens(rng, kVocab, count);
    const std::set<int32_t> allowed_set(allowed.begin(), allowed.end());
    const int32_t on_list = allowed.back();  // masked by the list as well, when the grammar allows more
    for (const SamplingRow& base : params) {
      const std::vector<float> logits = rng.uniform(kVocab, -4.0f, 4.0f);
      SampleBatch b{.vocab = kVocab};
      const int32_t mask = b.add_allowed(allowed);
      for (int seed = 0; seed < 200; ++seed) {
        SamplingRow p = base;
        p.seed = 9000 + static_cast<uint64_t>(seed);
        p.step = seed % 7;
        p.allowed_row = mask;
        b.add(logits, p, {{allowed.front(), 2}, {(allowed.front() + 1) % 300, 1}},
              count > 1 ? std::vector<int32_t>{on_list} : std::vector<int32_t>{});
      }
      std::set<int32_t> drawn;
      for (const SampledToken& t : run_sample(*cpu, b)) {
        EXPECT_TRUE(allowed_set.contains(t.token)) << count << " allowed: drew token " << t.token;
        if (count > 1) {
          EXPECT_NE(t.token, on_list) << "a token of the masked list";
        }
        drawn.insert(t.token);
      }
      if (count == kVocab / 2 && (base.top_k == 0 || base.top_k > kVocab)) {
        EXPECT_GT(drawn.size(), 5u) << "temperature " << base.temperature << ", top_p " << base.top_p;
      }
    }
  }
}

// A grammar mask is the masked list of the tokens it disallows, and the draw is that of logits at -inf there: the
// same token for every seed and every parameter.
TEST(SampleOp, AGrammarMaskMasksTheDisallowedTokens) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  op_test::Rng rng(51);
  constexpr int64_t kVocab = 77;
  const std::vector<int32_t> allowed = op_test::random_tokens(rng, kVocab, 20);
  std::vector<int32_t> disallowed;
  for (int32_t t = 0; t < kVocab; ++t) {
    if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) disallowed.push_back(t);
  }
  const std::vector<SamplingRow> params = {{.temperature = 0.0f},
                                           {.temperature = 1.0f},
                                           {.temperature = 0.6f, .top_k = 3},
                                           {.temperature = 1.0f, .top_p = 0.7f},
                                           {.temperature = 1.0f, .log_min_p = std::log(0.2f)},
                                           {.temperature = 0.9f, .top_k = 8, .top_p = 0.9f,
                                            .log_min_p = std::log(0.05f)}};
  SampleBatch by_mask{.vocab = kVocab}, by_list{.vocab = kVocab}, by_logits{.vocab = kVocab};
  const int32_t mask = by_mask.add_allowed(allowed);
  for (const SamplingRow& base : params) {
    for (int seed = 0; seed < 50; ++seed) {
      SamplingRow p = base;
      p.seed = static_cast<uint64_t>(seed) * 131;
      p.step = seed;
      const std::vector<float> logits = rng.uniform(kVocab, -3.0f, 3.0f);
      std::vector<float> at_minus_inf = logits;
      for (const int32_t t : disallowed) at_minus_inf[static_cast<size_t>(t)] = kNegInf;
      by_list.add(logits, p, {}, disallowed);
      by_logits.add(at_minus_inf, p);
      p.allowed_row = mask;
      by_mask.add(logits, p);
    }
  }
  const std::vector<SampledToken> mask_out = run_sample(*cpu, by_mask), list_out = run_sample(*cpu, by_list),
                                  logits_out = run_sample(*cpu, by_logits);
  for (size_t i = 0; i < mask_out.size(); ++i) {
    EXPECT_EQ(mask_out[i].token, list_out[i].token) << "row " << i << ": mask vs masked list";
    EXPECT_EQ(mask_out[i].token, logits_out[i].token) << "row " << i << ": mask vs logits at -inf";
  }
}

// The frequencies fit softmax(l / T) renormalized over the allowed tokens that the filters keep.
TEST(SampleOp, FrequenciesUnderAGrammarMaskFitTheAllowedDistribution) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  op_test::Rng rng(52);
  const std::vector<float> fifty = rng.uniform(50, -2.0f, 2.0f);
  const std::vector<int32_t> allowed = op_test::random_tokens(rng, 50, 12);
  expect_fits(*cpu, fifty, {.temperature = 1.0f, .seed = 53}, "12 of 50 tokens allowed", allowed);
  expect_fits(*cpu, fifty, {.temperature = 0.7f, .top_k = 6, .seed = 54}, "12 of 50 allowed, top_k 6", allowed);
  expect_fits(*cpu, fifty, {.temperature = 1.0f, .top_p = 0.8f, .seed = 55}, "12 of 50 allowed, top_p 0.8", allowed);
}

// Greedy rows pick the largest allowed logit (the lowest index among equals), whatever larger logits the grammar
// disallows; a mask that allows nothing gives token 0, greedy or not.
TEST(SampleOp, GreedyPicksTheBestAllowedToken) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> l{5.0f, 1.0f, 4.0f, 3.0f, 4.0f, -2.0f, 6.0f, 0.5f};
  SampleBatch b{.vocab = 8};
  const int32_t some = b.add_allowed({1, 2, 3, 4, 5}), low = b.add_allowed({1, 5, 7}), nothing = b.add_allowed({});
  b.add(l, {.temperature = 0.0f, .allowed_row = some});     // 2 and 4 tie at 4: token 2
  b.add(l, {.temperature = 0.0f, .allowed_row = low});      // token 1
  b.add(l, {.temperature = 0.0f, .repetition_penalty = 1.5f, .allowed_row = some}, {{2, 1}});  // 4 / 1.5 < 4
  b.add(l, {.temperature = 0.0f, .allowed_row = nothing});
  b.add(l, {.temperature = 1.0f, .top_p = 0.5f, .seed = 1, .allowed_row = nothing});
  b.add(l, {.temperature = 0.0f});                           // no mask: token 6
  const std::vector<SampledToken> out = run_sample(*cpu, b);
  EXPECT_EQ(out[0].token, 2);
  EXPECT_EQ(out[1].token, 1);
  EXPECT_EQ(out[2].token, 4);
  EXPECT_EQ(out[3].token, 0);
  EXPECT_EQ(out[4].token, 0);
  EXPECT_EQ(out[5].token, 6);

  // Random rows: the argmax over the allowed set.
  op_test::Rng rng(56);
  SampleBatch random{.vocab = 1000};
  std::vector<std::vector<int32_t>> sets;
  for (int i = 0; i < 40; ++i) {
    sets.push_back(op_test::random_tokens(rng, 1000, 1 + i * 13));
    random.add(rng.uniform(1000, -5.0f, 5.0f), {.temperature = 0.0f, .allowed_row = random.add_allowed(sets.back())});
  }
  const std::vector<SampledToken> random_out = run_sample(*cpu, random);
  for (size_t i = 0; i < sets.size(); ++i) {
    int32_t best = -1;
    for (const int32_t t : sets[i]) {
      const float v = random.logits[i * 1000 + static_cast<size_t>(t)];
      if (best < 0 || v > random.logits[i * 1000 + static_cast<size_t>(best)] ||
          (v == random.logits[i * 1000 + static_cast<size_t>(best)] && t < best)) {
        best = t;
      }
    }
    EXPECT_EQ(random_out[i].token, best) << "row " << i << ", " << sets[i].size() << " allowed";
  }
}

// The logprobs are those of the raw distribution: the mask changes neither the top tokens (disallowed ones
// included) nor the drawn token's logprob.
TEST(SampleOp, AGrammarMaskLeavesTheRawLogprobs) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  op_test::Rng rng(57);
  const std::vector<float> l = rng.uniform(200, -4.0f, 4.0f);
  std::vector<int32_t> order(l.size());  // highest first (random floats: no ties)
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const std::vector<int32_t> allowed(order.begin() + 30, order.begin() + 40);  // none of the top 30
  for (const SamplingRow& p : {SamplingRow{.temperature = 0.0f, .num_logprobs = 20},
                               SamplingRow{.temperature = 1.0f, .top_k = 4, .seed = 8, .num_logprobs = 20}}) {
    SampleBatch b{.vocab = 200};
    SamplingRow masked = p;
    masked.allowed_row = b.add_allowed(allowed);
    b.add(l, masked);
    b.add(l, p);
    const std::vector<SampledToken> out = run_sample(*cpu, b);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), out[0].token), allowed.end());
    ASSERT_EQ(out[0].num_top, 20);
    for (int j = 0; j < 20; ++j) {
      EXPECT_EQ(out[0].top_ids[j], order[static_cast<size_t>(j)]);
      EXPECT_EQ(out[0].top_ids[j], out[1].top_ids[j]);
      EXPECT_EQ(out[0].top_logprobs[j], out[1].top_logprobs[j]);
    }
    // The drawn token's logprob: the raw log-softmax at it (the unmasked row's top list holds the same values).
    double z = 0.0;
    for (float v : l) z += std::exp(double(v) - l[order[0]]);
    const double want = double(l[static_cast<size_t>(out[0].token)]) - l[order[0]] - std::log(z);
    EXPECT_NEAR(out[0].logprob, want, 1e-5);
    EXPECT_LT(out[0].logprob, out[0].top_logprobs[19]);  // below every top token: the mask made no difference
  }
}

// Validation: each bad value names the op, the row and the value.
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SampleOp, ValidationNamesTheRowAndTheValue) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::vector<float> l(16, 0.0f);
  const auto with_row = [&](SamplingRow bad, std::vector<std::pair<int32_t, int32_t>> penalties = {},
                            std::vector<int32_t> masked = {}) {
    SampleBatch b{.vocab = 16};
    b.add(l, {.temperature = 1.0f});
    b.add(l, bad, penalties, masked);
    return [b, &cpu] { run_sample(*cpu, b); };
  };
  expect_error(with_row({.temperature = 1.0f, .top_p = 0.0f}), "sample: row 1 top_p 0 outside (0, 1]");
  expect_error(with_row({.temperature = 1.0f, .top_p = 1.5f}), "sample: row 1 top_p 1.5 outside (0, 1]");
  expect_error(with_row({.temperature = std::nanf("")}), "sample: row 1 temperature nan");
  expect_error(with_row({.temperature = -0.5f}), "sample: row 1 temperature -0.5");
  expect_error(with_row({.temperature = 1.0f, .top_k = -1}), "sample: row 1 top_k -1");
  expect_error(with_row({.temperature = 1.0f, .log_min_p = 0.5f}), "sample: row 1 log_min_p 0.5");
  expect_error(with_row({.temperature = 1.0f, .num_logprobs = 21}), "sample: row 1 num_logprobs 21 outside [-1, 20]");
  expect_error(with_row({.temperature = 1.0f, .repetition_penalty = 0.0f}), "sample: row 1 repetition_penalty 0");
  expect_error(with_row({.temperature = 1.0f}, {{16, 1}}), "sample: penalty token 16 at [0] outside [0, 16)");
  expect_error(with_row({.temperature = 1.0f}, {}, {-3}), "sample: masked token -3 at [0] outside [0, 16)");
  expect_error(with_row({.temperature = 1.0f}, {{4, 1}, {4, 0}}), "sample: row 1 lists penalty token 4 twice");
  expect_error(with_row({.temperature = 1.0f}, {{4, -1}}), "sample: penalty count -1 at [0] is negative");
  {
    SampleBatch b{.vocab = 16};
    b.add(l, {.temperature = 1.0f}, {{2, 1}}, {5});
    b.rows[0].penalty_end = 3;
    expect_error([&] { run_sample(*cpu, b); }, "sample: row 0 penalty range [0, 3) outside the 1 penalty tokens");
    b.rows[0].penalty_end = 1;
    b.rows[0].mask_begin = -1;
    expect_error([&] { run_sample(*cpu, b); }, "sample: row 0 mask range [-1, 1) outside the 1 masked tokens");
  }
  // Shapes: rows of the wrong width, an output of the wrong height, a vocabulary of zero.
  std::vector<int32_t> words(2 * kSamplingRowWords, 0);
  std::vector<SampledToken> out(2);
  const ConstTensorView logits{l.data(), DType::kF32, {1, 16}, Device::kCpu};
  const TensorView out_view{static_cast<void*>(out.data()), DType::kI32, {1, kSampledTokenWords}, Device::kCpu};
  expect_error([&] {
    cpu->sample({.logits = logits, .rows = {words.data(), DType::kI32, {1, kSamplingRowWords - 1}, Device::kCpu},
                 .out = out_view});
  }, "sample: rows [1, 19] for logits [1, 16]: expected [1, 20]");
  expect_error([&] {
    cpu->sample({.logits = logits, .rows = {words.data(), DType::kI32, {1, kSamplingRowWords}, Device::kCpu},
                 .out = {static_cast<void*>(out.data()), DType::kI32, {2, kSampledTokenWords}, Device::kCpu}});
  }, "sample: out [2, 44] for logits [1, 16]: expected [1, 44]");
  expect_error([&] {
    cpu->sample({.logits = {l.data(), DType::kF32, {1, 0}, Device::kCpu},
                 .rows = {words.data(), DType::kI32, {1, kSamplingRowWords}, Device::kCpu}, .out = out_view});
  }, "sample: logits [1, 0] must have a vocabulary of 1 to 2^31 - 1 tokens");
  // Grammar masks: a row past the masks (or naming one when there are none), the wrong width, a scored row with a
  // mask.
  {
    SampleBatch b{.vocab = 40};
    const std::vector<float> forty(40, 0.0f);
    b.add(forty, {.temperature = 1.0f, .allowed_row = b.add_allowed({1, 2})});
    b.add(forty, {.temperature = 1.0f, .allowed_row = 1});
    expect_error([&] { run_sample(*cpu, b); }, "sample: row 1 allowed_row 1 outside [-1, 1)");
    b.rows[1].allowed_row = -2;
    expect_error([&] { run_sample(*cpu, b); }, "sample: row 1 allowed_row -2 outside [-1, 1)");
    b.rows[1] = {.temperature = 0.0f, .score_token = 3, .allowed_row = 0};
    expect_error([&] { run_sample(*cpu, b); }, "sample: row 1 scores token 3 but has a grammar mask");
    b.rows[1] = {.temperature = 1.0f};
    const std::vector<int32_t> row_words = b.row_words();
    std::vector<SampledToken> two(2);
    const auto with_allowed = [&](ConstTensorView allowed) {
      return [&, allowed] {
        cpu->sample({.logits = {b.logits.data(), DType::kF32, {2, 40}, Device::kCpu},
                     .rows = {row_words.data(), DType::kI32, {2, kSamplingRowWords}, Device::kCpu},
                     .allowed_tokens = allowed,
                     .out = {static_cast<void*>(two.data()), DType::kI32, {2, kSampledTokenWords}, Device::kCpu}});
      };
    };
    std::vector<int32_t> wide(6, -1);
    expect_error(with_allowed({wide.data(), DType::kI32, {2, 3}, Device::kCpu}),
                 "sample: allowed_tokens [2, 3] for a vocabulary of 40: expected [rows, 2]");
    expect_error(with_allowed({wide.data(), DType::kI32, {1, 1}, Device::kCpu}),
                 "sample: allowed_tokens [1, 1] for a vocabulary of 40: expected [rows, 2]");
    expect_error(with_allowed({wide.data(), DType::kI32, {4}, Device::kCpu}),
                 "sample: allowed_tokens [4] for a vocabulary of 40: expected [rows, 2]");
    expect_error(with_allowed({wide.data(), DType::kF32, {1, 2}, Device::kCpu}),
                 "sample: allowed_tokens must be int32");
    with_allowed({wide.data(), DType::kI32, {3, 2}, Device::kCpu})();  // the right shape: both rows draw
    expect_error(with_allowed(ConstTensorView{}), "sample: row 0 allowed_row 0 outside [-1, 0)");
  }
  // Default (empty) token lists are fine when no row uses them.
  SamplingRow p{.temperature = 0.0f};
  std::memcpy(words.data(), static_cast<const void*>(&p), sizeof p);
  cpu->sample({.logits = logits, .rows = {words.data(), DType::kI32, {1, kSamplingRowWords}, Device::kCpu},
               .out = out_view});
  EXPECT_EQ(out[0].token, 0);
}

}  // namespace
}  // namespace deepinfer
