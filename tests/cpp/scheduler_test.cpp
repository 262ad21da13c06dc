#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/cache_manager.h"
#include "engine/request.h"

namespace deepinfer {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kToken = 7;  // an ordinary sampled token

std::unique_ptr<Request> make_request(uint64_t id, int32_t prompt_len, int32_t max_tokens) {
  auto r = std::make_unique<Request>();
  r->id = id;
  for (int32_t i = 0; i < prompt_len; ++i) r->prompt_token_ids.push_back(100 + static_cast<int32_t>(id) * 1000 + i);
  r->params.max_tokens = max_tokens;
  r->eos_token_ids = {kEos};
  return r;
}

// Runs one step, sampling `token` for every sampling chunk; checks invariants on the way.
std::vector<RequestUpdate> step(Scheduler& s, const SchedulePlan& plan, int32_t token = kToken) {
  s.check_invariants();
  std::vector<int32_t> sampled(static_cast<size_t>(plan.num_sampling_chunks()), token);
  auto updates = s.update(plan, sampled);
  s.check_invariants();
  return updates;
}

// The single update of a step that had one sampling chunk (a default one, and a failure, otherwise).
RequestUpdate only_update(std::vector<RequestUpdate> updates) {
  if (updates.size() != 1) {
    ADD_FAILURE() << "expected one update, got " << updates.size();
    return {};
  }
  return std::move(updates[0]);
}

SchedulePlan schedule(Scheduler& s) {
  SchedulePlan plan = s.schedule();
  s.check_invariants();
  return plan;
}

std::vector<uint64_t> chunk_ids(const SchedulePlan& plan) {
  std::vector<uint64_t> ids;
  for (const ScheduledChunk& c : plan.chunks) ids.push_back(c.request->id);
  return ids;
}

// Steps until no request is left; returns the number of steps.
int run_to_completion(Scheduler& s, int max_steps = 10000) {
  int steps = 0;
  while (s.has_unfinished()) {
    EXPECT_LT(steps++, max_steps) << "no progress";
    if (steps > max_steps) break;
    step(s, schedule(s));
  }
  return steps;
}

std::string message_of_add(Scheduler& s, std::unique_ptr<Request> r) {
  try {
    s.add(std::move(r));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(SchedulerConfig, Validates) {
  CacheManager cache(8, 4);
  EXPECT_THROW(Scheduler({.max_num_seqs = 0}, cache), InvalidArgument);
  EXPECT_THROW(Scheduler({.max_num_batched_tokens = 0}, cache), InvalidArgument);
  EXPECT_THROW(Scheduler({.max_model_len = 1}, cache), InvalidArgument);
  EXPECT_NO_THROW(Scheduler({}, cache));
}

TEST(Scheduler, AdmissionRespectsMaxNumSeqs) {
  CacheManager cache(64, 4);
  Scheduler s({.max_num_seqs = 2, .max_num_batched_tokens = 100, .max_model_len = 64}, cache);
  s.add(make_request(10, 4, 2));
  s.add(make_request(11, 4, 5));
  s.add(make_request(12, 4, 5));
  s.check_invariants();
  EXPECT_EQ(s.num_waiting(), 3);

  SchedulePlan plan = schedule(s);
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{10, 11}));
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 1);
  for (const ScheduledChunk& c : plan.chunks) {
    EXPECT_EQ(c.start, 0);
    EXPECT_EQ(c.num_tokens, 4);
    EXPECT_TRUE(c.samples);
    EXPECT_EQ(c.request->page_ids.size(), 1u);
  }
  EXPECT_EQ(plan.num_batched_tokens, 8);
  EXPECT_EQ(step(s, plan).size(), 2u);

  plan = schedule(s);  // two decodes, 12 still waits
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{10, 11}));
  EXPECT_EQ(plan.chunks[0].start, 4);
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  auto updates = step(s, plan);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_TRUE(updates[0].finished);  // max_tokens 2
  EXPECT_EQ(updates[0].reason, FinishReason::kLength);
  EXPECT_FALSE(updates[1].finished);

  plan = schedule(s);  // 10 finished: 12 takes its seat
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(plan.chunks[1].start, 0);
  EXPECT_EQ(plan.chunks[1].num_tokens, 4);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 64);
}

