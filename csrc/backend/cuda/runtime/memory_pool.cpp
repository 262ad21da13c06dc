#include "backend/cuda/runtime/memory_pool.h"

#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

MemoryPool::MemoryPool() {
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  CUDA_TRY(cudaMemPoolCreate(&pool_, &props));
  uint64_t threshold = UINT64_MAX;
  const cudaError_t status = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (status != cudaSuccess) {
    cudaMemPoolDestroy(pool_);
    CUDA_TRY(status);
  }
}

}  // namespace deepinfer::cuda
