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

// ---- Speculative decoding: drafts verified after a decode's real token, lookahead pages. ----

// Runs a speculative step: counts[i] of `tokens` are sampling chunk i's (its accepted drafts, then the token after
// them); checks invariants on the way.
std::vector<RequestUpdate> spec_step(Scheduler& s, const SchedulePlan& plan, std::vector<int32_t> tokens,
                                     std::vector<int32_t> counts) {
  s.check_invariants();
  auto updates = s.update(plan, tokens, counts);
  s.check_invariants();
  return updates;
}

// The tokens [start, start + count) of a request's prompt + output.
std::vector<int32_t> tokens_of(const Request& r, int32_t start, int32_t count) {
  std::vector<int32_t> tokens;
  r.append_tokens(start, count, tokens);
  return tokens;
}

// The prompt of make_request(id, prompt_len, ...).
std::vector<int32_t> prompt_of(uint64_t id, int32_t prompt_len) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < prompt_len; ++i) prompt.push_back(100 + static_cast<int32_t>(id) * 1000 + i);
  return prompt;
}

// A decode with 3 drafts is one chunk of 4 tokens; the update keeps the 2 accepted drafts and the token sampled after
// them, drops the rejected draft's page, and the next step is a plain decode of that token.
TEST(SchedulerSpeculative, VerifiesDraftsAndKeepsTheAcceptedOnes) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 5, 20));
  step(s, schedule(s), 50);  // prefill: 5 computed; the 6th token (50) is the next to compute
  s.set_drafts(1, {61, 62, 63});
  EXPECT_EQ(s.find(1)->draft_token_ids, (std::vector<int32_t>{61, 62, 63}));

  SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.chunks.size(), 1u);
  const ScheduledChunk& c = plan.chunks[0];
  EXPECT_EQ(c.start, 5);
  EXPECT_EQ(c.num_tokens, 4);  // 50, then the three drafts at positions 6..8
  EXPECT_EQ(c.num_draft_tokens, 3);
  EXPECT_TRUE(c.samples);
  EXPECT_EQ(plan.num_batched_tokens, 4);
  EXPECT_EQ(c.request->page_ids.size(), 3u);  // positions 0..8 need ceil(9 / 4) pages

  // 61 and 62 accepted, 70 sampled after them (63 rejected).
  const RequestUpdate u = only_update(spec_step(s, plan, {61, 62, 70}, {3}));
  EXPECT_EQ(u.id, 1u);
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{61, 62, 70}));
  EXPECT_EQ(u.sampled_index, 0);
  EXPECT_FALSE(u.finished);
  EXPECT_EQ(u.num_output_tokens, 4);
  const Request* r = s.find(1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->output_token_ids, (std::vector<int32_t>{50, 61, 62, 70}));
  EXPECT_EQ(r->num_computed_tokens, 8);  // 5 + the real token + 2 accepted drafts; 70 is not computed yet
  EXPECT_TRUE(r->draft_token_ids.empty());
  EXPECT_EQ(r->page_ids.size(), 2u);  // positions 0..7: the page of the rejected draft at 8 went back
  EXPECT_EQ(cache.num_free_pages(), 14);

  plan = schedule(s);  // no drafts: a plain decode of 70 at position 8
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 8);
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 0);
  EXPECT_EQ(tokens_of(*plan.chunks[0].request, 8, 1), (std::vector<int32_t>{70}));
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

// update() splits `tokens` over the sampling chunks in plan order by `counts`, and sampled_index says where each
// request's share starts. The overload without counts is one token per chunk: every draft rejected.
TEST(SchedulerSpeculative, ABadCountChangesNoRequest) {
  CacheManager cache(32, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 4, 20));
  s.add(make_request(2, 4, 20));
  step(s, schedule(s), 50);
  s.set_drafts(2, {61});
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  // The first chunk's count is fine, the second's is more than its one draft allows: nothing may have moved.
  const std::vector<int32_t> tokens{70, 61, 71, 72}, counts{1, 3};
  try {
    s.update(plan, tokens, counts);
    ADD_FAILURE() << "a count past the drafts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sampling chunk 1 got 3 tokens from 1 drafts"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.find(1)->num_computed_tokens, 4);
  EXPECT_EQ(s.find(1)->output_token_ids, (std::vector<int32_t>{50}));
  EXPECT_EQ(s.find(2)->draft_token_ids, (std::vector<int32_t>{61}));
  s.cancel(plan);
  s.check_invariants();
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 32);
}