TEST(Scheduler, TokenBudgetChunksTheLastAdmission) {
  CacheManager cache(64, 4);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 10, .max_model_len = 64}, cache);
  s.add(make_request(0, 4, 8));
  s.add(make_request(1, 4, 8));
  s.add(make_request(2, 4, 8));
  s.add(make_request(3, 4, 8));

  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(plan.chunks[2].num_tokens, 2);  // the budget left
  EXPECT_FALSE(plan.chunks[2].samples);
  EXPECT_EQ(plan.num_batched_tokens, 10);
  EXPECT_EQ(s.num_waiting(), 1);  // no budget left for 3
  auto updates = step(s, plan);
  ASSERT_EQ(updates.size(), 2u);  // only the sampling chunks report
  EXPECT_EQ(updates[0].id, 0u);
  EXPECT_EQ(updates[1].id, 1u);
  EXPECT_EQ(s.find(2)->num_computed_tokens, 2);
  EXPECT_TRUE(s.find(2)->output_token_ids.empty());

  plan = schedule(s);  // decodes, the rest of 2's prompt, then 3 with what is left
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(plan.chunks[1].num_tokens, 1);
  EXPECT_EQ(plan.chunks[2].start, 2);
  EXPECT_EQ(plan.chunks[2].num_tokens, 2);
  EXPECT_TRUE(plan.chunks[2].samples);
  EXPECT_EQ(plan.chunks[3].start, 0);
  EXPECT_EQ(plan.chunks[3].num_tokens, 4);
  EXPECT_EQ(plan.num_batched_tokens, 8);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 64);
}

TEST(Scheduler, ChunkedPrefillOfALongPrompt) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 8, .max_model_len = 64}, cache);
  s.add(make_request(5, 30, 3));
  const std::vector<int32_t> expected_starts{0, 8, 16, 24};
  for (size_t i = 0; i < expected_starts.size(); ++i) {
    SchedulePlan plan = schedule(s);
    ASSERT_EQ(plan.chunks.size(), 1u);
    const ScheduledChunk& c = plan.chunks[0];
    EXPECT_EQ(c.start, expected_starts[i]);
    EXPECT_EQ(c.num_tokens, i + 1 < expected_starts.size() ? 8 : 6);
    EXPECT_EQ(c.samples, i + 1 == expected_starts.size());
    EXPECT_EQ(static_cast<int32_t>(c.request->page_ids.size()), cache.pages_for_tokens(c.start + c.num_tokens));
    std::vector<int32_t> tokens;
    c.request->append_tokens(c.start, c.num_tokens, tokens);
    for (int32_t j = 0; j < c.num_tokens; ++j) EXPECT_EQ(tokens[static_cast<size_t>(j)], 100 + 5000 + c.start + j);
    auto updates = step(s, plan);
    EXPECT_EQ(updates.size(), c.samples ? 1u : 0u);
  }
  const Request* r = s.find(5);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->num_computed_tokens, 30);
  EXPECT_EQ(r->num_tokens(), 31);
  SchedulePlan plan = schedule(s);  // now a decode
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 30);
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(s.find(5)->token_at(30), kToken);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

TEST(Scheduler, RunningRequestsComeBeforeNewOnes) {
  CacheManager cache(64, 4);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 8, .max_model_len = 64}, cache);
  s.add(make_request(0, 3, 10));
  s.add(make_request(1, 20, 10));
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(plan.chunks[1].num_tokens, 5);
  step(s, plan);

  s.add(make_request(2, 4, 10));
  plan = schedule(s);  // 0 decodes, 1 continues its prefill with the rest of the budget, 2 waits
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(plan.chunks[1].start, 5);
  EXPECT_EQ(plan.chunks[1].num_tokens, 7);
  EXPECT_EQ(s.num_waiting(), 1);
  step(s, plan);

  plan = schedule(s);  // 1 finishes its prompt (8 left) and takes the whole budget after the decode
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(plan.chunks[1].num_tokens, 7);
  step(s, plan);
  plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(plan.chunks[1].num_tokens, 1);
  EXPECT_TRUE(plan.chunks[1].samples);
  EXPECT_EQ(plan.chunks[2].num_tokens, 4);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 64);
}

