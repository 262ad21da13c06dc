#include "backend/cuda/runtime/device_info.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the caller, who falls back to the CPU
    return 0;
  }
  return count;
}

DeviceMemory device_memory(int device_index) {
  CUDA_TRY(cudaSetDevice(device_index));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {.free_bytes = static_cast<int64_t>(free_bytes), .total_bytes = static_cast<int64_t>(total_bytes)};
}

}  // namespace deepinfer::cuda
