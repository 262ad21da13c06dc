// One generation request as the scheduler sees it: its tokens, its stopping rules, its page table.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/sampling_params.h"

namespace deepinfer {

enum class RequestStatus { kWaiting, kRunning, kFinished };

// kStop: an EOS id or one of params.stop_token_ids was generated.
// kLength: params.max_tokens were generated, or the sequence reached max_model_len.
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

const char* to_string(RequestStatus status);
const char* to_string(FinishReason reason);

// Tokens are numbered over prompt then output: index i < num_prompt_tokens() is a prompt token, the rest are
// generated. After a preemption the whole sequence (prompt and output so far) is computed again.
struct Request {
  uint64_t id = 0;
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  SamplingParams params;
  std::vector<int32_t> eos_token_ids;  // the model's EOS ids; ignored when params.ignore_eos
  uint64_t seed = 0;                   // the sampler's: params.seed, or one the engine drew at admission
  // Structured outputs: where the output is in params.grammar (null without one). Advanced by Scheduler::update over
  // each generated token; the step masks the tokens it does not allow.
  std::unique_ptr<GrammarMatcher> grammar;

  int32_t num_computed_tokens = 0;  // tokens [0, num_computed_tokens) have their latent in the cache
  // Speculative decoding: the drafter's guesses at the tokens after the last one, which the next step verifies.
  std::vector<int32_t> draft_token_ids;
  // Whether the drafter runs for this request: false for one admitted while the engine held more requests than
  // EngineOptions::speculative_disable_by_batch_size. Its positions never pass through the MTP layer, so its cached
  // pages lack that layer's latents and are keyed apart (prefix_root).
  bool speculates = true;
  std::vector<int32_t> page_ids;    // page table: token i lives in page_ids[i / page_size]
  // Prefix caching: the keys of the first page_keys.size() pages (full and computed; CacheManager::page_key), and
  // how many prompt tokens the last admission found cached.
  std::vector<uint64_t> page_keys;
  int32_t num_cached_tokens = 0;

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  uint64_t arrival_order = 0;  // set by Scheduler::add; smaller = earlier
  int32_t num_preemptions = 0;
  // Prompt positions whose next prompt token's logprob was delivered (params.prompt_logprobs): [0, this). A
  // preempted request recomputes its prompt but does not score it again.
  int32_t num_scored_positions = 0;

  int32_t num_prompt_tokens() const { return static_cast<int32_t>(prompt_token_ids.size()); }
  int32_t num_output_tokens() const { return static_cast<int32_t>(output_token_ids.size()); }
  int32_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  // Tokens not yet in the cache; the last one is always uncomputed between steps.
  int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }

  // Token i of prompt + output. Throws on an out-of-range index.
  int32_t token_at(int32_t i) const;
  // Appends tokens [start, start + count) of prompt + output to out (a chunk may straddle the two).
  void append_tokens(int32_t start, int32_t count, std::vector<int32_t>& out) const;

  // Whether the request scores its prompt, and the positions of [start, start + count) it still scores: those
  // before the last prompt token not scored yet.
  bool scores_prompt() const { return params.prompt_logprobs >= 0; }
  // The parent of its first cached page (CacheManager::match): apart for a request that does not speculate.
  uint64_t prefix_root() const { return speculates ? CacheManager::kNoParent : CacheManager::kWithoutMtpRoot; }
  std::pair<int32_t, int32_t> positions_to_score(int32_t start, int32_t count) const;

  // True when token is one of eos_token_ids and params.ignore_eos is off.
  bool is_eos(int32_t token) const;
  bool is_stop_token(int32_t token) const;
};

}  // namespace deepinfer
