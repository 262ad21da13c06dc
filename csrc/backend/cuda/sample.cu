// PLACEHOLDER: replaced by the device sampling kernels.
#include "backend/cuda/sample.cuh"

#include "backend/backend.h"

namespace deepinfer::cuda {

void sample(const SampleArgs&, cudaStream_t) { throw UnsupportedOp("cuda sample: not implemented yet"); }

}  // namespace deepinfer::cuda
