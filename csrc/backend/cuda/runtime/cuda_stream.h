// A move-only CUDA stream. Non-blocking: it does not synchronize with the legacy default stream.
#pragma once

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

class CudaStream {
 public:
  CudaStream();  // on the current device
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  // Waits for all work queued on the stream; throws on an error reported by that work.
  void synchronize() const;

 private:
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
};

}  // namespace deepinfer::cuda
