// Parameters of the sampling kernel (ops/sample.h): one CTA, or a cluster of CTAs, per row of logits.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct SampleParams {
  const float* logits = nullptr;          // [num_rows, vocab] fp32, rows vocab elements apart; never written
  const int32_t* rows = nullptr;          // [num_rows, kSamplingRowWords]: one SamplingRow per row
  const int32_t* penalty_tokens = nullptr;  // [num_penalties]
  const int32_t* penalty_counts = nullptr;  // [num_penalties]
  const int32_t* masked_tokens = nullptr;   // [num_masked]
  // [num_allowed_rows, allowed_words]: grammar masks, bit t % 32 of word t / 32 set = token t may be drawn
  const uint32_t* allowed_tokens = nullptr;
  int32_t* out = nullptr;                 // [num_rows, kSampledTokenWords]: one SampledToken per row
  int64_t num_rows = 0;
  int32_t vocab = 0;
  int32_t num_penalties = 0;
  int32_t num_masked = 0;
  int32_t num_allowed_rows = 0;
  int32_t allowed_words = 0;       // words of one allowed_tokens row: ceil(vocab / 32)
  int32_t candidate_capacity = 0;  // (key, index) entries of a CTA's candidate buffer (dynamic shared memory)
  int32_t tokens_per_thread = 0;   // at most this many tokens of its slice go to one thread of a CTA
};

}  // namespace deepinfer::cuda
