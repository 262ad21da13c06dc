// The checks and row arithmetic shared by the communicators that move host (CPU backend) tensors between processes
// (MPI, gloo), and their rank-order sum of received blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace deepinfer {

// Elements per row: the product of the dimensions after the first.
int64_t row_elements(const Shape& shape);

// Whether a and b have the same dimensions after the first (the same rows, any number of them).
bool same_row_shape(const Shape& a, const Shape& b);

// Throws unless `view` is a float32 or bfloat16 host tensor with at least one dimension; the message starts with the
// transport ("mpi", "gloo") and names the collective and the argument.
void check_host_view(const ConstTensorView& view, const char* transport, const char* collective, const char* name);

// The checks of a collective's arguments, made alike on every rank before any message (so that a bad call throws on
// every rank and the group stays in step): host views of one dtype with the shapes the collective needs on `ranks`.
void check_all_gather(const char* transport, const ConstTensorView& in, const ConstTensorView& out, int32_t ranks);
void check_reduce_scatter(const char* transport, const ConstTensorView& in, const ConstTensorView& out,
                          int32_t ranks);
// Also: a count for each rank, none negative, adding up to the rows of `in` and of `out`.
void check_all_to_all(const char* transport, const ConstTensorView& in, std::span<const int64_t> send_rows,
                      const ConstTensorView& out, std::span<const int64_t> recv_rows, int32_t ranks);

// The rank-order sum (rank_order_sum.h) of `num_blocks` blocks of `count` elements laid one after another.
void sum_blocks_in_rank_order(const std::byte* blocks, int32_t num_blocks, int64_t count, DType dtype, void* out);

}  // namespace deepinfer
