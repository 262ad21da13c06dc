// The one summation rule of the communicators that sum on the host (in-process ranks, MPI).
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace deepinfer {

// out[i] = ((part_0[i] + part_1[i]) + part_2[i]) + ... for i in [0, count), in float32; bfloat16 values are widened
// exactly and the sum is rounded once. Summing in rank order gives every rank the same bits, those of one process
// adding the ranks' values in order. `dtype` is float32 or bfloat16; `out` may be one of the parts.
void sum_in_rank_order(std::span<const void* const> parts, int64_t count, DType dtype, void* out);

}  // namespace deepinfer
