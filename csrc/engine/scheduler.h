// Continuous batching: which requests run in the next forward pass, and over which of their tokens.
//
// Each step the engine calls schedule(), runs the plan's chunks through the model, then calls update() with
// the sampled tokens. Policy, in order:
//   1. Running requests, oldest arrival first: a decode is 1 token; a request still in (chunked) prefill gets
//      up to the remaining token budget. When a request cannot get the pages for its chunk, the chunk first
//      shrinks to the pages that are free; if not even one token fits, the running request with the latest
//      arrival is preempted (possibly the one asking) and its pages freed, until it fits.
//   2. Waiting requests, oldest arrival first (so requests preempted earlier come first), while max_num_seqs,
//      the token budget and the free pages allow; a long prompt is chunked to the remaining budget.
//      Admission is strictly first-come-first-served: it stops at the first request that does not fit, and
//      it is skipped in a step that had to preempt. Admitting never preempts.
//   3. Speculative decoding (between 1 and 2): a decoding request with draft tokens computes them after its last
//      token (the step verifies them), from the budget and free pages the running requests left; drafts never
//      cause a preemption. A request that
//      samples also keeps num_lookahead_tokens more pages' worth of room when pages are free, for the drafter,
//      which writes the MTP layer's latents of its guesses there. That room is the first thing taken back when a
//      running request would otherwise be preempted or a waiting one refused: every running request keeps only
//      the pages of its computed tokens (and of its chunk in this plan), and the drafter then guesses less.
// A preempted request loses its cache and later recomputes its prompt and the output it already generated.
// Nothing here reads time or randomness: the same calls give the same plans.
#pragma once

#include <cstdint>
#include <functional>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/request.h"

namespace deepinfer {

// A request that scores its prompt (prompt_logprobs) computes at most this many tokens a step while it does: every one
// of them has a row of logits (2048 x DeepSeek-V3's 129,280 float32 values: 1 GiB).
inline constexpr int32_t kMaxScoredChunkTokens = 2048;
// The most tokens `request` may compute in one chunk.
int32_t chunk_limit(const Request& request);

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running requests at most
  int32_t max_num_batched_tokens = 8192;  // tokens in one forward pass at most
  int32_t max_model_len = 8192;           // prompt + output tokens of one request at most
  int32_t num_lookahead_tokens = 0;       // room kept after a sampling chunk for the drafter (k - 1 with k drafts)

  // Throws InvalidArgument naming the bad field.
  void validate() const;
};

// Tokens [start, start + num_tokens) of the request's prompt + output. Their pages are already in
// request->page_ids when schedule() returns.
struct ScheduledChunk {
  Request* request = nullptr;
  int32_t start = 0;       // the request's num_computed_tokens when scheduled
  int32_t num_tokens = 0;  // > 0, including the drafts
  bool samples = false;    // the chunk ends at request->num_tokens(): the model samples the next token
  // The chunk's last num_draft_tokens tokens are request->draft_token_ids, after its one real token: each of the
  // chunk's positions samples, and update() takes the tokens the verification accepted.
  int32_t num_draft_tokens = 0;
};

// What to run in one step. Request pointers stay valid until the next call that mutates the scheduler
// (add and abort leave the other requests' pointers valid).
struct SchedulePlan {
  std::vector<ScheduledChunk> chunks;  // running requests first (by arrival), then the newly admitted
  std::vector<uint64_t> preempted_ids;
  int32_t num_batched_tokens = 0;  // sum of chunks[i].num_tokens
  uint64_t step = 0;               // which schedule() call made this plan; update() checks it

  bool empty() const { return chunks.empty(); }
  int32_t num_sampling_chunks() const;
};

// The outcome of one sampling chunk, with what the caller reports of its request (a finished one is gone once
// update() returns).
struct RequestUpdate {
  uint64_t id = 0;
  std::vector<int32_t> new_tokens;        // in order; several when the step accepted drafts; none when scoring only
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  int32_t num_output_tokens = 0;          // including new_tokens
  int32_t num_preemptions = 0;            // of this request so far
  int32_t num_cached_tokens = 0;          // prompt tokens its admission found in the prefix cache
  std::vector<int32_t> output_token_ids;  // the whole output, filled only when finished
  int32_t sampled_index = -1;             // which of update()'s sampled tokens is new_tokens[0]
  int32_t logprobs = -1;                  // the request's params.logprobs (-1: it wants none)
  std::string error;                      // why the request ended, with reason kError (its grammar failed)
};

class Scheduler {
 public:
  // The cache manager must outlive the scheduler; the scheduler is its only user of pages.
  Scheduler(SchedulerConfig config, CacheManager& cache);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new request (status kWaiting). Throws InvalidArgument, naming the request id and the numbers,
  // for: a null request, a duplicate id, an empty prompt, a prompt that leaves no room for a generated token
  // within max_model_len, max_tokens <= 0, a request that is not fresh (output, pages or computed tokens),
  // or one that could never fit in the whole cache. A rejected request changes nothing.
  void add(std::unique_ptr<Request> request);

  // Plans the next step (see the policy above). Throws if the previous non-empty plan was neither updated
  // nor cancelled.
  SchedulePlan schedule();

