#include "engine/sampling_inputs.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "backend/ops/sample.h"
#include "core/error.h"

namespace deepinfer {

void append_sampling_inputs(const Request& r, int32_t vocab_size, SamplingBatch& out,
                            std::span<const int32_t> pending) {
  const SamplingParams& p = r.params;
  const int32_t num_output = r.num_output_tokens() + static_cast<int32_t>(pending.size());
  SamplingRow row{.temperature = p.temperature,
                  .top_k = p.top_k <= 0 || p.top_k >= vocab_size ? 0 : p.top_k,  // -1 and 0 both mean off
                  .top_p = p.top_p,
                  .log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : -std::numeric_limits<float>::infinity(),
                  .seed = r.seed,
                  .step = num_output,
                  .repetition_penalty = p.repetition_penalty,
                  .presence_penalty = p.presence_penalty,
                  .frequency_penalty = p.frequency_penalty,
                  .num_logprobs = p.logprobs};

  // Penalties: the distinct tokens they touch, each with its count in the output (0: in the prompt only). The
  // repetition penalty covers the prompt too; presence and frequency only the output.
  const bool repetition = p.repetition_penalty != 1.0f;
  if (repetition || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    if (repetition) {
      for (int32_t t : r.prompt_token_ids) counts.try_emplace(t, 0);
    }
    for (int32_t t : r.output_token_ids) ++counts[t];
    for (int32_t t : pending) ++counts[t];
    row.penalty_begin = static_cast<int32_t>(out.penalty_tokens.size());
    for (const auto& [token, count] : counts) {
      out.penalty_tokens.push_back(token);
      out.penalty_counts.push_back(count);
    }
    row.penalty_end = static_cast<int32_t>(out.penalty_tokens.size());
  }

  // Before min_tokens, the tokens that would end the request cannot be drawn.
  row.mask_begin = row.mask_end = static_cast<int32_t>(out.masked_tokens.size());
  if (num_output < p.min_tokens) {
    if (!p.ignore_eos) {
      out.masked_tokens.insert(out.masked_tokens.end(), r.eos_token_ids.begin(), r.eos_token_ids.end());
    }
    out.masked_tokens.insert(out.masked_tokens.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    row.mask_end = static_cast<int32_t>(out.masked_tokens.size());
  }

  // Structured outputs: the grammar's mask, filled while the device runs the forward pass.
  if (r.grammar) {
    row.allowed_row = static_cast<int32_t>(out.grammars.size());
    out.grammars.push_back({.matcher = r.grammar.get(), .after = pending});
  }

  int32_t words[kSamplingRowWords];
  std::memcpy(words, &row, sizeof(row));
  out.rows.insert(out.rows.end(), words, words + kSamplingRowWords);
}

void append_scoring_inputs(const Request& r, int32_t first_position, int32_t count, SamplingBatch& out) {
  const auto penalties = static_cast<int32_t>(out.penalty_tokens.size());
  const auto masks = static_cast<int32_t>(out.masked_tokens.size());
  for (int32_t pos = first_position; pos < first_position + count; ++pos) {
    const SamplingRow row{.temperature = 0.0f, .penalty_begin = penalties, .penalty_end = penalties,
                          .mask_begin = masks, .mask_end = masks, .num_logprobs = r.params.prompt_logprobs,
                          .score_token = r.token_at(pos + 1)};
    int32_t words[kSamplingRowWords];
    std::memcpy(words, &row, sizeof(row));
    out.rows.insert(out.rows.end(), words, words + kSamplingRowWords);
  }
}

}  // namespace deepinfer
