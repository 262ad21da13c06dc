// Data movement between views of one device: row gathers and strided 2-D copies. Any element type; values are
// copied bit for bit.
#pragma once

#include "core/tensor.h"

namespace deepinfer {

// out[i] = src[indices[i]] for every i: the rows of the tokens that sample, out of the last hidden states.
struct GatherRowsArgs {
  ConstTensorView src;      // [N, D]
  ConstTensorView indices;  // [M] int32, each in [0, N)
  TensorView out;           // [M, D]
  void validate() const;
};

// dst[r, :] = src[r, :] for R rows of C elements, each side's rows `*_row_stride` elements apart (0 = C): copies
// a column block of one row-major tensor into a column block of another (views from TensorView::columns), like
// the rotated q_pe into the decode query [T * H, kv_lora_rank + rope]. src and dst must not overlap.
struct CopyStridedArgs {
  ConstTensorView src;         // [R, C]
  TensorView dst;              // [R, C]
  int64_t src_row_stride = 0;  // elements
  int64_t dst_row_stride = 0;  // elements
  void validate() const;
};

}  // namespace deepinfer
