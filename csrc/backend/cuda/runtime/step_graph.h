// A recorded step (Backend::capture): an instantiated CUDA graph replayed on the context's stream. It holds while the
// context's graph generation is the one it was recorded in: the generation moves on whenever memory a graph may have
// recorded (a workspace, the graph arena) is replaced, and replay() then refuses.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace deepinfer::cuda {

class CudaStepGraph final : public StepGraph {
 public:
  // Takes `exec`; `generation` is the context's, which outlives its graphs.
  CudaStepGraph(cudaGraphExec_t exec, cudaStream_t stream, const uint64_t& generation)
      : exec_(exec), stream_(stream), generation_(generation), recorded_in_(generation) {}
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }

  bool replay() override;

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const uint64_t& generation_;
  uint64_t recorded_in_;
};

}  // namespace deepinfer::cuda
