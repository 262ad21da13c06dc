// A recorded step (Backend::capture): an instantiated CUDA graph replayed on the context's stream. It holds while the
// context's graph generation is the one it was recorded in: the generation moves on whenever memory a graph may have
// recorded (a workspace, the graph arena) is replaced, and replay() then refuses.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/runtime/launch_ledger.h"

namespace deepinfer::cuda {

class CudaStepGraph final : public StepGraph {
 public:
  // Takes `exec`; `generation` and `ledger` are the context's, which outlives its graphs. A replay is work the ledger
  // does not see op by op: it records it as unknown.
  CudaStepGraph(cudaGraphExec_t exec, cudaStream_t stream, const uint64_t& generation, LaunchLedger& ledger)
      : exec_(exec), stream_(stream), generation_(generation), recorded_in_(generation), ledger_(ledger) {}
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }

  bool replay() override;

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const uint64_t& generation_;
  uint64_t recorded_in_;
  LaunchLedger& ledger_;
};

}  // namespace deepinfer::cuda
