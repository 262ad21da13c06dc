#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer {

void SchedulerConfig::validate() const {
  DI_CHECK_ARG(max_num_seqs > 0, "max_num_seqs must be > 0, got ", max_num_seqs);
  DI_CHECK_ARG(max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ", max_num_batched_tokens);
  DI_CHECK_ARG(max_model_len >= 2, "max_model_len must be >= 2 (one prompt token and one generated), got ",
               max_model_len);
  DI_CHECK_ARG(num_lookahead_tokens >= 0, "num_lookahead_tokens must be >= 0, got ", num_lookahead_tokens);
}

int32_t SchedulePlan::num_sampling_chunks() const {
  return static_cast<int32_t>(
      std::count_if(chunks.begin(), chunks.end(), [](const ScheduledChunk& c) { return c.samples; }));
}

Scheduler::Scheduler(SchedulerConfig config, CacheManager& cache) : config_(config), cache_(cache) {
  config_.validate();
}

int32_t chunk_limit(const Request& r) {
  const bool scoring = r.scores_prompt() && r.num_computed_tokens < r.num_prompt_tokens() - 1;
  return scoring ? kMaxScoredChunkTokens : std::numeric_limits<int32_t>::max();
}

void Scheduler::add(std::unique_ptr<Request> request) {
  DI_CHECK_ARG(request != nullptr, "cannot add a null request");
  Request& r = *request;
  DI_CHECK_ARG(!requests_.contains(r.id), "request ", r.id, ": duplicate request id");
  DI_CHECK_ARG(!r.prompt_token_ids.empty(), "request ", r.id, ": the prompt is empty");
  DI_CHECK_ARG(r.prompt_token_ids.size() < static_cast<size_t>(config_.max_model_len), "request ", r.id,
               ": the prompt has ", r.prompt_token_ids.size(), " tokens, which leaves no room for a generated ",
               "token within max_model_len ", config_.max_model_len);
  DI_CHECK_ARG(r.params.max_tokens > 0 || (r.params.max_tokens == 0 && r.scores_prompt()), "request ", r.id,
               ": max_tokens must be > 0 (0 only with prompt_logprobs), got ", r.params.max_tokens);
  DI_CHECK_ARG(r.output_token_ids.empty() && r.page_ids.empty() && r.num_computed_tokens == 0, "request ", r.id,
               ": not a fresh request (", r.output_token_ids.size(), " output tokens, ", r.page_ids.size(),
               " pages, ", r.num_computed_tokens, " computed tokens)");
  const int64_t max_len =
      std::min<int64_t>(static_cast<int64_t>(r.num_prompt_tokens()) + r.params.max_tokens, config_.max_model_len);
  const int32_t max_pages = cache_.pages_for_tokens(max_len);
  DI_CHECK_ARG(max_pages <= cache_.num_pages(), "request ", r.id, ": may grow to ", max_len, " tokens (prompt ",
               r.num_prompt_tokens(), " + max_tokens ", r.params.max_tokens, ", capped at max_model_len ",
               config_.max_model_len, "), which needs ", max_pages, " pages of ", cache_.page_size(),
               " tokens, but the whole cache has only ", cache_.num_pages(), " pages");

  r.status = RequestStatus::kWaiting;
  r.finish_reason = FinishReason::kNone;
  r.arrival_order = next_arrival_order_++;
  r.num_preemptions = 0;
  Request* raw = request.get();
  requests_.emplace(r.id, std::move(request));
  waiting_.push_back(raw);  // the latest arrival goes last
}

SchedulePlan Scheduler::schedule() {
  DI_CHECK(!in_flight_, "schedule() called while the plan of step ", step_, " was neither updated nor cancelled");
  SchedulePlan plan;
  plan.step = ++step_;
  int32_t budget = config_.max_num_batched_tokens;

  // 1. Running requests by arrival. Preemption removes only from the back, which is not yet scheduled.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    if (!schedule_running(running_[i], plan, budget)) break;  // it was the latest: nothing after it
  }

  schedule_drafts(plan, budget);

  // 2. Waiting requests by arrival, first-come-first-served, never after a preemption in this step.
  if (plan.preempted_ids.empty()) {
    while (!waiting_.empty() && budget > 0 && num_running() < config_.max_num_seqs) {
      Request* r = waiting_.front();
      take_cached_prefix(*r);
      const int32_t start = r->num_computed_tokens;
      const int32_t num_tokens = std::min({r->num_uncomputed_tokens(), budget, chunk_limit(*r)});
      if (!grow_pages(*r, start + num_tokens) && !(reclaim_lookahead(plan) && grow_pages(*r, start + num_tokens))) {
        drop_cached_prefix(*r);
        break;
      }
      waiting_.pop_front();
      r->status = RequestStatus::kRunning;
      insert_running(r);
      prefix_cache_queries_ += static_cast<uint64_t>(r->num_tokens());
      prefix_cache_hits_ += static_cast<uint64_t>(start);
      plan.chunks.push_back({.request = r, .start = start, .num_tokens = num_tokens,
                             .samples = start + num_tokens == r->num_tokens()});
      budget -= num_tokens;
    }
  }

  // 3. Room for the drafter after each sampling chunk, from pages nobody needs this step: never a preemption.
  if (config_.num_lookahead_tokens > 0) {
    for (const ScheduledChunk& chunk : plan.chunks) {
      if (!chunk.samples) continue;
      grow_pages(*chunk.request, std::min(chunk.start + chunk.num_tokens + config_.num_lookahead_tokens,
                                          config_.max_model_len));
    }
  }

  for (const ScheduledChunk& chunk : plan.chunks) plan.num_batched_tokens += chunk.num_tokens;
  in_flight_ = !plan.chunks.empty();
  return plan;
}