TEST(SchedulerSpeculative, CountsSplitTheTokensOverTheChunks) {
  CacheManager cache(32, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 4, 20));
  s.add(make_request(2, 4, 20));
  s.add(make_request(3, 4, 20));
  step(s, schedule(s), 50);  // each: 4 computed, 5 tokens
  s.set_drafts(1, {61, 62});
  s.set_drafts(3, {81, 82, 83});  // 2 has none
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 2);
  EXPECT_EQ(plan.chunks[0].num_tokens, 3);
  EXPECT_EQ(plan.chunks[1].num_draft_tokens, 0);
  EXPECT_EQ(plan.chunks[1].num_tokens, 1);
  EXPECT_EQ(plan.chunks[2].num_draft_tokens, 3);
  EXPECT_EQ(plan.chunks[2].num_tokens, 4);
  EXPECT_EQ(plan.num_batched_tokens, 8);

  // 1: 61 accepted, then 70; 2: 71; 3: all three accepted, then 72.
  auto updates = spec_step(s, plan, {61, 70, 71, 81, 82, 83, 72}, {2, 1, 4});
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{61, 70}));
  EXPECT_EQ(updates[0].sampled_index, 0);
  EXPECT_EQ(updates[1].new_tokens, (std::vector<int32_t>{71}));
  EXPECT_EQ(updates[1].sampled_index, 2);
  EXPECT_EQ(updates[2].new_tokens, (std::vector<int32_t>{81, 82, 83, 72}));
  EXPECT_EQ(updates[2].sampled_index, 3);
  EXPECT_EQ(updates[2].num_output_tokens, 5);
  EXPECT_EQ(s.find(1)->num_computed_tokens, 6);  // 4 + real + 1 accepted
  EXPECT_EQ(s.find(2)->num_computed_tokens, 5);
  EXPECT_EQ(s.find(3)->num_computed_tokens, 8);  // 4 + real + 3 accepted
  EXPECT_EQ(s.find(3)->output_token_ids, (std::vector<int32_t>{50, 81, 82, 83, 72}));

  s.set_drafts(1, {90, 91});
  plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].request->id, 1u);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 2);
  updates = step(s, plan, 95);  // update(plan, sampled): the real token's sample only
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{95}));
  EXPECT_EQ(updates[1].sampled_index, 1);
  const Request* r = s.find(1);
  EXPECT_EQ(r->num_computed_tokens, 7);
  EXPECT_EQ(r->output_token_ids, (std::vector<int32_t>{50, 61, 70, 95}));
  EXPECT_TRUE(r->draft_token_ids.empty());
  EXPECT_EQ(r->page_ids.size(), 2u);  // ceil(7 / 4): the drafts' third page went back
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 32);
}

// A count outside [1, 1 + drafts], counts that do not sum to the tokens given, or a count per non-sampling chunk are
// rejected, and the plan can still be applied afterwards.
TEST(SchedulerSpeculative, RejectsCountsTheChunksCannotHave) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 20));
  step(s, schedule(s), 50);
  s.set_drafts(1, {61, 62});
  const SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.chunks.size(), 1u);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 2);
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{}, std::vector<int32_t>{0}), Error);
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{61, 62, 70, 71}, std::vector<int32_t>{4}), Error);  // > 1 + 2
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{61, 70}, std::vector<int32_t>{3}), Error);  // 2 tokens, count 3
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{61, 70}, std::vector<int32_t>{1, 1}), Error);  // one chunk
  const Request* r = s.find(1);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_EQ(r->output_token_ids, (std::vector<int32_t>{50}));
  EXPECT_EQ(r->draft_token_ids.size(), 2u);
  EXPECT_EQ(only_update(spec_step(s, plan, {61, 62, 70}, {3})).new_tokens, (std::vector<int32_t>{61, 62, 70}));
  EXPECT_EQ(s.find(1)->num_computed_tokens, 7);
}

// A cancelled verification gives back the drafts' pages and keeps the request where it was, drafts included: the next
// schedule plans the same chunk again.
TEST(SchedulerSpeculative, CancelGivesBackTheDraftPages) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 5, 20));
  step(s, schedule(s), 50);
  s.set_drafts(1, {61, 62, 63});
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 3);
  EXPECT_EQ(cache.num_free_pages(), 13);  // positions 0..8
  s.cancel(plan);
  s.check_invariants();
  const Request* r = s.find(1);
  EXPECT_EQ(cache.num_free_pages(), 14);  // positions 0..5 again
  EXPECT_EQ(r->num_computed_tokens, 5);
  EXPECT_EQ(r->output_token_ids, (std::vector<int32_t>{50}));
  EXPECT_EQ(r->draft_token_ids, (std::vector<int32_t>{61, 62, 63}));

  plan = schedule(s);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 5);
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 3);
  EXPECT_EQ(only_update(spec_step(s, plan, {61, 62, 63, 70}, {4})).new_tokens, (std::vector<int32_t>{61, 62, 63, 70}));
  EXPECT_EQ(s.find(1)->num_computed_tokens, 9);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

// Drafts are cut to the token budget left after the real token.
TEST(SchedulerSpeculative, DraftsFitTheTokenBudget) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 3, .max_model_len = 64}, cache);
  s.add(make_request(1, 3, 20));
  step(s, schedule(s), 50);
  s.set_drafts(1, {61, 62, 63, 64, 65});
  const SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].num_tokens, 3);  // the real token + 2 of the 5 drafts
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 2);
  EXPECT_EQ(plan.num_batched_tokens, 3);
  const RequestUpdate u = only_update(spec_step(s, plan, {61, 62, 70}, {3}));  // both verified drafts accepted
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{61, 62, 70}));
  EXPECT_EQ(s.find(1)->num_computed_tokens, 6);
}

