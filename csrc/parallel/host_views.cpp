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

void sum_blocks_in_rank_order(const std::byte* blocks, int32_t num_blocks, int64_t count, DType dtype, void* out) {
  std::vector<const void*> parts(static_cast<size_t>(num_blocks));
  for (int32_t p = 0; p < num_blocks; ++p) {
    parts[static_cast<size_t>(p)] = blocks + static_cast<size_t>(p * count) * dtype_size(dtype);
  }
  sum_in_rank_order(parts, count, dtype, out);
}

}  // namespace deepinfer
