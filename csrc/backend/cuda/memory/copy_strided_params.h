// Parameters of the strided 2-D copy: dst row r = src row r for `rows` rows of `row_bytes` bytes, each side's rows
// its own stride apart. Bytes are copied as they are, so any element type works.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct CopyStridedParams {
  const void* src = nullptr;     // [rows, row_bytes], rows src_stride_bytes apart
  void* dst = nullptr;           // [rows, row_bytes], rows dst_stride_bytes apart; no overlap with src
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t src_stride_bytes = 0;
  int64_t dst_stride_bytes = 0;
};

}  // namespace deepinfer::cuda
