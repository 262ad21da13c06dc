// Where a kernel launcher queues its kernels: a stream, and whether as programmatic dependents of the work before them
// (launch.h). The CUDA context passes its stream with its tuning's PDL switch (CudaContext::launch); a test or a kernel
// benchmark with a stream of its own passes {stream}, PDL on.
#pragma once

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

struct LaunchStream {
  cudaStream_t handle = nullptr;
  bool pdl = true;  // CudaTuning::pdl: false launches plainly (griddepcontrol then does nothing)
};

}  // namespace deepinfer::cuda