  // Applies a plan the model has run. sampled_tokens holds one token per chunk with samples == true, in
  // chunk order. Returns one RequestUpdate per sampling chunk; finished requests free their pages and are
  // destroyed before this returns. Chunks of requests aborted since schedule() are skipped (their tokens too).
  std::vector<RequestUpdate> update(const SchedulePlan& plan, std::span<const int32_t> sampled_tokens);
  // The same with speculative decoding: sampling chunk i contributed counts[i] tokens of `tokens` (in order), from 1
  // to 1 + its num_draft_tokens: the drafts the verification accepted, then the token sampled after them. The
  // request advances over its real token and the accepted drafts; its drafts are consumed either way.
  std::vector<RequestUpdate> update(const SchedulePlan& plan, std::span<const int32_t> tokens,
                                    std::span<const int32_t> counts);

  // The drafter's guesses for running request `id` (ignored when it is gone): the tokens after its last one.
  void set_drafts(uint64_t id, std::vector<int32_t> drafts);

  // How update() runs independent pieces of work (body(i) for i in [0, n), in any order, maybe at once): the
  // grammars of a step's constrained requests advance through it. Sequential unless the engine gives a parallel one.
  using ParallelFor = std::function<void(size_t n, const std::function<void(size_t)>& body)>;
  void set_parallel_for(ParallelFor parallel_for) { parallel_for_ = std::move(parallel_for); }

  // Gives up a plan that will not be run (the forward pass failed): the requests keep their progress from
  // before schedule(), and the pages allocated for the plan are released.
  void cancel(const SchedulePlan& plan);

  // Removes a waiting or running request and frees its pages; false if the id is unknown. Allowed between
  // schedule() and update(): the request's chunk is then skipped by update().
  bool abort(uint64_t id);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_unfinished() const { return !requests_.empty(); }
  // Ids of every unfinished request (waiting or running), e.g. to abort them all at shutdown.
  std::vector<uint64_t> unfinished_ids() const;
  uint64_t total_preemptions() const { return total_preemptions_; }
  // Prefix caching, in tokens: looked up at admissions, and found cached.
  uint64_t prefix_cache_queries() const { return prefix_cache_queries_; }
  uint64_t prefix_cache_hits() const { return prefix_cache_hits_; }
  const SchedulerConfig& config() const { return config_; }
  const Request* find(uint64_t id) const;

  // Throws if the bookkeeping is inconsistent: every request in exactly one queue with the matching status,
  // queues in arrival order, pages held by requests == pages in use, no page in two requests, a running
  // request holds pages_for_tokens(num_computed_tokens) pages (more only while a plan is in flight), waiting
  // requests hold none, and counts within the configured limits.
  void check_invariants() const;

 private:
  // Schedules one running request; returns false when it was itself preempted.
  bool schedule_running(Request* request, SchedulePlan& plan, int32_t& budget);
  void preempt(Request* victim, SchedulePlan& plan, int32_t& budget);
  // Adds the drafts of the planned decodes that have them, from the budget and pages the running requests left.
  void schedule_drafts(SchedulePlan& plan, int32_t& budget);
  // Grows the page table to cover num_tokens tokens; false (no change) when the pages are not free.
  bool grow_pages(Request& request, int32_t num_tokens);
  // Shrinks the page table back to the pages its computed tokens and the drafter's lookahead may use.
  void trim_pages(Request& request);
  // Frees the pages running requests hold beyond their computed tokens and their chunk in `plan` (the drafter's
  // lookahead); true when it freed any.
  bool reclaim_lookahead(const SchedulePlan& plan);
  // The most tokens a running request keeps room for between steps: its computed ones and the lookahead.
  int32_t kept_tokens(const Request& request) const;
  // Admission with prefix caching: the request takes the cached pages of its longest cached prefix (whole pages, at
  // least its last token left to compute, none when it scores its prompt) and starts computing after them.
  void take_cached_prefix(Request& request);
  // Gives back what take_cached_prefix took (the request did not fit after all).
  void drop_cached_prefix(Request& request);
  // Registers the request's pages that became full and computed.
  void register_full_pages(Request& request);
  void insert_running(Request* request);
  void insert_waiting(Request* request);
  void remove(Request* request);  // from its queue, frees its pages, destroys it
  void check_plan(const SchedulePlan& plan) const;
  bool was_aborted_in_flight(const Request* request) const;

  SchedulerConfig config_;
  CacheManager& cache_;
  ParallelFor parallel_for_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;  // owns every unfinished request
  std::vector<Request*> running_;                                     // by arrival_order
  std::deque<Request*> waiting_;                                      // by arrival_order
  uint64_t next_arrival_order_ = 0;
  uint64_t prefix_cache_queries_ = 0;
  uint64_t prefix_cache_hits_ = 0;
  uint64_t total_preemptions_ = 0;
  uint64_t step_ = 0;       // schedule() calls so far
  bool in_flight_ = false;  // the plan of step_ awaits update() or cancel()
  // Requests aborted while a plan was in flight; compared by address only, never dereferenced.
  std::vector<const Request*> aborted_in_flight_;
};

}  // namespace deepinfer