bool Scheduler::schedule_running(Request* request, SchedulePlan& plan, int32_t& budget) {
  const int32_t start = request->num_computed_tokens;
  int32_t num_tokens = std::min({request->num_uncomputed_tokens(), budget, chunk_limit(*request)});
  while (true) {
    // Tokens the pages it holds plus the free pages can take from start on.
    const int64_t capacity =
        (static_cast<int64_t>(request->page_ids.size()) + cache_.num_free_pages()) * cache_.page_size() - start;
    if (capacity >= 1) {
      num_tokens = static_cast<int32_t>(std::min<int64_t>(num_tokens, capacity));
      DI_CHECK(grow_pages(*request, start + num_tokens), "request ", request->id, ": could not grow to ",
               start + num_tokens, " tokens with ", cache_.num_free_pages(), " free pages");
      break;
    }
    if (reclaim_lookahead(plan)) continue;  // the drafter's room others keep comes back before anyone is preempted
    Request* victim = running_.back();
    preempt(victim, plan, budget);
    if (victim == request) return false;
  }
  plan.chunks.push_back({.request = request, .start = start, .num_tokens = num_tokens,
                         .samples = start + num_tokens == request->num_tokens()});
  budget -= num_tokens;
  return true;
}

void Scheduler::schedule_drafts(SchedulePlan& plan, int32_t& budget) {
  // After every running request has its real tokens: drafts take only budget and pages left over, so they can
  // never cost another request its step.
  for (ScheduledChunk& chunk : plan.chunks) {
    Request& r = *chunk.request;
    if (budget <= 0) break;
    if (!chunk.samples || chunk.num_tokens != 1 || r.draft_token_ids.empty()) continue;
    const int32_t end = chunk.start + 1;
    const int64_t room =
        (static_cast<int64_t>(r.page_ids.size()) + cache_.num_free_pages()) * cache_.page_size() - end;
    // Within max_model_len: every token a verification could add fits.
    const auto drafts = static_cast<int32_t>(std::max<int64_t>(
        0, std::min<int64_t>({static_cast<int64_t>(r.draft_token_ids.size()), budget, room,
                              config_.max_model_len - 1 - r.num_tokens()})));
    if (drafts == 0 || !grow_pages(r, end + drafts)) continue;
    chunk.num_tokens += drafts;
    chunk.num_draft_tokens = drafts;
    budget -= drafts;
  }
}

