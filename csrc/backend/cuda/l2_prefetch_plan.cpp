#include "backend/cuda/l2_prefetch_plan.h"

#include <cstdint>

namespace deepinfer::cuda {

L2PrefetchRegions plan_l2_prefetch(std::span<const ConstTensorView> tensors, int64_t budget_bytes, bool after_wait) {
  L2PrefetchRegions r{.after_wait = after_wait};
  int64_t left = budget_bytes;
  for (const ConstTensorView& t : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
    if (bytes == 0) continue;
    if (r.count == kL2PrefetchMaxRegions || bytes > left) break;
    if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(t.data) % 16 != 0) break;
    r.ptr[r.count] = t.data;
    r.bytes[r.count] = bytes;
    ++r.count;
    left -= bytes;
  }
  return r;
}

}  // namespace deepinfer::cuda