// Drafts are cut so that every accepted draft and the token after them fit within max_model_len: with n tokens, at
// most max_model_len - 1 - n. Accepting them all ends the request there, by length.
TEST(SchedulerSpeculative, DraftsFitMaxModelLen) {
  struct Case {
    int32_t max_model_len;
    int32_t expected_drafts;
  };
  // A prompt of 5 and one output: 6 tokens when the drafts are planned.
  for (const Case& k : {Case{64, 5}, Case{9, 2}, Case{8, 1}, Case{7, 0}}) {
    SCOPED_TRACE(::testing::Message() << "max_model_len " << k.max_model_len);
    CacheManager cache(16, 4);
    Scheduler s({.max_num_batched_tokens = 64, .max_model_len = k.max_model_len}, cache);
    s.add(make_request(1, 5, 20));
    step(s, schedule(s), 50);
    s.set_drafts(1, {61, 62, 63, 64, 65});
    const SchedulePlan plan = schedule(s);
    ASSERT_EQ(plan.chunks.size(), 1u);
    ASSERT_EQ(plan.chunks[0].num_draft_tokens, k.expected_drafts);
    EXPECT_EQ(plan.chunks[0].num_tokens, 1 + k.expected_drafts);
    std::vector<int32_t> tokens(static_cast<size_t>(k.expected_drafts));
    for (int32_t i = 0; i < k.expected_drafts; ++i) tokens[static_cast<size_t>(i)] = 61 + i;
    tokens.push_back(70);
    const RequestUpdate u = only_update(spec_step(s, plan, tokens, {1 + k.expected_drafts}));
    EXPECT_EQ(u.new_tokens, tokens);
    EXPECT_EQ(u.finished, 6 + 1 + k.expected_drafts == k.max_model_len);
    if (u.finished) {
      EXPECT_EQ(u.reason, FinishReason::kLength);
    }
  }
}

// Drafts take only the room left in the request's pages after its real token and the pages free at that point; in a
// full cache they shrink (to none) and nobody is preempted for them.
TEST(SchedulerSpeculative, DraftsShrinkToTheFreePagesWithoutPreempting) {
  CacheManager cache(4, 4);  // 16 tokens
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 8, 8));  // 2 full pages after its prompt: its next token needs a third
  s.add(make_request(2, 2, 8));  // 1 page, 2 of its slots used
  step(s, schedule(s), 50);
  ASSERT_EQ(cache.num_free_pages(), 1);
  s.set_drafts(1, {61, 62, 63, 64, 65});
  s.set_drafts(2, {81, 82, 83});
  SchedulePlan plan = schedule(s);
  EXPECT_TRUE(plan.preempted_ids.empty());
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  // 1: its real token at 8 opens the free page, whose other 3 slots take 3 drafts.
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 3);
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 3u);
  // 2: its page has slots 2 and 3 left: the real token and 1 draft.
  EXPECT_EQ(plan.chunks[1].num_draft_tokens, 1);
  EXPECT_EQ(plan.chunks[1].request->page_ids.size(), 1u);
  EXPECT_EQ(cache.num_free_pages(), 0);
  spec_step(s, plan, {61, 70, 80}, {2, 1});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 10);
  EXPECT_EQ(s.find(2)->num_computed_tokens, 3);

  // Now 2's page has 1 slot left (its real token) and no page is free: its drafts are dropped, not preempting.
  s.set_drafts(2, {91, 92});
  plan = schedule(s);
  EXPECT_TRUE(plan.preempted_ids.empty());
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(plan.chunks[1].num_draft_tokens, 0);
  EXPECT_EQ(plan.chunks[1].num_tokens, 1);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 4);
}

// The drafts of an earlier request must not take the free page a later running request needs for its real token:
// that would preempt the later one for the drafts' sake ("drafts never cause a preemption").
TEST(SchedulerSpeculative, EarlierDraftsDoNotPreemptALaterDecode) {
  CacheManager cache(3, 4);  // 12 tokens
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 3, 5));  // 1 page; its next token (position 3) fits in it
  s.add(make_request(2, 4, 5));  // 1 full page; its next token (position 4) needs the free page
  step(s, schedule(s), 50);
  ASSERT_EQ(cache.num_free_pages(), 1);
  s.set_drafts(1, {61, 62, 63});
  const SchedulePlan plan = schedule(s);
  EXPECT_TRUE(plan.preempted_ids.empty()) << "request " << plan.preempted_ids.front() << " was preempted";
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.total_preemptions(), 0u);
  if (!plan.chunks.empty()) {
    EXPECT_EQ(plan.chunks[0].num_draft_tokens, 0);  // the free page is 2's: no room left for them
  }
  s.check_invariants();
}

