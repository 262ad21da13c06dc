// The CPU reference of the sampling op (ops/sample.h): each row in straight loops, rows in parallel.
//
// The float values every threshold compares are computed exactly as the device computes them: s_i = l_i /
// temperature, s_i - max(s) and s_i + g_i are single float operations; the Gumbel noise and the top-p masses come
// from core/counter_rng.h, whose math rounds the same way on both sides. So the two backends agree on every token,
// not only on distributions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/counter_rng.h"

namespace deepinfer::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The first index of the largest value.
int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Step 2 of ops/sample.h on a copy of the raw logits: penalties, then the mask.
std::vector<float> penalized_logits(std::span<const float> raw, const SamplingRow& p, const SampleArgs& a) {
  std::vector<float> l(raw.begin(), raw.end());
  const int32_t* tokens = a.penalty_tokens.as<int32_t>();
  const int32_t* counts = a.penalty_counts.as<int32_t>();
  for (int32_t j = p.penalty_begin; j < p.penalty_end; ++j) {
    float& v = l[static_cast<size_t>(tokens[j])];
    v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    if (counts[j] > 0) {
      const float penalty = p.frequency_penalty * static_cast<float>(counts[j]) + p.presence_penalty;
      v -= penalty;
    }
  }
  const int32_t* masked = a.masked_tokens.as<int32_t>();
  for (int32_t j = p.mask_begin; j < p.mask_end; ++j) l[static_cast<size_t>(masked[j])] = kNegInf;
  if (p.allowed_row >= 0) {
    const auto* allowed = reinterpret_cast<const uint32_t*>(a.allowed_tokens.as<int32_t>()) +
                          static_cast<int64_t>(p.allowed_row) * a.allowed_tokens.shape[1];
    for (size_t t = 0; t < l.size(); ++t) {
      if (((allowed[t / 32] >> (t % 32)) & 1u) == 0) l[t] = kNegInf;
    }
  }
  return l;
}

// The k-th largest value (k in [1, size]).
float kth_largest(std::vector<float> v, int32_t k) {
  std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<float>());
  return v[static_cast<size_t>(k - 1)];
}

// The top-p threshold: the largest L among the values s_i >= kth such that the tokens with s >= L hold at least
// top_p of the mass of all tokens with s >= kth.
float top_p_threshold(std::span<const float> s, float kth, float max_s, float top_p) {
  std::vector<std::pair<float, uint64_t>> kept;  // (s, mass)
  uint64_t total = 0;
  for (float v : s) {
    if (v < kth) continue;
    const uint64_t mass = counter_rng::softmax_mass(v - max_s);
    kept.emplace_back(v, mass);
    total += mass;
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const uint64_t target = counter_rng::top_p_target(top_p, total);
  uint64_t cumulative = 0;
  for (size_t j = 0; j < kept.size();) {
    const float value = kept[j].first;
    for (; j < kept.size() && kept[j].first == value; ++j) cumulative += kept[j].second;  // ties together
    if (cumulative >= target) return value;
  }
  return kNegInf;  // unreachable: the largest value alone holds a positive mass and the total holds the target
}

// Step 3 with temperature > 0: the kept set, then the Gumbel-max draw over it.
int32_t draw(std::span<const float> l, const SamplingRow& p) {
  const auto vocab = static_cast<int32_t>(l.size());
  std::vector<float> s(l.size());
  for (size_t i = 0; i < l.size(); ++i) s[i] = l[i] / p.temperature;
  const float max_s = *std::max_element(s.begin(), s.end());
  if (!std::isfinite(max_s)) return argmax(l);  // every token masked (or s overflowed): the greedy token

  const float kth = p.top_k > 0 && p.top_k < vocab ? kth_largest(s, p.top_k) : kNegInf;
  const float nucleus = p.top_p < 1.0f ? top_p_threshold(s, kth, max_s, p.top_p) : kNegInf;
  const uint64_t key = counter_rng::stream_key(p.seed, p.step);
  int32_t best = -1;
  float best_score = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) {
    if (s[i] < kth || s[i] < nucleus || !(s[i] - max_s >= p.log_min_p)) continue;
    const float score = s[i] + counter_rng::gumbel_at(key, i);
    if (best < 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

// Step 4: the token's raw logprob and the num_logprobs most likely raw tokens.
void write_logprobs(std::span<const float> raw, int32_t num_logprobs, SampledToken& out) {
  const float max_raw = *std::max_element(raw.begin(), raw.end());
  double sum = 0.0;
  for (float v : raw) sum += std::exp(static_cast<double>(v) - max_raw);
  const double log_norm = static_cast<double>(max_raw) + std::log(sum);
  const auto logprob = [&](int32_t i) { return static_cast<float>(static_cast<double>(raw[i]) - log_norm); };
  out.logprob = logprob(out.token);
  const int32_t n = std::min<int32_t>(num_logprobs, static_cast<int32_t>(raw.size()));
  std::vector<int32_t> order(raw.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
  out.num_top = n;
  for (int32_t j = 0; j < n; ++j) {
    out.top_ids[j] = order[j];
    out.top_logprobs[j] = logprob(order[j]);
  }
}

}  // namespace

void sample(const SampleArgs& a) {
  a.validate();
  expect_host(a.logits, "sample");
  expect_host(a.out, "sample");
  const int64_t rows = a.logits.shape[0], vocab = a.logits.shape[1];
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < rows; ++r) {
    SamplingRow p;
    std::memcpy(static_cast<void*>(&p), a.rows.as<int32_t>() + r * kSamplingRowWords, sizeof p);
    const std::span<const float> raw(a.logits.f32() + r * vocab, static_cast<size_t>(vocab));
    const std::vector<float> l = penalized_logits(raw, p, a);
    SampledToken out;
    out.token = p.score_token >= 0 ? p.score_token : p.temperature == 0.0f ? argmax(l) : draw(l, p);
    if (p.num_logprobs >= 0) write_logprobs(raw, p.num_logprobs, out);
    std::memcpy(a.out.as<int32_t>() + r * kSampledTokenWords, &out, sizeof out);
  }
}

}  // namespace deepinfer::cpu
