#include "engine/sampling_params.h"

#include <cmath>

#include "core/error.h"

namespace deepinfer {

void SamplingParams::validate(int32_t vocab_size) const {
  DI_CHECK_ARG(std::isfinite(temperature) && temperature >= 0.0f,
               "temperature must be >= 0, got ", temperature);
  DI_CHECK_ARG(top_k >= 0 || top_k == -1, "top_k must be >= 0 (0 or -1 = off), got ", top_k);
  DI_CHECK_ARG(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got ", top_p);
  DI_CHECK_ARG(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
  DI_CHECK_ARG(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
               "repetition_penalty must be > 0, got ", repetition_penalty);
  DI_CHECK_ARG(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
               "presence_penalty must be in [-2, 2], got ", presence_penalty);
  DI_CHECK_ARG(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
               "frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  DI_CHECK_ARG(max_tokens > 0 || (max_tokens == 0 && prompt_logprobs >= 0),
               "max_tokens must be > 0 (0 only with prompt_logprobs, to score a prompt), got ", max_tokens);
  DI_CHECK_ARG(min_tokens >= 0 && min_tokens <= max_tokens, "min_tokens must be in [0, max_tokens=",
               max_tokens, "], got ", min_tokens);
  DI_CHECK_ARG(logprobs >= -1 && logprobs <= 20, "logprobs must be in [0, 20], got ", logprobs);
  DI_CHECK_ARG(prompt_logprobs >= -1 && prompt_logprobs <= 20, "prompt_logprobs must be in [0, 20], got ",
               prompt_logprobs);
  for (int32_t id : stop_token_ids) {
    DI_CHECK_ARG(id >= 0 && id < vocab_size, "stop_token_ids: token id ", id, " is outside the vocabulary [0, ",
                 vocab_size, ")");
  }
}

}  // namespace deepinfer