// A stop among the accepted tokens ends the request at it: the tokens after it were computed but are not the
// request's. max_tokens likewise; an EOS before min_tokens does not stop it.
TEST(SchedulerSpeculative, AFinishAmongTheAcceptedTokensEndsThere) {
  CacheManager cache(16, 4);
  Scheduler s({.max_model_len = 64}, cache);
  s.add(make_request(1, 4, 20));
  step(s, schedule(s), 50);
  s.set_drafts(1, {61, kEos, 63});
  SchedulePlan plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 3);
  RequestUpdate u = only_update(spec_step(s, plan, {61, kEos, 63, 70}, {4}));  // all accepted, then 70
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStop);
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{61, kEos}));
  EXPECT_EQ(u.num_output_tokens, 3);
  EXPECT_EQ(u.output_token_ids, (std::vector<int32_t>{50, 61, kEos}));
  EXPECT_EQ(s.find(1), nullptr);
  EXPECT_EQ(cache.num_free_pages(), 16);

  s.add(make_request(2, 4, 3));  // max_tokens 3: 50, then room for 2 more
  step(s, schedule(s), 50);
  s.set_drafts(2, {61, 62, 63});
  plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 3);
  u = only_update(spec_step(s, plan, {61, 62, 63, 70}, {4}));
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kLength);
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{61, 62}));
  EXPECT_EQ(u.output_token_ids, (std::vector<int32_t>{50, 61, 62}));
  EXPECT_EQ(cache.num_free_pages(), 16);

  auto r = make_request(3, 4, 20);
  r->params.min_tokens = 3;
  s.add(std::move(r));
  step(s, schedule(s), 50);
  s.set_drafts(3, {kEos, 62});
  plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 2);
  u = only_update(spec_step(s, plan, {kEos, 62, 70}, {3}));  // kEos is output 1: below min_tokens, no stop
  EXPECT_FALSE(u.finished);
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{kEos, 62, 70}));
  EXPECT_EQ(s.find(3)->num_computed_tokens, 7);
  s.set_drafts(3, {kEos, 72});
  plan = schedule(s);
  ASSERT_EQ(plan.chunks[0].num_draft_tokens, 2);
  u = only_update(spec_step(s, plan, {kEos, 72, 73}, {3}));  // kEos is output 4 now: a stop
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStop);
  EXPECT_EQ(u.new_tokens, (std::vector<int32_t>{kEos}));
  EXPECT_EQ(u.output_token_ids, (std::vector<int32_t>{50, kEos, 62, 70, kEos}));
  EXPECT_EQ(cache.num_free_pages(), 16);
}

// With num_lookahead_tokens L, a sampling chunk's request also holds the pages of the L positions after the chunk (the
// drafter writes there) when they are free, and keeps at most those of its computed tokens + L between steps.
TEST(SchedulerSpeculative, LookaheadKeepsRoomAfterSamplingChunks) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 2}, cache);
  s.add(make_request(1, 7, 20));
  SchedulePlan plan = schedule(s);  // prefill [0, 7) and 2 more positions: ceil(9 / 4)
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 3u);
  step(s, plan, 50);
  EXPECT_EQ(s.find(1)->page_ids.size(), 3u);  // 7 computed + 2

  s.set_drafts(1, {61, 62, 63});
  plan = schedule(s);  // [7, 11) and 2 more: ceil(13 / 4)
  ASSERT_EQ(plan.chunks[0].num_tokens, 4);
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 4u);
  spec_step(s, plan, {61, 70}, {2});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 9);
  EXPECT_EQ(s.find(1)->page_ids.size(), 3u);  // trimmed to 9 computed + 2

  plan = schedule(s);  // a decode [9, 10) and 2 more: ceil(12 / 4)
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 3u);
  step(s, plan, 71);
  EXPECT_EQ(s.find(1)->page_ids.size(), 3u);

  s.set_drafts(1, {81, 82});
  plan = schedule(s);  // [10, 13) and 2 more: ceil(15 / 4)
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 4u);
  spec_step(s, plan, {81, 82, 83}, {3});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 13);
  EXPECT_EQ(s.find(1)->page_ids.size(), 4u);  // 13 computed + 2
  EXPECT_EQ(cache.num_free_pages(), 12);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 16);
}

// The lookahead never preempts nor stops an admission: it takes pages only when free, first come first served.
TEST(SchedulerSpeculative, LookaheadTakesOnlyFreePages) {
  CacheManager cache(3, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 2}, cache);
  s.add(make_request(1, 4, 4));
  s.add(make_request(2, 4, 4));
  SchedulePlan plan = schedule(s);
  EXPECT_TRUE(plan.preempted_ids.empty());
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));  // both admitted before any lookahead
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 2u);     // 4 + 2 positions: the free page
  EXPECT_EQ(plan.chunks[1].request->page_ids.size(), 1u);     // none left for its lookahead
  EXPECT_EQ(cache.num_free_pages(), 0);
  step(s, plan);
  EXPECT_EQ(s.find(1)->page_ids.size(), 2u);
  EXPECT_EQ(s.find(2)->page_ids.size(), 1u);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 3);
}