TEST(Scheduler, PreemptsTheLatestArrivalWhichLaterRecomputes) {
  CacheManager cache(4, 4);  // 16 tokens in all
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(0, 7, 9));  // 7 + 9 = 16 tokens: fits the whole cache alone
  s.add(make_request(1, 7, 9));
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(cache.num_free_pages(), 0);
  step(s, plan, 41);
  plan = schedule(s);  // token 7 still fits the second page of each
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(plan.preempted_ids.empty());
  step(s, plan, 42);

  plan = schedule(s);  // 0 needs a third page: 1 (the latest) is preempted
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0}));
  EXPECT_EQ(plan.preempted_ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(s.total_preemptions(), 1u);
  const Request* victim = s.find(1);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->status, RequestStatus::kWaiting);
  EXPECT_EQ(victim->num_computed_tokens, 0);
  EXPECT_TRUE(victim->page_ids.empty());
  EXPECT_EQ(victim->num_preemptions, 1);
  EXPECT_EQ(victim->output_token_ids, (std::vector<int32_t>{41, 42}));  // kept
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  step(s, plan);

  // 0 runs alone to its end; 1 waits (admission never preempts, and 0 keeps the pages).
  int steps = 0;
  while (s.find(0) != nullptr) {
    plan = schedule(s);
    ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0}));
    step(s, plan);
    ASSERT_LT(++steps, 20);
  }
  EXPECT_EQ(cache.num_free_pages(), 4);

  plan = schedule(s);  // 1 comes back: prompt and its two outputs in one chunk
  ASSERT_EQ(plan.chunks.size(), 1u);
  const ScheduledChunk& c = plan.chunks[0];
  EXPECT_EQ(c.request->id, 1u);
  EXPECT_EQ(c.start, 0);
  EXPECT_EQ(c.num_tokens, 9);
  EXPECT_TRUE(c.samples);
  std::vector<int32_t> tokens;
  c.request->append_tokens(0, 9, tokens);
  EXPECT_EQ(tokens[6], 1106);
  EXPECT_EQ(tokens[7], 41);
  EXPECT_EQ(tokens[8], 42);
  auto updates = step(s, plan, 43);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].num_output_tokens, 3);
  EXPECT_EQ(updates[0].num_preemptions, 1);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 4);
}

TEST(Scheduler, TheRequestAskingIsPreemptedWhenItIsTheLatest) {
  CacheManager cache(4, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(0, 6, 4));  // room for 2 more tokens in its second page
  s.add(make_request(1, 8, 4));  // its pages are full after the prompt
  step(s, schedule(s));
  SchedulePlan plan = schedule(s);
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0}));
  EXPECT_EQ(plan.preempted_ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(s.find(1)->status, RequestStatus::kWaiting);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 4);
}

TEST(Scheduler, RunningPrefillShrinksToTheFreePagesBeforePreempting) {
  CacheManager cache(6, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 12, .max_model_len = 64}, cache);
  s.add(make_request(0, 20, 4));  // 24 tokens at most = 6 pages
  s.add(make_request(1, 6, 2));
  SchedulePlan plan = schedule(s);  // 0: 12 tokens (3 pages); no budget for 1
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0}));
  step(s, plan);
  s.add(make_request(2, 1, 1));
  plan = schedule(s);  // 0: 8 more (2 pages), then 1 gets 4 tokens (1 page): the cache is full
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(plan.chunks[1].num_tokens, 4);
  EXPECT_EQ(cache.num_free_pages(), 0);
  step(s, plan);
  plan = schedule(s);  // 0 decodes: needs a page, none free, 2 is waiting, 1 is preempted
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{0}));
  EXPECT_EQ(plan.preempted_ids, (std::vector<uint64_t>{1}));
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 6);
}

TEST(Scheduler, FinishesOnEos) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 10));
  step(s, schedule(s), kToken);
  auto updates = step(s, schedule(s), kEos);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_TRUE(updates[0].finished);
  EXPECT_EQ(updates[0].reason, FinishReason::kStop);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{kEos}));
  EXPECT_EQ(updates[0].num_output_tokens, 2);
  EXPECT_EQ(updates[0].output_token_ids, (std::vector<int32_t>{kToken, kEos}));
  EXPECT_EQ(s.find(1), nullptr);
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(cache.num_free_pages(), 16);
}

