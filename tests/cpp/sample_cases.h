// The sample op cases of the CPU op tests, against the naive sampler below (temperature, penalties, top-k / top-p /
// min-p, seeded draws; a device backend runs the same cases against the CPU), and the bad-argument cases.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "op_test_harness.h"

namespace deepinfer::op_test {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Indices ordered by value, highest first, lower index first among equals.
inline std::vector<int32_t> order_by_value(std::span<const float> v) {
  std::vector<int32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return order;
}

// The naive formula of ops/sample.h for one row: the tokens sorted by value once, every threshold a prefix of that
// order. The noise and the fixed-point masses are the op's definition (core/counter_rng.h).
inline SampledToken naive_sample_row(std::span<const float> raw, const SamplingRow& p, const SampleBatch& b) {
  const auto vocab = static_cast<int32_t>(raw.size());
  std::vector<float> l(raw.begin(), raw.end());
  for (int32_t j = p.penalty_begin; j < p.penalty_end; ++j) {
    float& v = l[b.penalty_tokens[j]];
    v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    if (b.penalty_counts[j] > 0) v -= p.frequency_penalty * static_cast<float>(b.penalty_counts[j]) + p.presence_penalty;
  }
  for (int32_t j = p.mask_begin; j < p.mask_end; ++j) l[b.masked_tokens[j]] = kNegInf;
  for (int32_t t = 0; t < vocab; ++t) {
    if (!b.allowed(p, t)) l[t] = kNegInf;
  }

  SampledToken out;
  if (p.temperature == 0.0f) {
    out.token = order_by_value(l)[0];
  } else {
    std::vector<float> s(l.size());
    for (size_t i = 0; i < s.size(); ++i) s[i] = l[i] / p.temperature;
    const std::vector<int32_t> order = order_by_value(s);
    const float max_s = s[order[0]];
    out.token = order_by_value(l)[0];  // kept when nothing can be drawn: every token masked
    if (max_s != kNegInf) {
      // top_k keeps a prefix of the order: k tokens and whatever ties the k-th.
      int32_t kept = vocab;
      if (p.top_k > 0 && p.top_k < vocab) {
        kept = p.top_k;
        while (kept < vocab && s[order[kept]] == s[order[p.top_k - 1]]) ++kept;
      }
      // top_p keeps the shortest prefix of those, ending at a change of value, that holds top_p of their mass.
      if (p.top_p < 1.0f) {
        uint64_t total = 0, cumulative = 0;
        for (int32_t j = 0; j < kept; ++j) total += counter_rng::softmax_mass(s[order[j]] - max_s);
        const uint64_t target = counter_rng::top_p_target(p.top_p, total);
        for (int32_t j = 0; j < kept; ++j) {
          cumulative += counter_rng::softmax_mass(s[order[j]] - max_s);
          if (cumulative >= target && (j + 1 == kept || s[order[j + 1]] != s[order[j]])) {
            kept = j + 1;
            break;
          }
        }
      }
      const uint64_t key = counter_rng::stream_key(p.seed, p.step);
      int32_t best = -1;
      float best_score = 0.0f;
      for (int32_t j = 0; j < kept; ++j) {
        const int32_t i = order[j];
        if (!(s[i] - max_s >= p.log_min_p)) continue;
        const float score = s[i] + counter_rng::gumbel_at(key, i);
        if (best < 0 || score > best_score || (score == best_score && i < best)) {
          best = i;
          best_score = score;
        }
      }
      out.token = best;
    }
  }
  if (p.num_logprobs >= 0) {
    double max_raw = raw[0], sum = 0.0;
    for (float v : raw) max_raw = std::max(max_raw, double(v));
    for (float v : raw) sum += std::exp(double(v) - max_raw);
    const auto logprob = [&](int32_t i) { return static_cast<float>(double(raw[i]) - max_raw - std::log(sum)); };
    out.logprob = logprob(out.token);
    const std::vector<int32_t> order = order_by_value(raw);
    out.num_top = std::min(p.num_logprobs, vocab);
    for (int32_t j = 0; j < out.num_top; ++j) {
      out.top_ids[j] = order[j];
      out.top_logprobs[j] = logprob(order[j]);
    }
  }
  return out;
}

// How a validation case breaks the call's shapes (kThrows: every backend rejects them).
enum class BadSampleShape : uint8_t { kNone, kRowWidth, kOutRows, kCountsLength, kIntLogits, kAllowedWidth };

inline void add_sample(CaseRegistry& r, const std::string& tag, const SampleBatch& b, Expect expect = Expect::kMatch,
                BadSampleShape bad = BadSampleShape::kNone) {
  const int64_t n = b.num_rows();
  r.add({.op = OpKind::kSample,
         .name = str_cat("sample_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           if (bad == BadSampleShape::kNone) return run_sample_batch(run, b);
           const int64_t out_rows = bad == BadSampleShape::kOutRows ? n + 1 : n;
           std::vector<int32_t> words = b.row_words(), counts = b.penalty_counts, int_logits(b.logits.size());
           Shape row_shape{n, kSamplingRowWords};
           if (bad == BadSampleShape::kRowWidth) {
             words.resize(static_cast<size_t>(n * (kSamplingRowWords - 1)));
             row_shape = Shape{n, kSamplingRowWords - 1};
           }
           if (bad == BadSampleShape::kCountsLength) counts.push_back(0);
           const auto list = [](const std::vector<int32_t>& v) {
             return HostTensor::i32({static_cast<int64_t>(v.size())}, v);
           };
           // kAllowedWidth: the bitmaps read as rows one word wider than the vocabulary needs.
           std::vector<int32_t> allowed = b.allowed_tokens;
           Shape allowed_shape{b.num_allowed_rows(), b.allowed_words()};
           if (bad == BadSampleShape::kAllowedWidth) {
             allowed.resize(static_cast<size_t>(b.num_allowed_rows() * (b.allowed_words() + 1)), 0);
             allowed_shape = Shape{b.num_allowed_rows(), b.allowed_words() + 1};
           }
           run.backend().sample({.logits = run.upload(bad == BadSampleShape::kIntLogits
                                                          ? HostTensor::i32({n, b.vocab}, int_logits)
                                                          : HostTensor::f32({n, b.vocab}, b.logits)),
                                 .rows = run.upload(HostTensor::i32(row_shape, words)),
                                 .penalty_tokens = run.upload(list(b.penalty_tokens)),
                                 .penalty_counts = run.upload(list(counts)),
                                 .masked_tokens = run.upload(list(b.masked_tokens)),
                                 .allowed_tokens = allowed.empty()
                                                       ? ConstTensorView{}
                                                       : ConstTensorView(run.upload(
                                                             HostTensor::i32(allowed_shape, allowed))),
                                 .out = run.output({out_rows, kSampledTokenWords}, DType::kI32)});
           return {};
         },
         .naive = [=]() -> Outputs {
           std::vector<SampledToken> out;
           for (int64_t i = 0; i < n; ++i) {
             out.push_back(naive_sample_row({b.logits.data() + i * b.vocab, static_cast<size_t>(b.vocab)},
                                            b.rows[static_cast<size_t>(i)], b));
           }
           return sampled_token_outputs(HostTensor::from_raw({n, kSampledTokenWords}, DType::kI32, out.data()));
         },
         .tolerance = 1e-5,
         .expect = expect});
}

// Every row of `base` once per seed in `seeds` (and a step that changes with it).
inline std::vector<SamplingRow> with_seeds(std::vector<SamplingRow> base, int seeds) {
  std::vector<SamplingRow> rows;
  for (int s = 0; s < seeds; ++s) {
    for (SamplingRow p : base) {
      p.seed = 1000 + static_cast<uint64_t>(s) * 7919;
      p.step = s * 3;
      rows.push_back(p);
    }
  }
  return rows;
}

// Every token of [0, vocab).
inline std::vector<int32_t> all_tokens(int64_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(vocab));
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

// Grammar masks (SamplingRow::allowed_row): a disallowed token is a masked token for the draw and the thresholds,
// and the logprobs stay those of the raw distribution.
inline void add_grammar_sample_cases(CaseRegistry& r) {
  // Densities from one token to every token, a mask that allows nothing and rows without one, each with every kind
  // of parameters; 37 tokens leave 27 bits of the second word past the vocabulary (set, and never drawn).
  {
    Rng rng(240);
    SampleBatch b{.vocab = 37};
    const std::vector<int32_t> masks = {b.add_allowed({17}), b.add_allowed(random_tokens(rng, 37, 3)),
                                        b.add_allowed(random_tokens(rng, 37, 18)), b.add_allowed({}),
                                        b.add_allowed(all_tokens(37)), -1};
    const std::vector<SamplingRow> params = {{.temperature = 0.0f},
                                             {.temperature = 0.0f, .num_logprobs = 5},
                                             {.temperature = 1.0f},
                                             {.temperature = 0.7f, .top_k = 2},
                                             {.temperature = 1.0f, .top_k = 100, .num_logprobs = 20},
                                             {.temperature = 1.0f, .top_p = 0.6f},
                                             {.temperature = 1.0f, .log_min_p = std::log(0.3f)},
                                             {.temperature = 0.8f, .top_k = 4, .top_p = 0.8f,
                                              .log_min_p = std::log(0.05f), .num_logprobs = 3}};
    for (const SamplingRow& base : with_seeds(params, 2)) {
      for (const int32_t mask : masks) {
        SamplingRow p = base;
        p.allowed_row = mask;
        b.add(random_logits(rng, 37, 4.0f), p);
      }
    }
    add_sample(r, "grammar_v37", b);
  }
  // With penalties and masked lists: penalized tokens inside and outside the grammar's set, masked tokens inside it;
  // a row whose logit maximum is disallowed and whose best allowed token is penalized below the next; a row whose
  // allowed tokens are all on its masked list (every token masked: token 0).
  {
    Rng rng(241);
    SampleBatch b{.vocab = 41};
    const std::vector<std::pair<int32_t, int32_t>> penalties = {{0, 0}, {3, 1}, {7, 2}, {8, 0}, {12, 5}, {40, 1},
                                                                {20, 0}, {21, 3}, {30, 1}};
    const std::vector<int32_t> grammar = {0, 3, 7, 13, 20, 25, 30, 33, 40};
    const int32_t mask = b.add_allowed(grammar);
    for (int i = 0; i < 4; ++i) {
      const float temperature = i % 2 == 0 ? 0.0f : 0.9f;
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .seed = uint64_t(i), .step = i,
                                           .repetition_penalty = 1.7f, .allowed_row = mask}, penalties, {25});
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .seed = uint64_t(i), .step = i,
                                           .presence_penalty = 1.5f, .frequency_penalty = 0.4f, .num_logprobs = 4,
                                           .allowed_row = mask}, penalties, {3, 33});
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .top_k = 3, .top_p = 0.9f,
                                           .seed = uint64_t(i), .step = i, .repetition_penalty = 0.8f,
                                           .presence_penalty = -0.5f, .frequency_penalty = 0.25f,
                                           .allowed_row = mask}, penalties);
    }
    std::vector<float> l(41, 0.0f);
    l[12] = 6.0f;  // disallowed
    l[13] = 5.0f;
    l[20] = 4.0f;  // penalized to 4 / 1.5 - 0.2
    l[7] = 3.0f;
    b.add(l, {.temperature = 0.0f, .repetition_penalty = 1.5f, .frequency_penalty = 0.2f, .num_logprobs = 3,
              .allowed_row = mask}, {{12, 1}, {13, 2}, {20, 0}}, {13});
    b.add(random_logits(rng, 41, 3.0f), {.temperature = 0.0f, .num_logprobs = 2, .allowed_row = mask}, {}, grammar);
    b.add(random_logits(rng, 41, 3.0f), {.temperature = 1.0f, .top_p = 0.5f, .seed = 7, .allowed_row = mask},
          penalties, grammar);
    add_sample(r, "grammar_penalties_masks_v41", b);
  }
  // A vocabulary of whole words (no bits past it) and logits on a grid of 0.5: the top-k and top-p boundaries fall
  // inside runs of equal values among the allowed tokens.
  {
    Rng rng(242);
    SampleBatch b{.vocab = 64};
    const std::vector<int32_t> masks = {b.add_allowed(random_tokens(rng, 64, 32)),
                                        b.add_allowed(random_tokens(rng, 64, 7))};
    for (const SamplingRow& base : with_seeds({{.temperature = 1.0f, .top_k = 5},
                                               {.temperature = 1.0f, .top_p = 0.5f},
                                               {.temperature = 0.5f, .top_k = 6, .top_p = 0.7f},
                                               {.temperature = 0.0f, .num_logprobs = 9}}, 3)) {
      for (const int32_t mask : masks) {
        SamplingRow p = base;
        p.allowed_row = mask;
        b.add(random_logits(rng, 64, 3.0f, 0.5f), p);
      }
    }
    add_sample(r, "grammar_ties_v64", b);
  }
  // A thousand tokens: rows with and without masks in one batch, sparse and dense masks, two rows sharing one.
  {
    Rng rng(243);
    SampleBatch b{.vocab = 1029};
    const std::vector<int32_t> masks = {b.add_allowed(random_tokens(rng, 1029, 1)),
                                        b.add_allowed(random_tokens(rng, 1029, 3)),
                                        b.add_allowed(random_tokens(rng, 1029, 100)),
                                        b.add_allowed(random_tokens(rng, 1029, 514)),
                                        b.add_allowed(random_tokens(rng, 1029, 1020)),
                                        -1};
    const std::vector<SamplingRow> params = {{.temperature = 0.0f, .num_logprobs = 7},
                                             {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f},
                                             {.temperature = 0.6f, .top_p = 0.95f},
                                             {.temperature = 1.0f, .log_min_p = std::log(0.05f), .num_logprobs = 20},
                                             {.temperature = 1.2f}};
    for (const SamplingRow& base : with_seeds(params, 2)) {
      for (const int32_t mask : masks) {
        SamplingRow p = base;
        p.allowed_row = mask;
        b.add(random_logits(rng, 1029, 5.0f), p, {{5, 1}, {600, 0}}, {1028});
      }
    }
    add_sample(r, "grammar_mixed_v1029", b);
  }
  // One token: a mask that allows it and one that allows nothing (token 0 either way), with logprobs.
  {
    Rng rng(244);
    SampleBatch b{.vocab = 1};
    const int32_t it = b.add_allowed({0}), nothing = b.add_allowed({});
    for (const int32_t mask : {it, nothing}) {
      b.add(random_logits(rng, 1, 2.0f), {.temperature = 0.0f, .num_logprobs = 20, .allowed_row = mask});
      b.add(random_logits(rng, 1, 2.0f), {.temperature = 1.0f, .top_k = 1, .top_p = 0.5f, .seed = 3,
                                          .num_logprobs = 1, .allowed_row = mask});
    }
    add_sample(r, "grammar_v1", b);
  }
}

