#include "backend/cuda/runtime/device_buffer.h"

#include <utility>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
  if (bytes > 0) CUDA_TRY(cudaMallocAsync(&data_, bytes, stream));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  // A destructor cannot report a failure; after a fault the context is lost anyway.
  if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace deepinfer::cuda
