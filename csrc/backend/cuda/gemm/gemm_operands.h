// What the GEMM entry points share: the operand checks, and cuBLAS's int sizes and element types.
#pragma once

#include <climits>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

#ifdef DEEPINFER_HAVE_CUBLAS
#include <library_types.h>
#endif

namespace deepinfer::cuda {

inline void check_gemm_operands(const ConstTensorView& x, const ConstTensorView& w, const ConstTensorView& out,
                                const char* op) {
  // out may be float32 from bfloat16 inputs: router and vocabulary logits keep full precision.
  DI_CHECK(x.dtype == w.dtype && (out.dtype == x.dtype || out.dtype == DType::kF32) &&
               (x.dtype == DType::kBF16 || x.dtype == DType::kF32),
           op, ": x and w must both be bfloat16 (or both float32) and out the same or float32, got ",
           dtype_name(x.dtype), ", ", dtype_name(w.dtype), " and ", dtype_name(out.dtype));
  DI_CHECK(x.device == Device::kCuda && w.device == Device::kCuda && out.device == Device::kCuda, op,
           ": x, w and out must be in device memory");
}

#ifdef DEEPINFER_HAVE_CUBLAS
inline int gemm_int(int64_t v, const char* op, const char* what) {
  DI_CHECK(v <= INT_MAX, op, ": ", what, " ", v, " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

inline cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }
#endif

}  // namespace deepinfer::cuda
