// CUDA_TRY(call): throws deepinfer::Error carrying the file, the line, the call and the library's own message when a
// CUDA call returns an error status. Another library's status type (cuBLAS, NCCL) joins by adding the three
// overloads status_ok / status_name / status_text for it, next to the code that includes that library.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace deepinfer::detail {

inline bool status_ok(cudaError_t s) { return s == cudaSuccess; }
inline const char* status_name(cudaError_t s) { return cudaGetErrorName(s); }
inline const char* status_text(cudaError_t s) { return cudaGetErrorString(s); }

template <typename Status>
[[noreturn]] void throw_status(Status status, const char* file, int line, const char* call) {
  throw Error(str_cat(file, ":", line, ": ", call, " failed: ", status_name(status), " (", status_text(status), ")"));
}

template <typename Status>
inline void check_status(Status status, const char* file, int line, const char* call) {
  if (!status_ok(status)) [[unlikely]] {
    throw_status(status, file, line, call);
  }
}

}  // namespace deepinfer::detail

#define CUDA_TRY(call) ::deepinfer::detail::check_status((call), __FILE__, __LINE__, #call)
