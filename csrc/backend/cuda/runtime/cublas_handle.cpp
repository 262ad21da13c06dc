#include "backend/cuda/runtime/cublas_handle.h"

#ifdef DEEPINFER_HAVE_CUBLAS

#include <utility>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

CublasHandle::CublasHandle(cudaStream_t stream, size_t workspace_bytes) : workspace_(workspace_bytes, stream) {
  CUDA_TRY(cublasCreate(&handle_));
  try {
    // cublasSetStream resets the workspace to cuBLAS's own pool, so the stream comes first.
    CUDA_TRY(cublasSetStream(handle_, stream));
    CUDA_TRY(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
    CUDA_TRY(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST));
  } catch (...) {
    reset();
    throw;
  }
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : workspace_(std::move(other.workspace_)), handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    reset();
    workspace_ = std::move(other.workspace_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() { reset(); }

void CublasHandle::reset() noexcept {
  // A destructor cannot report a failure; after a fault the context is lost anyway.
  if (handle_ != nullptr) cublasDestroy(handle_);
  handle_ = nullptr;
}

}  // namespace deepinfer::cuda

#endif  // DEEPINFER_HAVE_CUBLAS