// The drafter's room is the first thing taken back under pressure: a request that needs a page for its own next token,
// or a waiting one that needs pages to start, gets the lookahead pages the others keep before anyone is preempted
// or refused; they keep the pages of their computed tokens and of their chunk in the plan.
TEST(SchedulerSpeculative, LookaheadPagesComeBackBeforePreemptionOrRefusal) {
  CacheManager cache(5, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 5}, cache);
  s.add(make_request(1, 4, 8));
  SchedulePlan plan = schedule(s);  // [0, 4) and 5 more positions: ceil(9 / 4) = 3 pages
  EXPECT_EQ(s.find(1)->page_ids.size(), 3u);
  step(s, plan);
  s.add(make_request(2, 8, 4));
  plan = schedule(s);  // 1 decodes [4, 5); 2 prefills [0, 8) on the 2 free pages, none left for its lookahead
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(cache.num_free_pages(), 0);
  step(s, plan);
  EXPECT_EQ(s.find(1)->page_ids.size(), 3u);  // 5 computed + 5: still its 3 pages
  EXPECT_EQ(s.find(2)->page_ids.size(), 2u);

  // 2's next token (position 8) needs a third page and none is free: 1's lookahead page comes back instead of
  // preempting 2; 3, waiting, finds no page left and waits (nothing is preempted for an admission).
  s.add(make_request(3, 4, 4));
  plan = schedule(s);
  EXPECT_TRUE(plan.preempted_ids.empty());
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.find(1)->page_ids.size(), 2u);  // [5, 6): its computed tokens and its chunk
  EXPECT_EQ(s.find(2)->page_ids.size(), 3u);
  step(s, plan);
  EXPECT_EQ(cache.num_free_pages(), 0);
  s.check_invariants();
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 5);
}

// A waiting request is admitted on the lookahead pages a running one keeps, instead of waiting for them.
TEST(SchedulerSpeculative, AdmissionTakesBackLookaheadPages) {
  CacheManager cache(3, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 8}, cache);
  s.add(make_request(1, 2, 6));
  SchedulePlan plan = schedule(s);  // [0, 2) and 8 more positions: all 3 pages
  EXPECT_EQ(cache.num_free_pages(), 0);
  step(s, plan);
  s.add(make_request(2, 4, 4));
  plan = schedule(s);  // 1 decodes [2, 3) on its first page; 2 starts on one of the two it gave back
  EXPECT_TRUE(plan.preempted_ids.empty());
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.find(2)->page_ids.size(), 1u);
  step(s, plan);
  s.check_invariants();
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 3);
}

// The lookahead stops at max_model_len: no page for positions the request can never reach.
TEST(SchedulerSpeculative, LookaheadStopsAtMaxModelLen) {
  CacheManager cache(16, 2);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 6, .num_lookahead_tokens = 2}, cache);
  s.add(make_request(1, 4, 20));
  SchedulePlan plan = schedule(s);  // [0, 4) + 2 = 6 positions: 3 pages
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 3u);
  step(s, plan);
  plan = schedule(s);  // [4, 5) + 2 = 7 positions, capped at 6: still 3 pages
  EXPECT_EQ(plan.chunks[0].request->page_ids.size(), 3u);
  const RequestUpdate u = only_update(step(s, plan));
  EXPECT_EQ(u.reason, FinishReason::kLength);  // 6 tokens
  EXPECT_EQ(cache.num_free_pages(), 16);
}

// A preempted request loses its drafts (they follow tokens it no longer has in the cache), and drafts for a request
// that is not running, or unknown, are ignored.
TEST(SchedulerSpeculative, PreemptionClearsDrafts) {
  CacheManager cache(4, 4);  // 16 tokens
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  s.add(make_request(1, 8, 8));  // its next token needs a third page
  s.add(make_request(2, 7, 9));
  step(s, schedule(s), 50);
  ASSERT_EQ(cache.num_free_pages(), 0);
  s.set_drafts(2, {61, 62});
  SchedulePlan plan = schedule(s);  // 1 needs a page: 2, the latest, is preempted
  EXPECT_EQ(chunk_ids(plan), (std::vector<uint64_t>{1}));
  EXPECT_EQ(plan.preempted_ids, (std::vector<uint64_t>{2}));
  const Request* victim = s.find(2);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->status, RequestStatus::kWaiting);
  EXPECT_TRUE(victim->draft_token_ids.empty());
  s.set_drafts(2, {71, 72});  // waiting: ignored
  EXPECT_TRUE(s.find(2)->draft_token_ids.empty());
  EXPECT_NO_THROW(s.set_drafts(12345, {1}));
  step(s, plan);

  while (s.find(1) != nullptr) step(s, schedule(s));
  plan = schedule(s);  // 2 recomputes its prompt and output, without drafts
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{2}));
  EXPECT_EQ(plan.chunks[0].start, 0);
  EXPECT_EQ(plan.chunks[0].num_tokens, 8);
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 0);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_free_pages(), 4);
}