void Scheduler::preempt(Request* victim, SchedulePlan& plan, int32_t& budget) {
  // A chunk planned for the victim earlier in this step is taken back with its tokens.
  auto chunk = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                            [victim](const ScheduledChunk& c) { return c.request == victim; });
  if (chunk != plan.chunks.end()) {
    budget += chunk->num_tokens;
    plan.chunks.erase(chunk);
  }
  cache_.free(victim->page_ids);  // its registered pages stay cached: the recompute may find them
  victim->page_ids.clear();
  victim->draft_token_ids.clear();
  victim->page_keys.clear();
  victim->num_computed_tokens = 0;
  ++victim->num_preemptions;
  ++total_preemptions_;
  victim->status = RequestStatus::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  insert_waiting(victim);
  plan.preempted_ids.push_back(victim->id);
}

std::vector<RequestUpdate> Scheduler::update(const SchedulePlan& plan, std::span<const int32_t> sampled_tokens) {
  const std::vector<int32_t> one_each(sampled_tokens.size(), 1);
  return update(plan, sampled_tokens, one_each);
}

std::vector<RequestUpdate> Scheduler::update(const SchedulePlan& plan, std::span<const int32_t> tokens,
                                             std::span<const int32_t> counts) {
  std::vector<RequestUpdate> updates;
  if (plan.chunks.empty()) {
    DI_CHECK(tokens.empty() && counts.empty(), "an empty plan got ", tokens.size(), " sampled tokens");
    return updates;
  }
  check_plan(plan);
  DI_CHECK(static_cast<size_t>(plan.num_sampling_chunks()) == counts.size(), "the plan of step ", plan.step, " has ",
           plan.num_sampling_chunks(), " sampling chunks but got ", counts.size(), " token counts");
  // Each chunk's tokens: [first, first + count) of `tokens`. Every count is checked before any request changes: a bad
  // one leaves the plan as it was (cancel() still works). (A chunk's request may be gone: aborted in flight.)
  struct ChunkTokens {
    size_t first = 0;
    int32_t count = 0;
  };
  std::vector<ChunkTokens> spans(plan.chunks.size());
  size_t total = 0, sample = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    if (!chunk.samples) continue;
    const int32_t c = counts[sample++];
    DI_CHECK(c >= 1 && c <= 1 + chunk.num_draft_tokens, "the plan of step ", plan.step, ": sampling chunk ",
             sample - 1, " got ", c, " tokens from ", chunk.num_draft_tokens, " drafts");
    spans[i] = {.first = total, .count = c};
    total += static_cast<size_t>(c);
  }
  DI_CHECK(total == tokens.size(), "the plan of step ", plan.step, " got ", tokens.size(), " sampled tokens for counts "
           "summing to ", total);

  // Structured outputs: each constrained request's grammar takes its new tokens first (the drafts accepted and the
  // token after them), all requests at once (a consume is about ten microseconds; a batch of them one after another
  // would sit on the step's critical path). A token that ends the request (EOS, a stop id) never reaches the grammar;
  // before min_tokens the sampler masks those. Tokens after the one that completes the grammar are not consumed.
  struct GrammarStep {
    size_t chunk = 0;
    bool error_before = false;  // its mask failed: the request ends with that error
    int32_t consumed = 0;       // tokens the grammar took
    int32_t failed_at = -1;     // the token it rejected
    bool terminated = false;    // complete after its last consumed token
  };
  std::vector<GrammarStep> grammar_steps;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    if (spans[i].count == 0 || was_aborted_in_flight(chunk.request) || !chunk.request->grammar) continue;
    const Request& r = *chunk.request;
    const int32_t first = tokens[spans[i].first];
    if (r.params.max_tokens == 0 || r.is_eos(first) || r.is_stop_token(first)) continue;
    grammar_steps.push_back({.chunk = i});
  }
  const auto advance = [&](size_t k) {
    GrammarStep& g = grammar_steps[k];
    const Request& r = *plan.chunks[g.chunk].request;
    GrammarMatcher& grammar = *r.grammar;
    if (!grammar.error().empty()) {
      g.error_before = true;
      return;
    }
    for (int32_t i = 0; i < spans[g.chunk].count; ++i) {
      const int32_t token = tokens[spans[g.chunk].first + static_cast<size_t>(i)];
      if (r.is_eos(token) || r.is_stop_token(token)) return;
      if (!grammar.consume(token)) {
        g.failed_at = i;
        return;
      }
      g.consumed = i + 1;
      if (grammar.is_terminated()) {
        g.terminated = true;
        return;
      }
    }
  };
  if (parallel_for_ && grammar_steps.size() > 1) {
    parallel_for_(grammar_steps.size(), advance);
  } else {
    for (size_t k = 0; k < grammar_steps.size(); ++k) advance(k);
  }
  std::vector<const GrammarStep*> grammar_step_of(plan.chunks.size(), nullptr);
  for (const GrammarStep& g : grammar_steps) grammar_step_of[g.chunk] = &g;

  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ScheduledChunk& chunk = plan.chunks[c];
    const int32_t count = spans[c].count;
    const size_t first_token = spans[c].first;
    if (was_aborted_in_flight(chunk.request)) continue;
    Request& r = *chunk.request;
    r.draft_token_ids.clear();
    // The real tokens, and the drafts the verification accepted (all but the last token it returned).
    r.num_computed_tokens += chunk.num_tokens - chunk.num_draft_tokens + std::max(0, count - 1);
    if (!chunk.samples) {
      register_full_pages(r);
      continue;
    }

    RequestUpdate& u = updates.emplace_back();
    u.id = r.id;
    u.sampled_index = static_cast<int32_t>(first_token);
    u.logprobs = r.params.logprobs;
    // A request that only scores its prompt (max_tokens 0) ends at its prompt's end with nothing generated.
    FinishReason reason = r.params.max_tokens == 0 ? FinishReason::kLength : FinishReason::kNone;
    for (int32_t i = 0; i < count && reason == FinishReason::kNone; ++i) {
      const int32_t token = tokens[first_token + static_cast<size_t>(i)];
      r.output_token_ids.push_back(token);
      u.new_tokens.push_back(token);
      // EOS and stop ids count only from output index min_tokens on (the sampler masks them before).
      const bool may_stop = r.num_output_tokens() > r.params.min_tokens;
      const GrammarStep* g = grammar_step_of[c];
      if (r.grammar && !r.grammar->error().empty() && (g == nullptr || g->error_before)) {
        reason = FinishReason::kError;
        u.error = "structured outputs: " + r.grammar->error();
      } else if (may_stop && (r.is_eos(token) || r.is_stop_token(token))) {
        reason = FinishReason::kStop;
      } else if (g != nullptr && g->failed_at == i) {
        reason = FinishReason::kError;
        u.error = str_cat("structured outputs: the grammar rejected token ", token, ": ", r.grammar->error());
      } else if (g != nullptr && g->terminated && i + 1 == g->consumed) {
        reason = FinishReason::kStop;  // the grammar is complete: nothing but the end of sequence could follow
      } else if (r.num_output_tokens() >= r.params.max_tokens || r.num_tokens() >= config_.max_model_len) {
        reason = FinishReason::kLength;
      }
    }
    // Tokens after a stop were computed but are not the request's.
    r.num_computed_tokens = std::min(r.num_computed_tokens, r.num_tokens() - 1);
    register_full_pages(r);
    if (chunk.num_draft_tokens > 0 && reason == FinishReason::kNone) trim_pages(r);  // rejected drafts' pages
    u.finished = reason != FinishReason::kNone;
    u.reason = reason;
    u.num_output_tokens = r.num_output_tokens();
    u.num_preemptions = r.num_preemptions;
    u.num_cached_tokens = r.num_cached_tokens;
    if (u.finished) {
      r.finish_reason = reason;
      u.output_token_ids = std::move(r.output_token_ids);
      remove(&r);
    }
  }
  in_flight_ = false;
  aborted_in_flight_.clear();
  return updates;
}

