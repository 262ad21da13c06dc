#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> log_softmax(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  const float log_norm = max_logit + static_cast<float>(std::log(sum));
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_norm;
  return out;
}

void apply_penalties(std::span<float> logits, const SamplingContext& ctx) {
  const SamplingParams& p = ctx.params;
  if (p.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(ctx.prompt_token_ids.begin(), ctx.prompt_token_ids.end());
    seen.insert(ctx.output_token_ids.begin(), ctx.output_token_ids.end());
    for (int32_t t : seen) {
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : ctx.output_token_ids) ++counts[t];
    for (const auto& [token, count] : counts) {
      logits[static_cast<size_t>(token)] -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
    }
  }
}

void mask_stops_before_min_tokens(std::span<float> logits, const SamplingContext& ctx) {
  if (static_cast<int32_t>(ctx.output_token_ids.size()) >= ctx.params.min_tokens) return;
  if (!ctx.params.ignore_eos) {
    for (int32_t t : ctx.eos_token_ids) logits[static_cast<size_t>(t)] = kNegInf;
  }
  for (int32_t t : ctx.params.stop_token_ids) logits[static_cast<size_t>(t)] = kNegInf;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Samples from softmax(logits / temperature) over the whole vocabulary: no sort needed.
int32_t sample_unfiltered(std::span<const float> logits, float temperature, std::mt19937_64& rng) {
  const float max_scaled = *std::max_element(logits.begin(), logits.end()) / temperature;
  std::vector<double> weights(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = logits[i] == kNegInf ? 0.0 : std::exp(static_cast<double>(logits[i] / temperature - max_scaled));
    sum += weights[i];
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * sum;
  double cumulative = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    cumulative += weights[i];
    if (u < cumulative) return static_cast<int32_t>(i);
  }
  return argmax(logits);
}

// Samples from softmax(logits / temperature) restricted by top_k, top_p and min_p, with one uniform draw.
int32_t sample_filtered(std::span<const float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  if ((p.top_k <= 0 || static_cast<size_t>(p.top_k) >= logits.size()) && p.top_p >= 1.0f && p.min_p <= 0.0f) {
    return sample_unfiltered(logits, p.temperature, rng);
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), order.size()) : order.size();
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), by_logit);
  order.resize(k);
  // Probabilities of the top-k candidates (most likely first).
  const float max_scaled = logits[order[0]] / p.temperature;
  std::vector<double> probs(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    probs[i] = logits[order[i]] == kNegInf ? 0.0 : std::exp(static_cast<double>(logits[order[i]] / p.temperature - max_scaled));
    sum += probs[i];
  }
  for (double& q : probs) q /= sum;
  size_t keep = k;
  if (p.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += probs[i];
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double threshold = p.min_p * probs[0];
    size_t n = 0;
    while (n < keep && probs[n] >= threshold) ++n;
    keep = std::max<size_t>(n, 1);
  }
  double kept_sum = 0.0;
  for (size_t i = 0; i < keep; ++i) kept_sum += probs[i];
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * kept_sum;
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

}  // namespace

SampleResult sample_token(std::span<float> logits, const SamplingContext& ctx) {
  const SamplingParams& p = ctx.params;
  DI_CHECK(!logits.empty(), "sample_token: empty logits");
  SampleResult result;
  std::vector<float> raw_logprobs;
  if (p.logprobs >= 0) raw_logprobs = log_softmax(logits);  // what the model said, before any processing

  apply_penalties(logits, ctx);
  mask_stops_before_min_tokens(logits, ctx);
  result.token = p.temperature == 0.0f ? argmax(logits) : sample_filtered(logits, p, ctx.rng);

  if (p.logprobs >= 0) {
    result.logprob = raw_logprobs[static_cast<size_t>(result.token)];
    std::vector<int32_t> order(raw_logprobs.size());
    std::iota(order.begin(), order.end(), 0);
    const size_t n = std::min<size_t>(static_cast<size_t>(p.logprobs), order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                      [&](int32_t a, int32_t b) { return raw_logprobs[a] > raw_logprobs[b] || (raw_logprobs[a] == raw_logprobs[b] && a < b); });
    for (size_t i = 0; i < n; ++i) result.top_logprobs.push_back({order[i], raw_logprobs[static_cast<size_t>(order[i])]});
  }
  return result;
}

}  // namespace deepinfer