// A request that does not speculate never runs the MTP layer, so its pages lack that layer's latents: a speculating
// request with the same prompt must not find them (its drafts would read latents never written), and the two keep
// separate entries. Requests of one kind share as before.
TEST(SchedulerSpeculative, PagesOfRequestsWithoutDraftsAreCachedApart) {
  CacheManager cache(16, 4, /*prefix_caching=*/true);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  const auto request = [](uint64_t id, bool speculates) {
    auto r = make_request(1, 9, 1);  // the same 9-token prompt each time: two full pages
    r->id = id;
    r->speculates = speculates;
    return r;
  };
  s.add(request(1, /*speculates=*/false));
  run_to_completion(s);
  EXPECT_EQ(cache.num_cached_pages(), 2);

  s.add(request(2, /*speculates=*/true));
  SchedulePlan plan = schedule(s);
  EXPECT_EQ(plan.chunks[0].start, 0);  // nothing found: 1's pages are keyed from the other root
  EXPECT_EQ(plan.chunks[0].request->num_cached_tokens, 0);
  step(s, plan);
  run_to_completion(s);
  EXPECT_EQ(cache.num_cached_pages(), 4);

  for (const bool speculates : {true, false}) {
    s.add(request(speculates ? 3 : 4, speculates));
    plan = schedule(s);
    EXPECT_EQ(plan.chunks[0].start, 8) << "speculates " << speculates;  // its own kind's two pages
    step(s, plan);
    run_to_completion(s);
  }
  EXPECT_EQ(cache.num_cached_pages(), 4);
}

// Prefix caching registers a page only once it is full of computed tokens the request kept: the latents of rejected
// drafts are never found by a later request, the accepted ones are, and tokens after a stop are not registered.
TEST(SchedulerSpeculative, PrefixCachingRegistersOnlyAcceptedTokens) {
  CacheManager cache(16, 4, /*prefix_caching=*/true);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  const std::vector<int32_t> prompt = prompt_of(1, 5);
  s.add(make_request(1, 5, 20));
  step(s, schedule(s), 50);  // page 0 = prompt[0..3] is full and computed
  EXPECT_EQ(cache.num_cached_pages(), 1);

  // Drafts at positions 6..8 all rejected: page 1 holds latents of prompt[4], 50, 61, 62, but only the first two are
  // the request's.
  s.set_drafts(1, {61, 62, 63});
  spec_step(s, schedule(s), {70}, {1});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 6);
  EXPECT_EQ(cache.num_cached_pages(), 1);

  // 70 at 6 and the accepted draft 80 at 7: page 1 = prompt[4], 50, 70, 80 is now full and computed.
  s.set_drafts(1, {80, 81});
  spec_step(s, schedule(s), {80, 90}, {2});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 8);
  EXPECT_EQ(cache.num_cached_pages(), 2);

  // 90 at 8, then drafts 91, kEos, 93 all accepted: the request stops at kEos (position 10), so page 2 (positions
  // 8..11) never holds only its own computed tokens.
  s.set_drafts(1, {91, kEos, 93});
  const RequestUpdate u = only_update(spec_step(s, schedule(s), {91, kEos, 93, 94}, {4}));
  EXPECT_EQ(u.reason, FinishReason::kStop);
  EXPECT_EQ(cache.num_cached_pages(), 2);

  // A prompt that follows the rejected drafts finds page 0 only; one that follows the accepted tokens finds both.
  auto rejected = std::make_unique<Request>();
  rejected->id = 2;
  rejected->prompt_token_ids = prompt;
  rejected->prompt_token_ids.insert(rejected->prompt_token_ids.end(), {50, 61, 62, 99});
  rejected->params.max_tokens = 4;
  auto accepted = std::make_unique<Request>();
  accepted->id = 3;
  accepted->prompt_token_ids = prompt;
  accepted->prompt_token_ids.insert(accepted->prompt_token_ids.end(), {50, 70, 80, 90, 91, kEos, 93, 99});
  accepted->params.max_tokens = 4;
  s.add(std::move(rejected));
  s.add(std::move(accepted));
  const SchedulePlan plan = schedule(s);
  ASSERT_EQ(chunk_ids(plan), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(plan.chunks[0].start, 4);
  EXPECT_EQ(plan.chunks[0].request->num_cached_tokens, 4);
  EXPECT_EQ(plan.chunks[1].start, 8);
  EXPECT_EQ(plan.chunks[1].request->num_cached_tokens, 8);
  step(s, plan);
  run_to_completion(s);
}

// ---- Randomized soak: a shadow model checks every plan and update. ----

struct Shadow {
  std::vector<int32_t> tokens;  // prompt + output
  int32_t num_prompt = 0;
  int32_t computed = 0;
  SamplingParams params;
};

struct SoakOptions {
  bool prefix_caching = false;
  // Speculative decoding: random drafts before each schedule, a random number of them accepted, a random lookahead.
  bool speculative = false;
};

