// Element types the engine stores or reads from checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace deepinfer {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn (no infinities; 0x7f / 0xff are NaN)
  kI32,
  kI64,
  // 4-bit integer weights (core/weight.h): only the logical view of a packed INT4 weight has it. Its elements have no
  // byte size of their own (dtype_size is 0), so no tensor is allocated, sliced or copied as kU4.
  kU4,
  // 4-bit float weights (e2m1: a sign, 2 exponent and 1 mantissa bit), packed as kU4 is: only the logical view of a
  // packed FP4 weight has it.
  kE2M1,
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU4: return 0;
    case DType::kE2M1: return 0;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU4: return "int4";
    case DType::kE2M1: return "fp4_e2m1";
  }
  return "unknown";
}

}  // namespace deepinfer
