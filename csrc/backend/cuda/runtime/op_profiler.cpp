#include "backend/cuda/runtime/op_profiler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

OpProfiler::~OpProfiler() {
  if (!enabled_) return;
  cudaStreamSynchronize(stream_);
  collect();
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0.0;
  for (const auto& r : rows) all += r.second.ms;
  std::fprintf(stderr, "\nGPU time per op (DEEPINFER_PROFILE_OPS), %.3f ms in all\n", all);
  std::fprintf(stderr, "%-44s %10s %12s %10s %7s\n", "op", "calls", "total ms", "us/call", "share");
  for (const auto& [label, t] : rows) {
    std::fprintf(stderr, "%-44s %10lld %12.3f %10.2f %6.1f%%\n", label.c_str(), static_cast<long long>(t.calls), t.ms,
                 1000.0 * t.ms / static_cast<double>(std::max<int64_t>(t.calls, 1)),
                 100.0 * t.ms / std::max(all, 1e-9));
  }
  for (const Pending& p : pending_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_TRY(cudaEventCreate(&e));
  return e;
}

void OpProfiler::collect() {
  for (Pending& p : pending_) {
    float ms = 0.0f;
    if (p.stop != nullptr && cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
      Total& t = totals_[p.label];
      t.ms += ms;
      t.calls += 1;
    }
    free_events_.push_back(p.start);
    if (p.stop != nullptr) free_events_.push_back(p.stop);
  }
  pending_.clear();
}

OpProfiler::Scope::Scope(OpProfiler* profiler, std::string label) : profiler_(profiler) {
  if (profiler_ == nullptr) return;
  index_ = profiler_->pending_.size();
  profiler_->pending_.push_back({std::move(label), profiler_->event(), nullptr});
  cudaEventRecord(profiler_->pending_.back().start, profiler_->stream_);
}

OpProfiler::Scope::~Scope() {
  if (profiler_ == nullptr) return;
  Pending& p = profiler_->pending_[index_];
  p.stop = profiler_->event();
  cudaEventRecord(p.stop, profiler_->stream_);
}

}  // namespace deepinfer::cuda
