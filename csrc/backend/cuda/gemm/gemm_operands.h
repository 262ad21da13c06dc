// What the GEMM entry points share: the operand checks, and cuBLAS's int sizes and element types.
#pragma once

#include <climits>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "core/weight.h"

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

// The dense projections' operands: a bf16/fp32 weight as above, or a block-scaled FP8 one (core/weight.h) against
// bf16 or float32 activations, its scales float32 in device memory.
inline void check_gemm_operands(const ConstTensorView& x, const WeightView& w, const ConstTensorView& out,
                                const char* op) {
  if (w.is_packed4()) {
    // The scales' and zero points' shapes are the op's validate() (ops_validate.cpp).
    DI_CHECK((x.dtype == DType::kBF16 || x.dtype == DType::kF32) && (out.dtype == x.dtype || out.dtype == DType::kF32),
             op, ": with a packed 4-bit weight x must be bfloat16 or float32 and out x's dtype or float32, got ",
             dtype_name(x.dtype), " and ", dtype_name(out.dtype));
    DI_CHECK(x.device == Device::kCuda && w.device == Device::kCuda && w.scale_inv.device == Device::kCuda &&
                 (w.symmetric() || w.zeros.device == Device::kCuda) && out.device == Device::kCuda,
             op, ": x, w, its scales and zero points and out must be in device memory");
    return;
  }
  if (!w.is_fp8()) {
    check_gemm_operands(x, static_cast<const ConstTensorView&>(w), out, op);
    return;
  }
  DI_CHECK((x.dtype == DType::kBF16 || x.dtype == DType::kF32) && (out.dtype == x.dtype || out.dtype == DType::kF32),
           op, ": with an FP8 weight x must be bfloat16 or float32 and out x's dtype or float32, got ",
           dtype_name(x.dtype), " and ", dtype_name(out.dtype));
  DI_CHECK(w.scale_inv.dtype == DType::kF32 && w.scale_inv.shape == fp8_scale_shape(w.shape), op,
           ": an FP8 weight ", w.shape.str(), " needs float32 scales ", fp8_scale_shape(w.shape).str(), ", got ",
           dtype_name(w.scale_inv.dtype), " ", w.scale_inv.shape.str());
  DI_CHECK(x.device == Device::kCuda && w.device == Device::kCuda && w.scale_inv.device == Device::kCuda &&
               out.device == Device::kCuda,
           op, ": x, w, its scales and out must be in device memory");
}

#ifdef DEEPINFER_HAVE_CUBLAS
inline int gemm_int(int64_t v, const char* op, const char* what) {
  DI_CHECK(v <= INT_MAX, op, ": ", what, " ", v, " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

inline cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }
#endif

}  // namespace deepinfer::cuda
