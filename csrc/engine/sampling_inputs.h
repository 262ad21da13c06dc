// A request's row of the device sampling op (backend/ops/sample.h): its parameters, where its random stream is,
// the penalties that apply to its tokens and the tokens it may not produce yet.
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"
#include "engine/step_batch.h"

namespace deepinfer {

// Appends the row of `request` (about to sample its next token) to `out`. Its random stream is request.seed with the
// output length as the counter: its draws depend on nothing else in the batch, and a preempted request recomputed
// later draws the same numbers again.
// With `pending`, the row samples the token after them, as if they were the next outputs (a draft being verified):
// they count for the penalties, the min_tokens mask and the random stream's counter.
void append_sampling_inputs(const Request& request, int32_t vocab_size, SamplingBatch& out,
                            std::span<const int32_t> pending = {});
// The rows that score the prompt tokens after positions [first_position, first_position + count): each reports
// that token's logprob and the top params.prompt_logprobs of the model's distribution there.
void append_scoring_inputs(const Request& request, int32_t first_position, int32_t count, SamplingBatch& out);

}  // namespace deepinfer