void Scheduler::set_drafts(uint64_t id, std::vector<int32_t> drafts) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status != RequestStatus::kRunning) return;
  Request& r = *it->second;
  // A constrained request keeps the drafts its grammar allows from where it is: the verification fills each row's
  // mask after the drafts before it, and a draft the grammar rejects could not be accepted anyway.
  if (r.grammar) drafts.resize(static_cast<size_t>(r.grammar->num_valid(drafts)));
  r.draft_token_ids = std::move(drafts);
}

void Scheduler::cancel(const SchedulePlan& plan) {
  if (plan.chunks.empty()) return;
  check_plan(plan);
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!was_aborted_in_flight(chunk.request)) trim_pages(*chunk.request);
  }
  in_flight_ = false;
  aborted_in_flight_.clear();
}

bool Scheduler::abort(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  if (in_flight_) aborted_in_flight_.push_back(r);
  r->finish_reason = FinishReason::kAbort;
  remove(r);
  return true;
}

const Request* Scheduler::find(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

bool Scheduler::grow_pages(Request& request, int32_t num_tokens) {
  const int32_t missing = cache_.pages_for_tokens(num_tokens) - static_cast<int32_t>(request.page_ids.size());
  if (missing <= 0) return true;
  std::optional<std::vector<int32_t>> pages = cache_.allocate(missing);
  if (!pages) return false;
  request.page_ids.insert(request.page_ids.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::take_cached_prefix(Request& r) {
  if (!cache_.prefix_caching() || r.num_computed_tokens != 0 || r.scores_prompt()) return;
  const std::vector<int32_t> tokens = [&] {
    std::vector<int32_t> all;
    r.append_tokens(0, r.num_tokens(), all);
    return all;
  }();
  // The last token is always computed: its logits are what the step samples from.
  CacheManager::Match m = cache_.match(tokens, (r.num_tokens() - 1) / cache_.page_size(), r.prefix_root());
  r.num_computed_tokens = static_cast<int32_t>(m.page_ids.size()) * cache_.page_size();
  r.num_cached_tokens = std::min(r.num_computed_tokens, r.num_prompt_tokens());
  r.page_ids = std::move(m.page_ids);
  r.page_keys = std::move(m.keys);
}

void Scheduler::drop_cached_prefix(Request& r) {
  cache_.free(r.page_ids);
  r.page_ids.clear();
  r.page_keys.clear();
  r.num_computed_tokens = 0;
  r.num_cached_tokens = 0;
}

void Scheduler::register_full_pages(Request& r) {
  if (!cache_.prefix_caching()) return;
  const int32_t page_size = cache_.page_size();
  std::vector<int32_t> tokens;
  for (auto p = static_cast<int32_t>(r.page_keys.size()); (p + 1) * page_size <= r.num_computed_tokens; ++p) {
    tokens.clear();
    r.append_tokens(p * page_size, page_size, tokens);
    const uint64_t parent = p == 0 ? r.prefix_root() : r.page_keys.back();
    const uint64_t key = CacheManager::page_key(parent, tokens);
    cache_.register_page(r.page_ids[static_cast<size_t>(p)], key, parent, tokens);
    r.page_keys.push_back(key);
  }
}

int32_t Scheduler::kept_tokens(const Request& request) const {
  return std::min(request.num_computed_tokens + config_.num_lookahead_tokens, config_.max_model_len);
}

bool Scheduler::reclaim_lookahead(const SchedulePlan& plan) {
  std::unordered_map<const Request*, int32_t> planned;  // tokens a request's chunk of this plan reaches
  for (const ScheduledChunk& chunk : plan.chunks) planned[chunk.request] = chunk.start + chunk.num_tokens;
  bool freed = false;
  for (Request* r : running_) {
    const auto it = planned.find(r);
    const int32_t needed = it != planned.end() ? it->second : r->num_computed_tokens;
    const auto keep = static_cast<size_t>(cache_.pages_for_tokens(needed));
    if (r->page_ids.size() <= keep) continue;
    cache_.free(std::span<const int32_t>(r->page_ids).subspan(keep));
    r->page_ids.resize(keep);
    freed = true;
  }
  return freed;
}

void Scheduler::trim_pages(Request& request) {
  const size_t keep = static_cast<size_t>(cache_.pages_for_tokens(kept_tokens(request)));
  if (request.page_ids.size() <= keep) return;
  cache_.free(std::span<const int32_t>(request.page_ids).subspan(keep));
  request.page_ids.resize(keep);
}

void Scheduler::insert_running(Request* request) {
  auto pos = std::upper_bound(running_.begin(), running_.end(), request->arrival_order,
                              [](uint64_t order, const Request* r) { return order < r->arrival_order; });
  running_.insert(pos, request);
}

void Scheduler::insert_waiting(Request* request) {
  auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), request->arrival_order,
                              [](uint64_t order, const Request* r) { return order < r->arrival_order; });
  waiting_.insert(pos, request);
}

void Scheduler::remove(Request* request) {
  if (auto it = std::find(running_.begin(), running_.end(), request); it != running_.end()) {
    running_.erase(it);
  } else if (auto wit = std::find(waiting_.begin(), waiting_.end(), request); wit != waiting_.end()) {
    waiting_.erase(wit);
  } else {
    DI_CHECK(false, "request ", request->id, " is in no queue");
  }
  cache_.free(request->page_ids);
  request->page_ids.clear();
  request->status = RequestStatus::kFinished;
  requests_.erase(request->id);  // destroys it
}

void Scheduler::check_plan(const SchedulePlan& plan) const {
  DI_CHECK(in_flight_ && plan.step == step_, "the plan of step ", plan.step, " is not the one in flight (step ",
           step_, in_flight_ ? ", in flight)" : ", none in flight)");
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (was_aborted_in_flight(chunk.request)) continue;
    const Request& r = *chunk.request;
    DI_CHECK(r.status == RequestStatus::kRunning, "request ", r.id, " in the plan is ", to_string(r.status));
    DI_CHECK(chunk.start == r.num_computed_tokens && chunk.num_tokens > chunk.num_draft_tokens &&
                 chunk.num_draft_tokens <= static_cast<int32_t>(r.draft_token_ids.size()) &&
                 chunk.start + chunk.num_tokens - chunk.num_draft_tokens <= r.num_tokens(),
             "request ", r.id, ": chunk [", chunk.start, ", ", chunk.start + chunk.num_tokens,
             ") does not follow its ", r.num_computed_tokens, " computed of ", r.num_tokens(), " tokens");
  }
}

