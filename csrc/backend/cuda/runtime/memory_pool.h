// A memory pool of the current device for stream-ordered allocations. Its release threshold is unlimited, so memory
// freed into it stays cached for the next allocation instead of going back to the driver at each synchronization:
// once the first steps have run, the model's per-step tensors cost no device allocation.
#pragma once

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

class MemoryPool {
 public:
  MemoryPool();  // on the current device
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;
  // Allocations still outstanding keep the pool's memory until they are freed.
  ~MemoryPool() { cudaMemPoolDestroy(pool_); }

  cudaMemPool_t get() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace deepinfer::cuda
