#include "backend/cuda/runtime/cuda_stream.h"

#include <utility>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

CudaStream::CudaStream() { CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

CudaStream::CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() { reset(); }

void CudaStream::synchronize() const { CUDA_TRY(cudaStreamSynchronize(stream_)); }

void CudaStream::reset() noexcept {
  // A destructor cannot report a failure; after a fault the context is lost anyway.
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

}  // namespace deepinfer::cuda
