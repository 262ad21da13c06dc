// GPU time per op, for finding where a step's time goes: with CudaTuning::profile_ops (DEEPINFER_PROFILE_OPS=1) the
// CUDA context brackets every op it queues with CUDA events (never while recording a graph: CudaContext::timed), and
// prints a table of the totals per op label to stderr when it is destroyed. Off, it costs one branch per op.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

class OpProfiler {
 public:
  OpProfiler(cudaStream_t stream, bool enabled) : stream_(stream), enabled_(enabled) {}
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }

  // Brackets the work queued between its construction and its destruction.
  class Scope {
   public:
    Scope(OpProfiler* profiler, std::string label);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler* profiler_;
    size_t index_ = 0;
  };
  // A scope that records nothing when the profiler is off or `active` is false.
  Scope scope(bool active, const char* label) { return Scope(enabled_ && active ? this : nullptr, label); }
  Scope scope(bool active, std::string label) { return Scope(enabled_ && active ? this : nullptr, std::move(label)); }

  // Reads the elapsed times of finished pairs (call after a stream synchronization).
  void collect();

 private:
  struct Pending {
    std::string label;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
  };
  struct Total {
    double ms = 0.0;
    int64_t calls = 0;
  };
  cudaEvent_t event();

  cudaStream_t stream_;
  bool enabled_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::string, Total> totals_;
};

}  // namespace deepinfer::cuda
