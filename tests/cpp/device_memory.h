// Device memory for the op test harness (op_test_harness.h): the tensors of a CUDA backend under test.
//
// The backend queues its ops on its own stream, which the test does not see, so every copy back to the host waits
// for the whole device first (fine in a test; the library never does this). Allocations are stream-ordered on the
// memory's own stream and freed when the memory goes away, after the device is idle.
#pragma once

#ifdef DEEPINFER_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "cuda_device_required.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {

using ::deepinfer::test::cuda_device_available;

class DeviceMemory final : public Memory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() override {
    cudaDeviceSynchronize();  // no kernel may still use the buffers freed below
    buffers_.clear();
    cudaStreamSynchronize(stream_.get());
  }

  Device device() const override { return Device::kCuda; }

  void* allocate(size_t bytes) override {
    buffers_.emplace_back(bytes == 0 ? 1 : bytes, stream_.get());
    CUDA_TRY(cudaStreamSynchronize(stream_.get()));  // usable from any stream once this returns
    return buffers_.back().data();
  }

  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    CUDA_TRY(cudaDeviceSynchronize());  // after every op queued before, on any stream
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
    CUDA_TRY(cudaStreamSynchronize(stream_.get()));  // the host source may go away after this returns
  }

  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_TRY(cudaStreamSynchronize(stream_.get()));
  }

 private:
  // Declared first, destroyed last: the buffers free themselves on it.
  cuda::CudaStream stream_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
