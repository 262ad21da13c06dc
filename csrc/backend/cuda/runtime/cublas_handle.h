// A move-only cuBLAS handle bound to one stream, with a workspace it owns (so cuBLAS never allocates during a call
// or a graph capture). CUDA_TRY accepts cublasStatus_t through the overloads below. Only with cuBLAS in the toolkit
// (DEEPINFER_HAVE_CUBLAS); a compile-only build without it has no handle and no GEMMs.
#pragma once

#ifdef DEEPINFER_HAVE_CUBLAS

#include <cstddef>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/device_buffer.h"

namespace deepinfer::detail {

inline bool status_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline const char* status_name(cublasStatus_t s) { return cublasGetStatusName(s); }
inline const char* status_text(cublasStatus_t s) { return cublasGetStatusString(s); }

}  // namespace deepinfer::detail

namespace deepinfer::cuda {

class CublasHandle {
 public:
  // Hopper wants 32 MiB of workspace for its best GEMM kernels.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // On the current device; every call through the handle runs on `stream`, which must outlive the handle.
  explicit CublasHandle(cudaStream_t stream, size_t workspace_bytes = kDefaultWorkspaceBytes);
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }

 private:
  void reset() noexcept;
  DeviceBuffer workspace_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace deepinfer::cuda

#endif  // DEEPINFER_HAVE_CUBLAS
