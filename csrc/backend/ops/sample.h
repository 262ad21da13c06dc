// Token sampling on the backend's device: one row of logits per sampling sequence becomes one token (and, when
// asked, logprobs). The step's only device-to-host copy is the SampledToken rows this op writes.
//
// Per row r, with l = logits[r] (float32, never modified) and p = rows[r]:
//   1. raw logprobs (when p.num_logprobs >= 0): log_softmax(l) of the model's own distribution, before anything below.
//   2. penalties on a copy of l: for each (token t, output count c) in the row's penalty range:
//        repetition (t in prompt or output): l[t] = l[t] > 0 ? l[t] / rep : l[t] * rep
//        presence and frequency (c > 0):     l[t] -= frequency * c + presence
//      then every token of the row's mask range is set to -inf (EOS and stop ids before min_tokens), and with
//      allowed_row >= 0 every token whose bit in allowed_tokens[allowed_row] is clear (a grammar's mask).
//   3. temperature 0: token = argmax (lowest index on ties).
//      otherwise, with s_i = l_i / temperature, keep the tokens that pass all of:
//        top_k  (> 0):  s_i >= the k-th largest s (ties at the boundary are all kept)
//        top_p  (< 1):  s_i >= the largest threshold L whose kept set {s_j >= L} holds at least top_p of the
//                       probability mass of the tokens top_k keeps (ties at the boundary are all kept)
//        min_p  (> 0):  s_i - max(s) >= log_min_p
//      and draw token = argmax over kept i of (s_i + g_i), g_i = -log(-log(u_i)) Gumbel noise, u_i = the counter
//      RNG (core/counter_rng.h) at (seed, step, i): exact sampling from softmax(s) renormalized over the kept set, and
//      the same draw on every backend and whatever else is in the batch.
//   4. out[r]: the token, its raw logprob, and the num_logprobs most likely tokens of the raw distribution (highest
//      first, lowest index on ties).
// A row with score_token >= 0 scores that token instead of drawing one (a prompt token's logprob): out[r].token is
// score_token, with its raw logprob and the top num_logprobs; such a row has temperature 0 and no penalties or masks.
#pragma once

#include <cstdint>
#include <limits>

#include "core/tensor.h"

namespace deepinfer {

inline constexpr int32_t kMaxTopLogprobs = 20;  // what the OpenAI API allows (top_logprobs <= 20)

// One row's parameters, laid out as the op reads them from device memory (SampleArgs::rows holds these bytes).
struct SamplingRow {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float log_min_p = -std::numeric_limits<float>::infinity();  // log(min_p), computed on the host; -inf = off
  uint64_t seed = 0;
  int32_t step = 0;          // tokens the request generated so far: the RNG's counter
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_begin = 0;  // [penalty_begin, penalty_end) of penalty_tokens / penalty_counts
  int32_t penalty_end = 0;
  int32_t mask_begin = 0;     // [mask_begin, mask_end) of masked_tokens
  int32_t mask_end = 0;
  int32_t num_logprobs = -1;  // -1 = none; 0..kMaxTopLogprobs
  int32_t score_token = -1;   // >= 0: report this token instead of sampling (in [0, V))
  int32_t allowed_row = -1;   // >= 0: the row of allowed_tokens that says which tokens may be drawn; -1 = all
  int32_t reserved[3] = {};   // keeps the row a whole number of 16-byte vectors
};
static_assert(sizeof(SamplingRow) == 80, "SamplingRow is read from device memory as 20 int32 words (5 int4)");
inline constexpr int64_t kSamplingRowWords = sizeof(SamplingRow) / sizeof(int32_t);
// The int32 words of one row of SampleArgs::allowed_tokens: a bit a token.
constexpr int64_t allowed_token_words(int64_t vocab) { return (vocab + 31) / 32; }

// One row's result, as the op writes it (SampleArgs::out holds these bytes).
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;      // of `token` under the raw distribution (when num_logprobs >= 0)
  int32_t num_top = 0;       // entries of top_ids / top_logprobs written
  int32_t reserved = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};
static_assert(sizeof(SampledToken) == 176, "SampledToken is copied from device memory as 44 int32 words");
inline constexpr int64_t kSampledTokenWords = sizeof(SampledToken) / sizeof(int32_t);

struct SampleArgs {
  ConstTensorView logits;          // [N, V] float32
  ConstTensorView rows;            // [N, kSamplingRowWords] int32: the SamplingRow of each row
  ConstTensorView penalty_tokens;  // [P] int32: per row, the distinct tokens of its prompt and output
  ConstTensorView penalty_counts;  // [P] int32: how often each occurs in the output (0: prompt only)
  ConstTensorView masked_tokens;   // [M] int32
  ConstTensorView allowed_tokens;  // [G, ceil(V / 32)] int32 bitmaps: bit t % 32 of word t / 32 set = t allowed
  TensorView out;                  // [N, kSampledTokenWords] int32: the SampledToken of each row
  // Shapes and dtypes, and every host-visible value when the rows are in host memory (the CPU backend).
  void validate() const;
};

}  // namespace deepinfer
