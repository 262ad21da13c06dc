#include "parallel/rank_order_sum.h"

#include "core/error.h"
#include "core/half.h"

namespace deepinfer {

void sum_in_rank_order(std::span<const void* const> parts, int64_t count, DType dtype, void* out) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "sums in rank order: float32 or bfloat16 only, got ",
           dtype_name(dtype));
  DI_CHECK(!parts.empty(), "sums in rank order: no parts");
  const auto n = static_cast<int64_t>(parts.size());
  if (dtype == DType::kF32) {
    auto* y = static_cast<float*>(out);
#pragma omp parallel for if (count > (1 << 16))
    for (int64_t i = 0; i < count; ++i) {
      float sum = static_cast<const float*>(parts[0])[i];
      for (int64_t p = 1; p < n; ++p) sum += static_cast<const float*>(parts[static_cast<size_t>(p)])[i];
      y[i] = sum;
    }
  } else {
    auto* y = static_cast<uint16_t*>(out);
#pragma omp parallel for if (count > (1 << 16))
    for (int64_t i = 0; i < count; ++i) {
      float sum = bf16_to_float(static_cast<const uint16_t*>(parts[0])[i]);
      for (int64_t p = 1; p < n; ++p) {
        sum += bf16_to_float(static_cast<const uint16_t*>(parts[static_cast<size_t>(p)])[i]);
      }
      y[i] = float_to_bf16(sum);
    }
  }
}

}  // namespace deepinfer