inline void add_sample_cases(CaseRegistry& r) {
  // greedy: the argmax, whatever the seed
  add_sample(r, "greedy_v37", random_sample_batch(37, with_seeds({SamplingRow{.temperature = 0.0f}}, 6), 200));
  // temperature alone, from sharp to flat
  add_sample(r, "temperature_v37", random_sample_batch(37, with_seeds({{.temperature = 0.3f}, {.temperature = 0.7f},
                                                                       {.temperature = 1.0f}, {.temperature = 1.5f},
                                                                       {.temperature = 4.0f}}, 3), 201));
  // top_k alone: 1, small, V - 1, V, beyond V
  add_sample(r, "top_k_v37", random_sample_batch(37, with_seeds({{.temperature = 1.0f, .top_k = 1},
                                                                 {.temperature = 1.0f, .top_k = 2},
                                                                 {.temperature = 1.0f, .top_k = 5},
                                                                 {.temperature = 1.0f, .top_k = 36},
                                                                 {.temperature = 1.0f, .top_k = 37},
                                                                 {.temperature = 1.0f, .top_k = 100}}, 3), 202));
  // top_p alone
  add_sample(r, "top_p_v37", random_sample_batch(37, with_seeds({{.temperature = 1.0f, .top_p = 0.05f},
                                                                 {.temperature = 1.0f, .top_p = 0.3f},
                                                                 {.temperature = 0.8f, .top_p = 0.6f},
                                                                 {.temperature = 1.0f, .top_p = 0.9f},
                                                                 {.temperature = 2.0f, .top_p = 0.999f}}, 3), 203));
  // min_p alone (min_p = 1 keeps the maximum only)
  add_sample(r, "min_p_v37", random_sample_batch(37, with_seeds({{.temperature = 1.0f, .log_min_p = std::log(0.01f)},
                                                                 {.temperature = 1.0f, .log_min_p = std::log(0.2f)},
                                                                 {.temperature = 0.5f, .log_min_p = std::log(0.6f)},
                                                                 {.temperature = 1.0f, .log_min_p = 0.0f}}, 3), 204));
  // all three together
  add_sample(r, "combined_v37", random_sample_batch(37, with_seeds({{.temperature = 0.7f, .top_k = 10, .top_p = 0.8f,
                                                                     .log_min_p = std::log(0.05f)},
                                                                    {.temperature = 1.3f, .top_k = 3, .top_p = 0.5f},
                                                                    {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f,
                                                                     .log_min_p = std::log(0.1f)}}, 3), 205));
  // penalties: prompt-only tokens (count 0) get the repetition penalty alone, output tokens all three; positive and
  // negative logits; greedy rows show the penalized argmax, sampled rows the penalized distribution
  {
    Rng rng(206);
    SampleBatch b{.vocab = 41};
    const std::vector<std::pair<int32_t, int32_t>> penalties = {{0, 0}, {3, 1}, {7, 2}, {8, 0}, {12, 5}, {40, 1},
                                                                {20, 0}, {21, 3}, {30, 1}};
    for (int i = 0; i < 4; ++i) {
      const float temperature = i % 2 == 0 ? 0.0f : 0.9f;
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .seed = uint64_t(i), .step = i,
                                           .repetition_penalty = 1.7f}, penalties);
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .seed = uint64_t(i), .step = i,
                                           .presence_penalty = 1.5f, .frequency_penalty = 0.4f}, penalties);
      b.add(random_logits(rng, 41, 3.0f), {.temperature = temperature, .top_k = 6, .seed = uint64_t(i), .step = i,
                                           .repetition_penalty = 0.8f, .presence_penalty = -0.5f,
                                           .frequency_penalty = 0.25f}, penalties);
    }
    // the largest logit of the row is penalized below the second
    std::vector<float> l(41, 0.0f);
    l[12] = 5.0f;
    l[13] = 4.0f;
    b.add(l, {.temperature = 0.0f, .repetition_penalty = 1.5f, .frequency_penalty = 0.2f}, {{12, 1}});
    add_sample(r, "penalties_v41", b);
  }
  // masks: stop tokens before min_tokens, the argmax among them; a row with every token but one masked; a row with
  // every token masked (the result is token 0, on every backend)
  {
    Rng rng(207);
    SampleBatch b{.vocab = 37};
    for (int i = 0; i < 3; ++i) {
      std::vector<float> l = random_logits(rng, 37, 3.0f);
      l[36] = 9.0f;  // an EOS that would win
      b.add(l, {.temperature = 0.0f}, {}, {36, 5});
      b.add(l, {.temperature = 1.0f, .top_p = 0.9f, .seed = 9, .step = i}, {}, {36, 5, 6});
    }
    std::vector<int32_t> all_but_17, all;
    for (int32_t t = 0; t < 37; ++t) {
      if (t != 17) all_but_17.push_back(t);
      all.push_back(t);
    }
    b.add(random_logits(rng, 37, 3.0f), {.temperature = 0.0f}, {}, all_but_17);
    b.add(random_logits(rng, 37, 3.0f), {.temperature = 1.0f, .seed = 3}, {}, all_but_17);
    b.add(random_logits(rng, 37, 3.0f), {.temperature = 0.8f, .top_k = 4, .top_p = 0.5f,
                                         .log_min_p = std::log(0.3f), .seed = 4}, {}, all_but_17);
    b.add(random_logits(rng, 37, 3.0f), {.temperature = 0.0f}, {}, all);
    b.add(random_logits(rng, 37, 3.0f), {.temperature = 1.0f, .top_k = 3, .seed = 5}, {}, all);
    add_sample(r, "masks_v37", b);
  }
  // logprobs: none, 5, 20 (and 20 of a 13-token vocabulary: clipped), on greedy and sampled rows
  for (const int32_t n : {0, 5, 20}) {
    add_sample(r, str_cat("logprobs_", n, "_v37"),
               random_sample_batch(37, with_seeds({{.temperature = 0.0f, .num_logprobs = n},
                                                   {.temperature = 0.9f, .top_k = 8, .num_logprobs = n}}, 2),
                                   208 + n, 6.0f));
  }
  add_sample(r, "logprobs_20_v13", random_sample_batch(13, with_seeds({{.temperature = 0.0f, .num_logprobs = 20},
                                                                       {.temperature = 1.0f, .num_logprobs = 20}}, 2),
                                                       230));
  // vocabulary sizes: one token, not a multiple of 4, a few thousand
  add_sample(r, "v1", random_sample_batch(1, {{.temperature = 0.0f, .num_logprobs = 20},
                                              {.temperature = 1.0f, .top_k = 1, .top_p = 0.5f, .num_logprobs = 3}},
                                          231));
  add_sample(r, "v5", random_sample_batch(5, with_seeds({{.temperature = 1.0f}, {.temperature = 0.5f, .top_p = 0.7f}},
                                                        4), 232));
  add_sample(r, "v1029", random_sample_batch(1029, with_seeds({{.temperature = 0.0f, .num_logprobs = 7},
                                                               {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f},
                                                               {.temperature = 0.6f, .top_p = 0.95f},
                                                               {.temperature = 1.0f, .log_min_p = std::log(0.05f),
                                                                .num_logprobs = 20}}, 2), 233));
  // ties: logits on a grid of 0.5, so the top_k, top_p and logprob boundaries fall inside runs of equal values
  add_sample(r, "ties_v64", random_sample_batch(64, with_seeds({{.temperature = 1.0f, .top_k = 7},
                                                                {.temperature = 1.0f, .top_p = 0.5f},
                                                                {.temperature = 0.5f, .top_k = 12, .top_p = 0.7f},
                                                                {.temperature = 0.0f, .num_logprobs = 9},
                                                                {.temperature = 1.0f, .top_k = 2,
                                                                 .num_logprobs = 20}}, 3),
                                                234, 3.0f, 0.5f));
  // mixed rows in one batch: greedy, sampled, penalized, masked, logprobs
  {
    Rng rng(235);
    SampleBatch b{.vocab = 301};
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 0.0f});
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 77, .step = 12,
                                          .num_logprobs = 5}, {{3, 0}, {200, 2}}, {300});
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 1.2f, .log_min_p = std::log(0.1f), .seed = 78},
          {}, {0, 1, 2});
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 0.0f, .repetition_penalty = 1.3f, .num_logprobs = 20},
          {{17, 1}, {18, 0}, {19, 4}});
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 1.0f, .top_p = 0.3f, .seed = ~0ull, .step = 1 << 30});
    b.add(random_logits(rng, 301, 5.0f), {.temperature = 0.7f, .top_k = 1, .seed = 5, .num_logprobs = 0});
    add_sample(r, "mixed_v301", b);
  }
  add_grammar_sample_cases(r);
  add_sample(r, "no_rows", SampleBatch{.vocab = 10});
  // validation: values of the rows and the token lists (host memory), and shapes (every backend)
  const auto one_row = [](SamplingRow p, std::vector<std::pair<int32_t, int32_t>> penalties = {},
                          std::vector<int32_t> masked = {}) {
    Rng rng(236);
    SampleBatch b{.vocab = 16};
    b.add(random_logits(rng, 16, 1.0f), {.temperature = 1.0f});
    b.add(random_logits(rng, 16, 1.0f), p, penalties, masked);
    return b;
  };
  add_sample(r, "rejects_top_p_0", one_row({.temperature = 1.0f, .top_p = 0.0f}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_top_p_1_5", one_row({.temperature = 1.0f, .top_p = 1.5f}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_negative_temperature", one_row({.temperature = -1.0f}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_negative_top_k", one_row({.temperature = 1.0f, .top_k = -2}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_21_logprobs", one_row({.temperature = 0.0f, .num_logprobs = 21}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_penalty_token_V", one_row({.temperature = 1.0f}, {{16, 1}}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_masked_token_minus_1", one_row({.temperature = 1.0f}, {}, {-1}), Expect::kThrowsOnHost);
  add_sample(r, "rejects_repeated_penalty_token", one_row({.temperature = 1.0f}, {{3, 1}, {3, 0}}),
             Expect::kThrowsOnHost);
  {
    SampleBatch b = one_row({.temperature = 1.0f}, {{3, 1}});
    b.rows[1].penalty_end = 2;  // past the end of the list
    add_sample(r, "rejects_penalty_range_past_the_list", b, Expect::kThrowsOnHost);
  }
  {
    SampleBatch b = one_row({.temperature = 1.0f});
    b.rows[1].allowed_row = b.add_allowed({2, 3}) + 1;  // past the one mask
    add_sample(r, "rejects_allowed_row_past_the_masks", b, Expect::kThrowsOnHost);
    b.rows[1] = {.temperature = 0.0f, .score_token = 3, .allowed_row = 0};
    add_sample(r, "rejects_scored_row_with_a_grammar_mask", b, Expect::kThrowsOnHost);
    b.rows[1] = {.temperature = 1.0f, .allowed_row = 0};
    add_sample(r, "rejects_allowed_width", b, Expect::kThrows, BadSampleShape::kAllowedWidth);
  }
  add_sample(r, "rejects_row_width_19", one_row({.temperature = 1.0f}), Expect::kThrows, BadSampleShape::kRowWidth);
  add_sample(r, "rejects_out_rows", one_row({.temperature = 1.0f}), Expect::kThrows, BadSampleShape::kOutRows);
  add_sample(r, "rejects_counts_length", one_row({.temperature = 1.0f}, {{3, 1}}), Expect::kThrows,
             BadSampleShape::kCountsLength);
  add_sample(r, "rejects_int_logits", one_row({.temperature = 1.0f}), Expect::kThrows, BadSampleShape::kIntLogits);
}

}  // namespace deepinfer::op_test
