// Timing and reporting helpers shared by the kernel microbenchmarks: CUDA event pairs, the median of timed
// repetitions (each after an untimed L2 flush), and the bits of JSON the result files need.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace deepinfer::bench {

class EventPair {
 public:
  EventPair() {
    CUDA_TRY(cudaEventCreate(&start_));
    CUDA_TRY(cudaEventCreate(&stop_));
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }
  float ms() const {
    float t = 0.0f;
    CUDA_TRY(cudaEventElapsedTime(&t, start_, stop_));
    return t;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median milliseconds of `reps` runs of `fn`, each after `flush` (not timed), after `warmup` runs.
template <typename Fn, typename Flush>
double time_ms(cudaStream_t stream, int warmup, int reps, Fn fn, Flush flush) {
  std::vector<EventPair> events(static_cast<size_t>(reps));
  for (int i = 0; i < warmup; ++i) {
    flush();
    fn();
  }
  for (int i = 0; i < reps; ++i) {
    flush();
    CUDA_TRY(cudaEventRecord(events[i].start(), stream));
    fn();
    CUDA_TRY(cudaEventRecord(events[i].stop(), stream));
  }
  CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (auto& e : events) t.push_back(e.ms());
  return median(t);
}

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace deepinfer::bench
