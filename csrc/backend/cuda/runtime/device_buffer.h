// Move-only device memory, stream-ordered: allocated with cudaMallocAsync from the device's memory pool (which
// caches freed blocks) and freed with cudaFreeAsync on the same stream, which must outlive the buffer.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, cudaStream_t stream);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  cudaStream_t stream() const { return stream_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace deepinfer::cuda
