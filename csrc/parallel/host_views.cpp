#include "parallel/host_views.h"

#include <vector>

#include "parallel/rank_order_sum.h"

namespace deepinfer {

int64_t row_elements(const Shape& shape) {
  int64_t elements = 1;
  for (int d = 1; d < shape.ndim(); ++d) elements *= shape[d];
  return elements;
}

bool same_row_shape(const Shape& a, const Shape& b) {
  if (a.ndim() != b.ndim()) return false;
  for (int d = 1; d < a.ndim(); ++d) {
    if (a[d] != b[d]) return false;
  }
  return true;
}

void check_host_view(const ConstTensorView& view, const char* transport, const char* collective, const char* name) {
  DI_CHECK(view.device == Device::kCpu, transport, " ", collective, ": ", name, " is a ", device_name(view.device),
           " tensor; the ", transport, " communicator moves host (CPU backend) tensors");
  DI_CHECK(view.dtype == DType::kF32 || view.dtype == DType::kBF16, transport, " ", collective, ": ", name, " is ",
           dtype_name(view.dtype), "; only float32 and bfloat16 are supported");
  DI_CHECK(view.shape.ndim() >= 1, transport, " ", collective, ": ", name, " has no dimension");
}

namespace {

void check_pair(const char* transport, const char* collective, const ConstTensorView& in, const ConstTensorView& out) {
  check_host_view(in, transport, collective, "in");
  check_host_view(out, transport, collective, "out");
  DI_CHECK(in.dtype == out.dtype, transport, " ", collective, ": in is ", dtype_name(in.dtype), ", out ",
           dtype_name(out.dtype));
}

}  // namespace

void check_all_gather(const char* transport, const ConstTensorView& in, const ConstTensorView& out, int32_t ranks) {
  check_pair(transport, "all_gather", in, out);
  DI_CHECK(same_row_shape(in.shape, out.shape) && out.shape[0] == ranks * in.shape[0], transport, " all_gather: in ",
           in.shape.str(), " and out ", out.shape.str(), " on ", ranks, " ranks (out needs ranks x in's rows)");
}

void check_reduce_scatter(const char* transport, const ConstTensorView& in, const ConstTensorView& out,
                          int32_t ranks) {
  check_pair(transport, "reduce_scatter", in, out);
  DI_CHECK(same_row_shape(in.shape, out.shape) && in.shape[0] == ranks * out.shape[0], transport,
           " reduce_scatter: in ", in.shape.str(), " and out ", out.shape.str(), " on ", ranks,
           " ranks (in needs ranks x out's rows)");
}

void check_all_to_all(const char* transport, const ConstTensorView& in, std::span<const int64_t> send_rows,
                      const ConstTensorView& out, std::span<const int64_t> recv_rows, int32_t ranks) {
  check_pair(transport, "all_to_all", in, out);
  DI_CHECK(same_row_shape(in.shape, out.shape), transport, " all_to_all: rows of in ", in.shape.str(), " and out ",
           out.shape.str(), " differ");
  DI_CHECK(static_cast<int64_t>(send_rows.size()) == ranks && static_cast<int64_t>(recv_rows.size()) == ranks,
           transport, " all_to_all: ", send_rows.size(), " send and ", recv_rows.size(), " receive counts for ",
           ranks, " ranks");
  int64_t send_total = 0;
  int64_t recv_total = 0;
  for (int32_t p = 0; p < ranks; ++p) {
    DI_CHECK(send_rows[p] >= 0 && recv_rows[p] >= 0, transport, " all_to_all: negative row count for rank ", p);
    send_total += send_rows[p];
    recv_total += recv_rows[p];
  }
  DI_CHECK(send_total == in.shape[0] && recv_total == out.shape[0], transport, " all_to_all: ", send_total,
           " rows to send from in ", in.shape.str(), ", ", recv_total, " to receive into out ", out.shape.str());
}

void sum_blocks_in_rank_order(const std::byte* blocks, int32_t num_blocks, int64_t count, DType dtype, void* out) {
  std::vector<const void*> parts(static_cast<size_t>(num_blocks));
  for (int32_t p = 0; p < num_blocks; ++p) {
    parts[static_cast<size_t>(p)] = blocks + static_cast<size_t>(p * count) * dtype_size(dtype);
  }
  sum_in_rank_order(parts, count, dtype, out);
}

}  // namespace deepinfer
