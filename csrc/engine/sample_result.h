// What the engine reports per generated token when a request asked for logprobs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops/sample.h"

namespace deepinfer {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // of the chosen token under the model's raw distribution
  std::vector<TokenLogprob> top_logprobs;  // the request's `logprobs` entries, most likely first

  static SampleResult from(const SampledToken& s) {
    SampleResult r{.token = s.token, .logprob = s.logprob, .top_logprobs = {}};
    for (int32_t i = 0; i < s.num_top; ++i) r.top_logprobs.push_back({s.top_ids[i], s.top_logprobs[i]});
    return r;
  }
};

}  // namespace deepinfer