TEST(Scheduler, FinishesOnStopTokenIds) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  auto r = make_request(1, 4, 10);
  r->params.stop_token_ids = {55, 66};
  s.add(std::move(r));
  step(s, schedule(s), 54);
  auto updates = step(s, schedule(s), 66);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_TRUE(updates[0].finished);
  EXPECT_EQ(updates[0].reason, FinishReason::kStop);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

TEST(Scheduler, FinishesOnMaxTokens) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 3));
  EXPECT_FALSE(only_update(step(s, schedule(s))).finished);
  EXPECT_FALSE(only_update(step(s, schedule(s))).finished);
  const RequestUpdate u = only_update(step(s, schedule(s)));
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kLength);
  EXPECT_EQ(u.num_output_tokens, 3);
  EXPECT_FALSE(s.has_unfinished());
}

TEST(Scheduler, EosOnTheLastAllowedTokenIsAStop) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 1));
  const RequestUpdate u = only_update(step(s, schedule(s), kEos));
  EXPECT_EQ(u.reason, FinishReason::kStop);
}

TEST(Scheduler, IgnoreEosKeepsGoing) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  auto r = make_request(1, 4, 3);
  r->params.ignore_eos = true;
  r->params.stop_token_ids = {kEos + 1};
  s.add(std::move(r));
  EXPECT_FALSE(only_update(step(s, schedule(s), kEos)).finished);
  EXPECT_FALSE(only_update(step(s, schedule(s), kEos)).finished);
  const RequestUpdate u = only_update(step(s, schedule(s), kEos));
  EXPECT_EQ(u.reason, FinishReason::kLength);

  auto r2 = make_request(2, 4, 3);  // stop ids still apply with ignore_eos
  r2->params.ignore_eos = true;
  r2->params.stop_token_ids = {kEos + 1};
  s.add(std::move(r2));
  EXPECT_EQ(only_update(step(s, schedule(s), kEos + 1)).reason, FinishReason::kStop);
}

TEST(Scheduler, MinTokensMasksEosAndStopIds) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  auto r = make_request(1, 4, 10);
  r->params.min_tokens = 2;
  r->params.stop_token_ids = {77};
  s.add(std::move(r));
  // Output indices 0 and 1 cannot stop; index 2 can.
  EXPECT_FALSE(only_update(step(s, schedule(s), kEos)).finished);
  EXPECT_FALSE(only_update(step(s, schedule(s), 77)).finished);
  const RequestUpdate u = only_update(step(s, schedule(s), 77));
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStop);
  EXPECT_EQ(u.output_token_ids, (std::vector<int32_t>{kEos, 77, 77}));
}

TEST(Scheduler, FinishesAtMaxModelLen) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 10}, cache);
  s.add(make_request(1, 8, 100));
  EXPECT_FALSE(only_update(step(s, schedule(s))).finished);  // 9 tokens
  const RequestUpdate u = only_update(step(s, schedule(s)));  // 10 tokens
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kLength);
  EXPECT_EQ(u.num_output_tokens, 2);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

TEST(Scheduler, AbortWaitingAndRunningFreesPages) {
  CacheManager cache(8, 4);
  Scheduler s({.max_num_seqs = 1, .max_model_len = 64}, cache);
  s.add(make_request(1, 6, 10));
  s.add(make_request(2, 6, 10));
  step(s, schedule(s));
  EXPECT_EQ(cache.num_free_pages(), 6);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);

  EXPECT_TRUE(s.abort(2));  // waiting
  s.check_invariants();
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_TRUE(s.abort(1));  // running
  s.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 8);
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_FALSE(s.abort(1));
  EXPECT_FALSE(s.abort(12345));
  EXPECT_TRUE(schedule(s).empty());
  EXPECT_TRUE(s.update(SchedulePlan{}, {}).empty());
}

