// Argument checks the CUDA ops share (host side: shapes and devices only, never device memory).
#pragma once

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

// `t` is in device memory (or empty).
inline void check_on_device(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.device == Device::kCuda || t.numel() == 0, op, ": ", name, " must be in device memory");
}

}  // namespace deepinfer::cuda