bool Scheduler::was_aborted_in_flight(const Request* request) const {
  return std::find(aborted_in_flight_.begin(), aborted_in_flight_.end(), request) != aborted_in_flight_.end();
}

void Scheduler::check_invariants() const {
  cache_.check_invariants();
  DI_CHECK(running_.size() <= static_cast<size_t>(config_.max_num_seqs), running_.size(),
           " running requests exceed max_num_seqs ", config_.max_num_seqs);
  DI_CHECK(running_.size() + waiting_.size() == requests_.size(), running_.size(), " running + ", waiting_.size(),
           " waiting != ", requests_.size(), " requests");

  std::vector<int32_t> holders(static_cast<size_t>(cache_.num_pages()), 0);
  auto check_request = [&](const Request* r, RequestStatus status) {
    auto it = requests_.find(r->id);
    DI_CHECK(it != requests_.end() && it->second.get() == r, "request ", r->id, " is queued but not owned");
    DI_CHECK(r->status == status, "request ", r->id, " is ", to_string(r->status), " in the ", to_string(status),
             " queue");
    DI_CHECK(r->num_tokens() < config_.max_model_len, "request ", r->id, " has ", r->num_tokens(),
             " tokens, not below max_model_len ", config_.max_model_len);
    DI_CHECK(r->num_output_tokens() < std::max(r->params.max_tokens, 1), "request ", r->id, " has ", r->num_output_tokens(),
             " output tokens, not below max_tokens ", r->params.max_tokens);
    DI_CHECK(r->num_computed_tokens >= 0 && r->num_computed_tokens < r->num_tokens(), "request ", r->id, " has ",
             r->num_computed_tokens, " computed of ", r->num_tokens(), " tokens");
    std::vector<int32_t> own(r->page_ids);
    std::sort(own.begin(), own.end());
    DI_CHECK(std::adjacent_find(own.begin(), own.end()) == own.end(), "request ", r->id, " holds a page twice");
    for (int32_t page_id : r->page_ids) {
      DI_CHECK(page_id >= 0 && page_id < cache_.num_pages(), "request ", r->id, " holds page ", page_id,
               " out of range [0, ", cache_.num_pages(), ")");
      // A page is held once per request that holds it: several share the pages of a cached prefix.
      ++holders[static_cast<size_t>(page_id)];
      DI_CHECK(cache_.prefix_caching() || holders[static_cast<size_t>(page_id)] == 1, "page ", page_id,
               " is held twice (request ", r->id, ")");
    }
  };

  for (size_t i = 0; i < running_.size(); ++i) {
    const Request* r = running_[i];
    check_request(r, RequestStatus::kRunning);
    DI_CHECK(i == 0 || running_[i - 1]->arrival_order < r->arrival_order, "running queue out of arrival order at ",
             i);
    const size_t needed = static_cast<size_t>(cache_.pages_for_tokens(r->num_computed_tokens));
    if (in_flight_) {
      const size_t most = static_cast<size_t>(cache_.pages_for_tokens(
          r->num_tokens() + static_cast<int64_t>(r->draft_token_ids.size()) + config_.num_lookahead_tokens));
      DI_CHECK(r->page_ids.size() >= needed && r->page_ids.size() <= most, "request ", r->id, " holds ",
               r->page_ids.size(), " pages, outside [", needed, ", ", most, "] for ", r->num_computed_tokens,
               " computed of ", r->num_tokens(), " tokens");
    } else {
      const size_t most = static_cast<size_t>(cache_.pages_for_tokens(kept_tokens(*r)));
      DI_CHECK(r->page_ids.size() >= needed && r->page_ids.size() <= most, "request ", r->id, " holds ",
               r->page_ids.size(), " pages but its ", r->num_computed_tokens, " computed tokens need ", needed,
               " (at most ", most, " with the drafter's lookahead)");
    }
  }
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Request* r = waiting_[i];
    check_request(r, RequestStatus::kWaiting);
    DI_CHECK(i == 0 || waiting_[i - 1]->arrival_order < r->arrival_order, "waiting queue out of arrival order at ",
             i);
    DI_CHECK(r->page_ids.empty() && r->num_computed_tokens == 0, "waiting request ", r->id, " holds ",
             r->page_ids.size(), " pages and ", r->num_computed_tokens, " computed tokens");
  }
  for (int32_t page_id = 0; page_id < cache_.num_pages(); ++page_id) {
    DI_CHECK(holders[static_cast<size_t>(page_id)] == cache_.ref_count(page_id), "page ", page_id, " is held by ",
             holders[static_cast<size_t>(page_id)], " request(s) but has reference count ",
             cache_.ref_count(page_id));
  }
}

std::vector<uint64_t> Scheduler::unfinished_ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, request] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace deepinfer