TEST(Scheduler, AbortBetweenScheduleAndUpdateSkipsTheChunk) {
  CacheManager cache(8, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 10));
  s.add(make_request(2, 4, 10));
  s.add(make_request(3, 4, 10));
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.num_sampling_chunks(), 3);
  EXPECT_TRUE(s.abort(2));
  s.check_invariants();
  s.add(make_request(2, 4, 10));  // the id may come back at once, as a new request
  s.check_invariants();
  const std::vector<int32_t> sampled{11, 22, 33};
  auto updates = s.update(plan, sampled);
  s.check_invariants();
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0].id, 1u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{11}));
  EXPECT_EQ(updates[1].id, 3u);
  EXPECT_EQ(updates[1].new_tokens, (std::vector<int32_t>{33}));
  EXPECT_EQ(s.find(2)->num_computed_tokens, 0);
  EXPECT_EQ(s.find(2)->status, RequestStatus::kWaiting);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 8);
}

TEST(Scheduler, CancelRestoresTheStateBeforeSchedule) {
  CacheManager cache(8, 4);
  Scheduler s({.max_num_batched_tokens = 6, .max_model_len = 64}, cache);
  s.add(make_request(1, 3, 10));
  step(s, schedule(s));
  s.add(make_request(2, 10, 10));
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(cache.num_free_pages(), 5);
  EXPECT_THROW(s.schedule(), Error);  // the plan is still in flight
  s.cancel(plan);
  s.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 7);
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{1}), Error);  // no longer in flight

  SchedulePlan again = schedule(s);
  ASSERT_EQ(chunk_ids(again), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(again.chunks[0].start, 3);
  EXPECT_EQ(again.chunks[1].start, 0);
  EXPECT_EQ(again.chunks[1].num_tokens, 5);
  EXPECT_THROW(s.update(again, std::vector<int32_t>{1, 2}), Error);  // one sampling chunk, two tokens
  step(s, again);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 8);
}

TEST(Scheduler, RejectsBadRequestsAloneWithClearMessages) {
  CacheManager cache(4, 4);  // 16 tokens
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 20}, cache);
  s.add(make_request(1, 4, 4));
  step(s, schedule(s));

  std::string msg = message_of_add(s, make_request(7, 0, 4));
  EXPECT_NE(msg.find("request 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;

  msg = message_of_add(s, make_request(8, 20, 4));  // no room for a generated token
  EXPECT_NE(msg.find("request 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20"), std::string::npos) << msg;

  msg = message_of_add(s, make_request(9, 10, 7));  // 17 tokens = 5 pages > 4
  EXPECT_NE(msg.find("request 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 pages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 pages"), std::string::npos) << msg;

  msg = message_of_add(s, make_request(1, 4, 4));
  EXPECT_NE(msg.find("duplicate"), std::string::npos) << msg;
  msg = message_of_add(s, make_request(10, 4, 0));
  EXPECT_NE(msg.find("max_tokens"), std::string::npos) << msg;
  EXPECT_THROW(s.add(nullptr), InvalidArgument);

  // Capped by max_model_len it fits: 19 + 100 tokens -> 20 tokens = 5 pages > 4 still rejected; 15 + 100 -> 16.
  EXPECT_THROW(s.add(make_request(11, 19, 100)), InvalidArgument);
  EXPECT_NO_THROW(s.add(make_request(12, 10, 6)));  // exactly 16 tokens
  s.check_invariants();
  EXPECT_EQ(s.num_waiting() + s.num_running(), 2);
  EXPECT_EQ(s.find(1)->num_output_tokens(), 1);  // untouched
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 4);
}

// ---- Randomized soak: a shadow model checks every plan and update. ----

struct Shadow {
  std::vector<int32_t> tokens;  // prompt + output
  int32_t num_prompt = 0;
  int32_t computed = 0;
  SamplingParams params;
};

// With prefix caching, prompts often repeat a prefix of an earlier one, and the shadow keeps what each page's latents
// hold: an admission that starts after cached pages must find there exactly its own tokens.
class Soak {
 public:
  explicit Soak(uint32_t seed, bool prefix_caching = false) : rng_(seed), prefix_caching_(prefix_caching) {
    page_size_ = pick(1, 6);
    num_pages_ = pick(4, 24);
    config_ = {.max_num_seqs = pick(1, 6), .max_num_batched_tokens = pick(1, 24),
               .max_model_len = pick(2, page_size_ * num_pages_ + 8)};
    cache_ = std::make_unique<CacheManager>(num_pages_, page_size_, prefix_caching);
    sched_ = std::make_unique<Scheduler>(config_, *cache_);
  }

