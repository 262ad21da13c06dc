#include "backend/cuda/runtime/step_graph.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

bool CudaStepGraph::replay() {
  if (generation_ != recorded_in_) return false;
  CUDA_TRY(cudaGraphLaunch(exec_, stream_));
  ledger_.unknown_work();
  return true;
}

}  // namespace deepinfer::cuda
