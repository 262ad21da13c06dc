#include "engine/request.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

const char* to_string(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting: return "waiting";
    case RequestStatus::kRunning: return "running";
    case RequestStatus::kFinished: return "finished";
  }
  return "unknown";
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

int32_t Request::token_at(int32_t i) const {
  DI_CHECK(i >= 0 && i < num_tokens(), "request ", id, ": token index ", i, " out of range [0, ", num_tokens(),
           ")");
  const int32_t num_prompt = num_prompt_tokens();
  return i < num_prompt ? prompt_token_ids[static_cast<size_t>(i)]
                        : output_token_ids[static_cast<size_t>(i - num_prompt)];
}

void Request::append_tokens(int32_t start, int32_t count, std::vector<int32_t>& out) const {
  DI_CHECK(start >= 0 && count >= 0 && start <= num_tokens() - count, "request ", id, ": tokens [", start, ", ",
           static_cast<int64_t>(start) + count, ") out of range [0, ", num_tokens(), ")");
  const int32_t num_prompt = num_prompt_tokens();
  const int32_t end = start + count;
  const int32_t prompt_end = std::min(end, num_prompt);
  if (start < prompt_end) {
    out.insert(out.end(), prompt_token_ids.begin() + start, prompt_token_ids.begin() + prompt_end);
  }
  const int32_t output_begin = std::max(start, num_prompt);
  if (output_begin < end) {
    out.insert(out.end(), output_token_ids.begin() + (output_begin - num_prompt),
               output_token_ids.begin() + (end - num_prompt));
  }
}

bool Request::is_eos(int32_t token) const {
  return !params.ignore_eos && std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

bool Request::is_stop_token(int32_t token) const {
  return std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
         params.stop_token_ids.end();
}

std::pair<int32_t, int32_t> Request::positions_to_score(int32_t start, int32_t count) const {
  if (!scores_prompt()) return {start, 0};
  const int32_t first = std::max(start, num_scored_positions);
  const int32_t end = std::min(start + count, num_prompt_tokens() - 1);
  return {first, std::max(0, end - first)};
}

}  // namespace deepinfer
