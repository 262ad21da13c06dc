// Dummy weights made on the GPU (load_format="dummy"; Backend::fill_dummy_normal): the values of core/dummy_normal.h,
// bit for bit those the host makes, written where the weights live. A benchmark's model of tens of GB is then made in
// well under a second instead of being generated, narrowed (or quantized) and copied by the host.
//
// How they run: a grid-stride loop, one value a thread a step, for float32 and bfloat16 tensors; for FP8 weights one
// CTA a 128 x 128 block: the block's amax (each thread's 64 values, then shared memory), then the codes, the values
// made again over amax / 448 rounded to e4m3 (saturating), as quantize_fp8_block_rows rounds them.
#pragma once

#include <cstdint>

#include "backend/cuda/runtime/launch_stream.h"
#include "core/dummy_normal.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

// dst[j] = dummy_normal::value_at(range, j); dst float32 or bfloat16 in device memory (contiguous).
void fill_dummy_normal(const TensorView& dst, const dummy_normal::StreamRange& range, LaunchStream stream);
// codes e4m3 [rows, cols] and scale_inv float32 [ceil(rows / 128), ceil(cols / 128)] in device memory: the values
// `range` places (its row_length = cols), quantized per 128 x 128 block (scale amax / 448).
void fill_dummy_normal_fp8(const TensorView& codes, const TensorView& scale_inv, const dummy_normal::StreamRange& range,
                           LaunchStream stream);

}  // namespace deepinfer::cuda
