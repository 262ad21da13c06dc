// Structured outputs in the scheduler and the step's inputs: a request's grammar advances over its generated tokens,
// ends the request when complete or when it rejects a token, gets no drafts, and its sampling row points at its mask.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/cache_manager.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/request.h"
#include "engine/sampling_inputs.h"
#include "engine/scheduler.h"

namespace deepinfer {
namespace {

constexpr int32_t kEos = 2;

// A grammar that accepts `expected` token by token and is complete after the last one; records what it was given.
class ScriptedMatcher final : public GrammarMatcher {
 public:
  ScriptedMatcher(std::vector<int32_t> expected, std::vector<int32_t>& consumed)
      : expected_(std::move(expected)), consumed_(consumed) {}

  void fill_allowed(std::span<uint32_t> allowed) override {
    std::fill(allowed.begin(), allowed.end(), 0u);
    if (next_ < expected_.size()) allowed[expected_[next_] / 32] |= 1u << (expected_[next_] % 32);
  }
  bool consume(int32_t token) override {
    consumed_.push_back(token);
    if (next_ >= expected_.size() || expected_[next_] != token) {
      error_ = "token " + std::to_string(token) + " is not allowed here";
      return false;
    }
    ++next_;
    return true;
  }
  int32_t num_valid(std::span<const int32_t> tokens) override {
    int32_t n = 0;
    while (static_cast<size_t>(n) < tokens.size() && next_ + n < expected_.size() &&
           expected_[next_ + n] == tokens[static_cast<size_t>(n)]) {
      ++n;
    }
    return n;
  }
  void rollback(int32_t num_tokens) override {
    ASSERT_LE(static_cast<size_t>(num_tokens), next_);
    next_ -= static_cast<size_t>(num_tokens);
    consumed_.resize(consumed_.size() - static_cast<size_t>(num_tokens));
  }
  bool is_terminated() const override { return next_ == expected_.size(); }
  std::string error() const override { return error_; }

 private:
  std::vector<int32_t> expected_;
  std::vector<int32_t>& consumed_;
  size_t next_ = 0;
  std::string error_;
};

std::unique_ptr<Request> constrained_request(uint64_t id, std::vector<int32_t> grammar, std::vector<int32_t>& consumed,
                                             int32_t max_tokens = 20) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt_token_ids = {10, 11, 12, 13, 14};
  r->params.max_tokens = max_tokens;
  r->eos_token_ids = {kEos};
  r->grammar = std::make_unique<ScriptedMatcher>(std::move(grammar), consumed);
  return r;
}

RequestUpdate step_with(Scheduler& s, int32_t token) {
  const SchedulePlan plan = s.schedule();
  const std::vector<int32_t> tokens(static_cast<size_t>(plan.num_sampling_chunks()), token);
  auto updates = s.update(plan, tokens);
  s.check_invariants();
  EXPECT_EQ(updates.size(), 1u);
  return updates.empty() ? RequestUpdate{} : updates[0];
}

TEST(GrammarScheduling, TheGrammarSeesEveryTokenAndACompleteGrammarEndsTheRequest) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41, 42}, consumed));
  EXPECT_FALSE(step_with(s, 40).finished);
  EXPECT_FALSE(step_with(s, 41).finished);
  const RequestUpdate last = step_with(s, 42);
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.reason, FinishReason::kStop);
  EXPECT_EQ(last.output_token_ids, (std::vector<int32_t>{40, 41, 42}));
  EXPECT_EQ(consumed, (std::vector<int32_t>{40, 41, 42}));
  EXPECT_FALSE(s.has_unfinished());
}

TEST(GrammarScheduling, ARejectedTokenEndsTheRequestWithTheGrammarsReason) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41}, consumed));
  const RequestUpdate u = step_with(s, 99);
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kError);
  EXPECT_NE(u.error.find("the grammar rejected token 99: token 99 is not allowed here"), std::string::npos) << u.error;
  EXPECT_EQ(cache.num_free_pages(), 16);
}

TEST(GrammarScheduling, EosEndsTheRequestWithoutReachingTheGrammar) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41}, consumed));
  EXPECT_FALSE(step_with(s, 40).finished);
  const RequestUpdate u = step_with(s, kEos);
  EXPECT_EQ(u.reason, FinishReason::kStop);
  EXPECT_EQ(consumed, (std::vector<int32_t>{40}));
}

TEST(GrammarScheduling, MaxTokensStillEndsAnIncompleteGrammar) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41, 42}, consumed, /*max_tokens=*/2));
  step_with(s, 40);
  const RequestUpdate u = step_with(s, 41);
  EXPECT_EQ(u.reason, FinishReason::kLength);
}