// With prefix caching, prompts often repeat a prefix of an earlier one, and the shadow keeps what each page's latents
// hold: an admission that starts after cached pages must find there exactly its own tokens. With speculative decoding
// the latents of drafts are written too (rejected ones included), so that check also catches a page registered with
// tokens the request did not keep.
class Soak {
 public:
  explicit Soak(uint32_t seed, SoakOptions options = {})
      : rng_(seed), prefix_caching_(options.prefix_caching), speculative_(options.speculative) {
    page_size_ = pick(1, 6);
    num_pages_ = pick(4, 24);
    config_ = {.max_num_seqs = pick(1, 6), .max_num_batched_tokens = pick(1, 24),
               .max_model_len = pick(2, page_size_ * num_pages_ + 8)};
    if (speculative_) config_.num_lookahead_tokens = pick(0, 3);
    cache_ = std::make_unique<CacheManager>(num_pages_, page_size_, prefix_caching_);
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
  int64_t accepted_drafts() const { return accepted_drafts_; }
  int64_t verified_drafts() const { return verified_drafts_; }

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

  // Random drafts (some with an EOS) for some live requests; only running ones take them.
  void set_random_drafts() {
    for (const auto& [id, shadow] : live_) {
      if (pick(0, 3) == 0) continue;  // keeps what it had
      std::vector<int32_t> drafts(static_cast<size_t>(pick(0, 4)));
      for (int32_t& t : drafts) t = pick(0, 9) == 0 ? kEos : pick(kEos, 30);
      const bool running = sched_->find(id)->status == RequestStatus::kRunning;
      sched_->set_drafts(id, drafts);
      EXPECT_EQ(sched_->find(id)->draft_token_ids, running ? drafts : std::vector<int32_t>{}) << "request " << id;
    }
    sched_->set_drafts(next_id_ + 100, {kToken});  // unknown: ignored
  }

  void step() {
    if (speculative_) set_random_drafts();
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
      EXPECT_TRUE(r->draft_token_ids.empty()) << "preempted request " << id << " kept its drafts";
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
    std::vector<std::vector<int32_t>> chunk_tokens;  // each chunk's tokens: its real ones, then its drafts
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
      const int32_t num_tokens = static_cast<int32_t>(sh.tokens.size());
      const int32_t drafts = c.num_draft_tokens, real = c.num_tokens - drafts;
      ASSERT_GT(real, 0);
      ASSERT_GE(drafts, 0);
      ASSERT_LE(c.start + real, num_tokens);
      ASSERT_EQ(c.samples, c.start + real == num_tokens);
      if (drafts > 0) {  // only a decode verifies drafts, within what it holds and max_model_len
        ASSERT_TRUE(speculative_);
        ASSERT_EQ(real, 1) << "request " << id;
        ASSERT_EQ(c.start, num_tokens - 1) << "request " << id;
        ASSERT_LE(drafts, static_cast<int32_t>(c.request->draft_token_ids.size()));
        ASSERT_LE(num_tokens + drafts, config_.max_model_len - 1) << "request " << id;
      }
      ASSERT_GE(static_cast<int32_t>(c.request->page_ids.size()), cache_->pages_for_tokens(c.start + c.num_tokens));
      std::vector<int32_t> tokens;
      c.request->append_tokens(c.start, real, tokens);
      ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), sh.tokens.begin() + c.start)) << "request " << id;
      tokens.insert(tokens.end(), c.request->draft_token_ids.begin(), c.request->draft_token_ids.begin() + drafts);
      chunk_tokens.push_back(std::move(tokens));
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

    // What each sampling chunk returns: without drafts one token; with d drafts, 1 to 1 + d tokens, the accepted
    // drafts (a prefix of them) and one token after them.
    std::vector<int32_t> sampled, counts;
    std::vector<std::vector<int32_t>> pages_of;  // each chunk's page table, read before any pointer can die
    for (const ScheduledChunk& c : plan.chunks) {
      const size_t index = static_cast<size_t>(&c - plan.chunks.data());
      if (c.samples) {
        const int32_t count = c.num_draft_tokens > 0 ? pick(1, 1 + c.num_draft_tokens) : 1;
        const std::vector<int32_t>& drafts_of = chunk_tokens[index];  // [real token, drafts...]
        sampled.insert(sampled.end(), drafts_of.begin() + 1, drafts_of.begin() + count);
        sampled.push_back(pick(0, 9) == 0 ? kEos : pick(kEos, 30));
        counts.push_back(count);
      }
      const bool gone = std::count(aborted.begin(), aborted.end(), seen[index]);
      pages_of.push_back(gone ? std::vector<int32_t>{} : c.request->page_ids);
    }
    std::vector<RequestUpdate> expected;
    size_t next_count = 0, next_token = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      const int32_t count = c.samples ? counts[next_count++] : 0;
      const size_t first_token = next_token;
      next_token += static_cast<size_t>(count);
      // A chunk of an aborted request must not be touched through its (dead) pointer: find its id by position.
      const size_t index = static_cast<size_t>(&c - plan.chunks.data());
      const uint64_t id = seen[index];
      if (std::count(aborted.begin(), aborted.end(), id) != 0) continue;
      Shadow& sh = live_.at(id);
      for (int32_t pos = c.start; pos < c.start + c.num_tokens; ++pos) {  // the latents this chunk writes
        std::vector<int32_t>& content = page_content_[pages_of[index][static_cast<size_t>(pos / page_size_)]];
        content.resize(static_cast<size_t>(page_size_), -1);
        content[static_cast<size_t>(pos % page_size_)] = chunk_tokens[index][static_cast<size_t>(pos - c.start)];
      }
      // The real tokens and the accepted drafts are computed.
      sh.computed += c.num_tokens - c.num_draft_tokens + std::max(0, count - 1);
      if (!c.samples) continue;
      if (c.num_draft_tokens > 0) {
        verified_drafts_ += c.num_draft_tokens;
        accepted_drafts_ += count - 1;
      }
      RequestUpdate e{.id = id, .sampled_index = static_cast<int32_t>(first_token)};
      for (int32_t k = 0; k < count && e.reason == FinishReason::kNone; ++k) {
        const int32_t token = sampled[first_token + static_cast<size_t>(k)];
        sh.tokens.push_back(token);
        e.new_tokens.push_back(token);
        const int32_t num_output = static_cast<int32_t>(sh.tokens.size()) - sh.num_prompt;
        const bool may_stop = num_output > sh.params.min_tokens;
        const bool is_eos = !sh.params.ignore_eos && (token == kEos || token == kEos + 1);
        const bool is_stop = std::count(sh.params.stop_token_ids.begin(), sh.params.stop_token_ids.end(), token) != 0;
        if (may_stop && (is_eos || is_stop)) {
          e.reason = FinishReason::kStop;
        } else if (num_output >= sh.params.max_tokens ||
                   static_cast<int32_t>(sh.tokens.size()) >= config_.max_model_len) {
          e.reason = FinishReason::kLength;
        }
      }
      sh.computed = std::min(sh.computed, static_cast<int32_t>(sh.tokens.size()) - 1);  // nothing after a stop
      e.finished = e.reason != FinishReason::kNone;
      e.num_output_tokens = static_cast<int32_t>(sh.tokens.size()) - sh.num_prompt;
      if (e.finished) e.output_token_ids.assign(sh.tokens.begin() + sh.num_prompt, sh.tokens.end());
      expected.push_back(std::move(e));
    }

    std::vector<RequestUpdate> updates =
        speculative_ ? sched_->update(plan, sampled, counts) : sched_->update(plan, sampled);
    sched_->check_invariants();
    ASSERT_EQ(updates.size(), expected.size());
    for (size_t i = 0; i < updates.size(); ++i) {
      const RequestUpdate& u = updates[i];
      const RequestUpdate& e = expected[i];
      ASSERT_EQ(u.id, e.id);
      EXPECT_EQ(u.new_tokens, e.new_tokens);
      EXPECT_EQ(u.sampled_index, e.sampled_index) << "request " << u.id;
      ASSERT_EQ(u.finished, e.finished) << "request " << u.id;
      EXPECT_EQ(u.reason, e.reason) << "request " << u.id;
      EXPECT_EQ(u.num_output_tokens, e.num_output_tokens);
      EXPECT_EQ(u.output_token_ids, e.output_token_ids);
      std::vector<int32_t>& reported = reported_[u.id];
      reported.insert(reported.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        // The whole output is what the updates reported, one step after another (preemptions included).
        EXPECT_EQ(u.output_token_ids, reported) << "request " << u.id;
        EXPECT_EQ(sched_->find(u.id), nullptr);
        live_.erase(u.id);
        reported_.erase(u.id);
        ++num_finished_;
      } else {
        const Request* r = sched_->find(u.id);
        ASSERT_NE(r, nullptr);
        EXPECT_TRUE(r->draft_token_ids.empty()) << "request " << u.id << ": update() left its drafts";
        EXPECT_EQ(r->num_computed_tokens, live_.at(u.id).computed) << "request " << u.id;
      }
    }
  }

  std::mt19937 rng_;
  bool prefix_caching_;
  bool speculative_;
  std::map<uint64_t, std::vector<int32_t>> reported_;    // request -> the new_tokens of its updates so far
  int64_t verified_drafts_ = 0;
  int64_t accepted_drafts_ = 0;
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
    Soak soak(seed, {.prefix_caching = true});
    soak.run(4000);
    if (::testing::Test::HasFatalFailure()) return;
    preemptions += soak.preemptions();
    hits += soak.cache_hits();
  }
  EXPECT_GT(preemptions, 100u);
  EXPECT_GT(hits, 1000u) << "the soak should hit the prefix cache";
}

// The soak with speculative decoding, with and without prefix caching: random drafts before every schedule, a random
// prefix of them accepted, a random lookahead. Every plan, update and output is checked against the shadow.
TEST(Scheduler, RandomizedSoakWithDrafts) {
  uint64_t preemptions = 0, hits = 0;
  int64_t verified = 0, accepted = 0;
  int finished = 0;
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Soak soak(seed, {.prefix_caching = seed % 2 == 0, .speculative = true});
    soak.run(4000);
    if (::testing::Test::HasFatalFailure()) return;
    preemptions += soak.preemptions();
    hits += soak.cache_hits();
    verified += soak.verified_drafts();
    accepted += soak.accepted_drafts();
    finished += soak.num_finished();
  }
  // The soak must exercise what it is for: verified and accepted drafts, preemptions, prefix cache hits (at seed 1..16:
  // about 17k drafts verified, 8.7k accepted, 630 preemptions, 1.5k cached tokens, 6.9k finished).
  EXPECT_GT(verified, 2000);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(preemptions, 100u);
  EXPECT_GT(hits, 500u);
  EXPECT_GT(finished, 1000);
}

}  // namespace
}  // namespace deepinfer