  void run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = pick(0, 99);
      if (kind < 25) {
        add();
      } else if (kind < 92) {
        step();
      } else {
        abort_one();
      }
      sched_->check_invariants();
      if (::testing::Test::HasFatalFailure()) return;
    }
    int drain_steps = 0;
    while (sched_->has_unfinished()) {
      ASSERT_LT(drain_steps++, 100000) << "no progress";
      step();
      sched_->check_invariants();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_TRUE(live_.empty());
    EXPECT_EQ(cache_->num_free_pages(), num_pages_) << "pages leaked";
    EXPECT_EQ(num_finished_ + num_aborted_, num_added_);
  }

  uint64_t preemptions() const { return sched_->total_preemptions(); }
  int num_finished() const { return num_finished_; }
  uint64_t cache_hits() const { return sched_->prefix_cache_hits(); }

 private:
  int32_t pick(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  void add() {
    const uint64_t id = next_id_++;
    const int32_t prompt_len = pick(0, config_.max_model_len + 2);
    const int32_t max_tokens = pick(1, 20);
    auto r = std::make_unique<Request>();
    r->id = id;
    if (prefix_caching_ && !prompts_.empty() && pick(0, 1) == 0) {  // a prefix of an earlier prompt
      const std::vector<int32_t>& earlier = prompts_[static_cast<size_t>(pick(0, static_cast<int32_t>(prompts_.size()) - 1))];
      const auto shared = std::min<size_t>(earlier.size(), static_cast<size_t>(prompt_len));
      r->prompt_token_ids.assign(earlier.begin(), earlier.begin() + static_cast<std::ptrdiff_t>(shared));
    }
    while (static_cast<int32_t>(r->prompt_token_ids.size()) < prompt_len) r->prompt_token_ids.push_back(pick(3, 30));
    prompts_.push_back(r->prompt_token_ids);
    r->params.max_tokens = max_tokens;
    r->params.min_tokens = pick(0, 3) == 0 ? pick(0, max_tokens) : 0;
    r->params.ignore_eos = pick(0, 5) == 0;
    if (pick(0, 2) == 0) r->params.stop_token_ids = {pick(3, 30)};
    r->eos_token_ids = {kEos, kEos + 1};
    const int64_t max_len = std::min<int64_t>(prompt_len + max_tokens, config_.max_model_len);
    const bool valid = prompt_len > 0 && prompt_len < config_.max_model_len &&
                       cache_->pages_for_tokens(max_len) <= num_pages_;
    Shadow shadow{.tokens = r->prompt_token_ids, .num_prompt = prompt_len, .computed = 0, .params = r->params};
    if (valid) {
      ASSERT_NO_THROW(sched_->add(std::move(r)));
      live_.emplace(id, std::move(shadow));
      ++num_added_;
    } else {
      ASSERT_THROW(sched_->add(std::move(r)), InvalidArgument);
    }
  }

  void abort_one() {
    if (live_.empty() || pick(0, 4) == 0) {
      EXPECT_FALSE(sched_->abort(next_id_ + 100));
      return;
    }
    auto it = live_.begin();
    std::advance(it, pick(0, static_cast<int32_t>(live_.size()) - 1));
    EXPECT_TRUE(sched_->abort(it->first));
    live_.erase(it);
    ++num_aborted_;
  }

  void step() {
    std::map<uint64_t, uint64_t> arrival;  // of the running requests before scheduling
    SchedulePlan plan = sched_->schedule();
    sched_->check_invariants();

    uint64_t first_victim = UINT64_MAX;
    for (uint64_t id : plan.preempted_ids) {
      auto it = live_.find(id);
      ASSERT_NE(it, live_.end());
      it->second.computed = 0;
      const Request* r = sched_->find(id);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->status, RequestStatus::kWaiting);
      first_victim = std::min(first_victim, r->arrival_order);
    }
    if (!plan.preempted_ids.empty()) {
      // Victims are the latest arrivals: every request still running arrived before all of them.
      for (const auto& [id, shadow] : live_) {
        const Request* r = sched_->find(id);
        if (r->status == RequestStatus::kRunning) {
          EXPECT_LT(r->arrival_order, first_victim) << "request " << id;
        }
      }
    }

    int32_t total = 0;
    std::vector<uint64_t> seen;
    for (const ScheduledChunk& c : plan.chunks) {
      const uint64_t id = c.request->id;
      ASSERT_EQ(std::count(seen.begin(), seen.end(), id), 0) << "two chunks for request " << id;
      seen.push_back(id);
      ASSERT_EQ(std::count(plan.preempted_ids.begin(), plan.preempted_ids.end(), id), 0);
      Shadow& sh = live_.at(id);
      if (sh.computed == 0 && c.start > 0) {  // admitted after cached pages: they hold exactly its tokens
        ASSERT_TRUE(prefix_caching_) << "request " << id << " starts at " << c.start << " without prefix caching";
        ASSERT_EQ(c.start % page_size_, 0);
        ASSERT_LT(c.start, static_cast<int32_t>(sh.tokens.size()));
        for (int32_t pos = 0; pos < c.start; ++pos) {
          const int32_t page = c.request->page_ids[static_cast<size_t>(pos / page_size_)];
          ASSERT_EQ(page_content_.at(page)[static_cast<size_t>(pos % page_size_)], sh.tokens[static_cast<size_t>(pos)])
              << "request " << id << " position " << pos << " in page " << page;
        }
        sh.computed = c.start;
      }
      ASSERT_EQ(c.start, sh.computed) << "request " << id;
      ASSERT_GT(c.num_tokens, 0);
      ASSERT_LE(c.start + c.num_tokens, static_cast<int32_t>(sh.tokens.size()));
      ASSERT_EQ(c.samples, c.start + c.num_tokens == static_cast<int32_t>(sh.tokens.size()));
      ASSERT_GE(static_cast<int32_t>(c.request->page_ids.size()), cache_->pages_for_tokens(c.start + c.num_tokens));
      std::vector<int32_t> tokens;
      c.request->append_tokens(c.start, c.num_tokens, tokens);
      ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), sh.tokens.begin() + c.start)) << "request " << id;
      total += c.num_tokens;
    }
    ASSERT_EQ(total, plan.num_batched_tokens);
    ASSERT_LE(total, config_.max_num_batched_tokens);
    if (plan.empty()) {
      // Nothing could run: only possible with nothing to run at all.
      EXPECT_FALSE(sched_->has_unfinished());
      return;
    }

    // Sometimes the forward pass fails.
    if (pick(0, 49) == 0) {
      sched_->cancel(plan);
      return;
    }
    // Sometimes a request is aborted while its chunk is in flight.
    std::vector<uint64_t> aborted;
    if (pick(0, 19) == 0) {
      const uint64_t id = plan.chunks[static_cast<size_t>(pick(0, static_cast<int32_t>(plan.chunks.size()) - 1))]
                              .request->id;
      EXPECT_TRUE(sched_->abort(id));
      sched_->check_invariants();
      live_.erase(id);
      aborted.push_back(id);
      ++num_aborted_;
    }

    std::vector<int32_t> sampled;
    std::vector<std::vector<int32_t>> pages_of;  // each chunk's page table, read before any pointer can die
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.samples) sampled.push_back(pick(0, 9) == 0 ? kEos : pick(kEos, 30));
      const bool gone = std::count(aborted.begin(), aborted.end(), seen[static_cast<size_t>(&c - plan.chunks.data())]);
      pages_of.push_back(gone ? std::vector<int32_t>{} : c.request->page_ids);
    }
    std::vector<RequestUpdate> expected;
    size_t next = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      const int32_t token = c.samples ? sampled[next++] : -1;
      // A chunk of an aborted request must not be touched through its (dead) pointer: find its id by position.
      const size_t index = static_cast<size_t>(&c - plan.chunks.data());
      const uint64_t id = seen[index];
      if (std::count(aborted.begin(), aborted.end(), id) != 0) continue;
      Shadow& sh = live_.at(id);
      for (int32_t pos = c.start; pos < c.start + c.num_tokens; ++pos) {  // the latents this chunk writes
        std::vector<int32_t>& content = page_content_[pages_of[index][static_cast<size_t>(pos / page_size_)]];
        content.resize(static_cast<size_t>(page_size_), -1);
        content[static_cast<size_t>(pos % page_size_)] = sh.tokens[static_cast<size_t>(pos)];
      }
      sh.computed += c.num_tokens;
      if (!c.samples) continue;
      sh.tokens.push_back(token);
      const int32_t num_output = static_cast<int32_t>(sh.tokens.size()) - sh.num_prompt;
      const bool may_stop = num_output > sh.params.min_tokens;
      const bool is_eos = !sh.params.ignore_eos && (token == kEos || token == kEos + 1);
      const bool is_stop = std::count(sh.params.stop_token_ids.begin(), sh.params.stop_token_ids.end(), token) != 0;
      FinishReason reason = FinishReason::kNone;
      if (may_stop && (is_eos || is_stop)) {
        reason = FinishReason::kStop;
      } else if (num_output >= sh.params.max_tokens || static_cast<int32_t>(sh.tokens.size()) >= config_.max_model_len) {
        reason = FinishReason::kLength;
      }
      expected.push_back({.id = id, .new_tokens = {token}, .finished = reason != FinishReason::kNone,
                          .reason = reason, .num_output_tokens = num_output, .num_preemptions = 0,
                          .output_token_ids = {}});
      if (reason != FinishReason::kNone) {
        expected.back().output_token_ids.assign(sh.tokens.begin() + sh.num_prompt, sh.tokens.end());
      }
    }

    std::vector<RequestUpdate> updates = sched_->update(plan, sampled);
    sched_->check_invariants();
    ASSERT_EQ(updates.size(), expected.size());
    for (size_t i = 0; i < updates.size(); ++i) {
      const RequestUpdate& u = updates[i];
      const RequestUpdate& e = expected[i];
      ASSERT_EQ(u.id, e.id);
      EXPECT_EQ(u.new_tokens, e.new_tokens);
      ASSERT_EQ(u.finished, e.finished) << "request " << u.id;
      EXPECT_EQ(u.reason, e.reason) << "request " << u.id;
      EXPECT_EQ(u.num_output_tokens, e.num_output_tokens);
      EXPECT_EQ(u.output_token_ids, e.output_token_ids);
      if (u.finished) {
        EXPECT_EQ(sched_->find(u.id), nullptr);
        live_.erase(u.id);
        ++num_finished_;
      }
    }
  }

  std::mt19937 rng_;
  bool prefix_caching_;
  std::vector<std::vector<int32_t>> prompts_;            // every prompt added, to repeat prefixes of
  std::map<int32_t, std::vector<int32_t>> page_content_;  // page -> the token whose latent each slot holds (-1: none)
  int32_t page_size_ = 0;
  int32_t num_pages_ = 0;
  SchedulerConfig config_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Scheduler> sched_;
  std::map<uint64_t, Shadow> live_;
  uint64_t next_id_ = 0;
  int num_added_ = 0;
  int num_finished_ = 0;
  int num_aborted_ = 0;
};

TEST(Scheduler, RandomizedSoak) {
  uint64_t preemptions = 0;
  int finished = 0;
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Soak soak(seed);
    soak.run(4000);
    if (::testing::Test::HasFatalFailure()) return;
    preemptions += soak.preemptions();
    finished += soak.num_finished();
  }
  EXPECT_GT(preemptions, 100u) << "the soak should force preemptions";
  EXPECT_GT(finished, 1000);
}

// The soak with prefix caching: admissions after cached pages find their own tokens there, no page is leaked or
// freed while held (check_invariants after every call), and the cache is hit.
TEST(Scheduler, RandomizedSoakWithPrefixCaching) {
  uint64_t preemptions = 0, hits = 0;
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Soak soak(seed, /*prefix_caching=*/true);
    soak.run(4000);
    if (::testing::Test::HasFatalFailure()) return;
    preemptions += soak.preemptions();
    hits += soak.cache_hits();
  }
  EXPECT_GT(preemptions, 100u);
  EXPECT_GT(hits, 1000u) << "the soak should hit the prefix cache";
}

}  // namespace
}  // namespace deepinfer
