// Token sampling on the host from one row of logits: penalties, temperature, top-k, top-p, min-p, seeds, logprobs.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "engine/sampling_params.h"

namespace deepinfer {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // of the chosen token under the model's raw distribution
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, most likely first
};

// What the sampler needs to know about one request besides its logits.
struct SamplingContext {
  const SamplingParams& params;
  std::span<const int32_t> prompt_token_ids;
  std::span<const int32_t> output_token_ids;
  std::span<const int32_t> eos_token_ids;
  std::mt19937_64& rng;  // per request: a seeded request draws the same numbers whatever else is in the batch
};

// `logits` is modified in place (penalties, masks, temperature).
SampleResult sample_token(std::span<float> logits, const SamplingContext& ctx);

}  // namespace deepinfer
