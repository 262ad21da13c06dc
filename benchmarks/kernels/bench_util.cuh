// Timing and reporting helpers shared by the kernel microbenchmarks: CUDA event pairs, the median of timed
// repetitions (each after an untimed L2 flush), and the bits of JSON the result files need.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/runtime/cuda_check.h"

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

// Reads a buffer larger than L2 without writing it: evicts the timed kernel's data and leaves only clean lines, so no
// write-back of the flush itself lands inside the timed region (a memset flush would leave ~50 MB dirty).
__global__ inline void read_flush(const int4* data, int64_t n, int* sink) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcg(data + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0x7fffffff) *sink = 1;  // keeps the loads; practically never true
}

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