TEST(GrammarScheduling, AConstrainedRequestKeepsTheDraftsItsGrammarAllowsAndConsumesWhatItAccepts) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 2}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41, 42, 43, 44}, consumed));
  step_with(s, 40);
  s.set_drafts(1, {41, 99, 43});  // the grammar allows 41 next, then not 99: the drafts are cut there
  EXPECT_EQ(s.find(1)->draft_token_ids, (std::vector<int32_t>{41}));
  EXPECT_EQ(consumed, (std::vector<int32_t>{40}));  // checking them consumed nothing
  SchedulePlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 1);
  // The draft is accepted and the row after it samples 42: the grammar takes both.
  auto updates = s.update(plan, std::vector<int32_t>{41, 42}, std::vector<int32_t>{2});
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{41, 42}));
  EXPECT_FALSE(updates[0].finished);
  EXPECT_EQ(consumed, (std::vector<int32_t>{40, 41, 42}));
  // Drafts through the grammar's end: the token completing it ends the request; what follows is not consumed.
  s.set_drafts(1, {43, 44});
  plan = s.schedule();
  EXPECT_EQ(plan.chunks[0].num_draft_tokens, 2);
  updates = s.update(plan, std::vector<int32_t>{43, 44, 7}, std::vector<int32_t>{3});
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].reason, FinishReason::kStop);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{43, 44}));
  EXPECT_EQ(consumed, (std::vector<int32_t>{40, 41, 42, 43, 44}));
  s.check_invariants();
}

TEST(GrammarScheduling, ARejectedCorrectionAfterAcceptedDraftsEndsTheRequestThere) {
  CacheManager cache(16, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64, .num_lookahead_tokens = 1}, cache);
  std::vector<int32_t> consumed;
  s.add(constrained_request(1, {40, 41, 42}, consumed));
  step_with(s, 40);
  s.set_drafts(1, {41});
  const SchedulePlan plan = s.schedule();
  // 98 would never pass its mask; say it did.
  const auto updates = s.update(plan, std::vector<int32_t>{41, 98}, std::vector<int32_t>{2});
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].reason, FinishReason::kError);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<int32_t>{41, 98}));
  EXPECT_NE(updates[0].error.find("the grammar rejected token 98"), std::string::npos) << updates[0].error;
}

TEST(GrammarScheduling, TheGrammarsAdvanceThroughTheInjectedParallelFor) {
  CacheManager cache(32, 4);
  Scheduler s({.max_num_batched_tokens = 64, .max_model_len = 64}, cache);
  size_t calls = 0, bodies = 0;
  s.set_parallel_for([&](size_t n, const std::function<void(size_t)>& body) {
    ++calls;
    for (size_t i = n; i-- > 0;) {  // any order
      body(i);
      ++bodies;
    }
  });
  std::vector<int32_t> consumed_a, consumed_b, consumed_c;
  s.add(constrained_request(1, {40, 41}, consumed_a));
  s.add(constrained_request(2, {50, 51}, consumed_b));
  s.add(constrained_request(3, {60}, consumed_c));
  SchedulePlan plan = s.schedule();
  ASSERT_EQ(plan.num_sampling_chunks(), 3);
  const std::vector<int32_t> first{40, 50, 99};  // the third request's grammar rejects 99
  auto updates = s.update(plan, first);
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(bodies, 3u);
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_FALSE(updates[0].finished);
  EXPECT_FALSE(updates[1].finished);
  EXPECT_EQ(updates[2].reason, FinishReason::kError);
  plan = s.schedule();
  updates = s.update(plan, std::vector<int32_t>{41, kEos});  // request 2 stops at EOS: its grammar is not asked
  EXPECT_EQ(updates[0].reason, FinishReason::kStop);
  EXPECT_EQ(updates[1].reason, FinishReason::kStop);
  EXPECT_EQ(consumed_a, (std::vector<int32_t>{40, 41}));
  EXPECT_EQ(consumed_b, (std::vector<int32_t>{50}));
  EXPECT_EQ(consumed_c, (std::vector<int32_t>{99}));
  EXPECT_EQ(bodies, 3u);  // one grammar to advance in the second step: no parallel call
  EXPECT_EQ(cache.num_free_pages(), 32);
}

TEST(GrammarScheduling, TheSamplingRowPointsAtItsGrammarsMask) {
  std::vector<int32_t> consumed;
  auto free = std::make_unique<Request>();
  free->prompt_token_ids = {1, 2};
  free->params.max_tokens = 4;
  auto constrained = constrained_request(7, {40}, consumed);
  SamplingBatch batch;
  append_sampling_inputs(*free, 128, batch);
  append_sampling_inputs(*constrained, 128, batch);
  append_sampling_inputs(*free, 128, batch);
  ASSERT_EQ(batch.grammars.size(), 1u);
  EXPECT_EQ(batch.grammars[0].matcher, constrained->grammar.get());
  EXPECT_TRUE(batch.grammars[0].after.empty());
  std::vector<int32_t> allowed_rows;
  for (size_t r = 0; r < 3; ++r) {
    SamplingRow row;
    std::memcpy(static_cast<void*>(&row), batch.rows.data() + r * kSamplingRowWords, sizeof row);
    allowed_rows.push_back(row.allowed_row);
  }
  EXPECT_EQ(allowed_rows, (std::vector<int32_t>{-1, 0, -1}));
  // A verification row after a draft: its mask is the grammar's after the draft.
  const int32_t pending[] = {40};
  append_sampling_inputs(*constrained, 128, batch, pending);
  ASSERT_EQ(batch.grammars.size(), 2u);
  EXPECT_EQ(batch.grammars[1].matcher, constrained->grammar.get());
  EXPECT_EQ(std::vector<int32_t>(batch.grammars[1].after.begin(), batch.grammars[1].after.end()),
            (std::vector<int32_t>{40}));
}

}  // namespace
}  // namespace deepinfer
