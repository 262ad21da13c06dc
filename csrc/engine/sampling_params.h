// Per-request sampling and stopping parameters. Validated once, when the request is added.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/grammar/grammar_matcher.h"

namespace deepinfer {

struct SamplingParams {
  float temperature = 1.0f;          // 0 = greedy
  int32_t top_k = 0;                 // 0 = off
  float top_p = 1.0f;                // (0, 1]
  float min_p = 0.0f;                // [0, 1]
  std::optional<uint64_t> seed;      // same seed -> same tokens, whatever else is in the batch
  float repetition_penalty = 1.0f;   // > 0; multiplicative, over prompt and output tokens
  float presence_penalty = 0.0f;     // [-2, 2]; additive, over output tokens
  float frequency_penalty = 0.0f;    // [-2, 2]; additive per occurrence, over output tokens
  int32_t max_tokens = 16;           // > 0; 0 only with prompt_logprobs (score the prompt, generate nothing)
  int32_t min_tokens = 0;            // EOS and stop ids are masked until this many were generated
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = -1;             // -1 = none; N >= 0: the sampled token's logprob plus the top N
  int32_t prompt_logprobs = -1;      // -1 = none; N >= 0: each prompt token's logprob (after the first) plus the top N
  GrammarSpec grammar;               // structured outputs: the output follows this grammar (kind kNone = free)

  // Throws InvalidArgument naming the offending field and value.
  void validate(int32_t vocab_size) const;
};

}  // namespace deepinfer
