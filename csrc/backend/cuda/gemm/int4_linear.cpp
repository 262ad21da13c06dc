#include "backend/cuda/gemm/int4_linear.h"

#include "backend/cuda/gemm/dequantized_linear.h"
#include "backend/cuda/gemm/int4_dequant.cuh"
#include "backend/cuda/runtime/context.h"
#include "core/error.h"

namespace deepinfer::cuda {

void int4_linear_prefill(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                         bool accumulate) {
  DI_CHECK(w.is_packed4() && w.shape.ndim() == 2, "int4_linear_prefill: w is ", dtype_name(w.dtype), " ",
           w.shape.str(), ", not a 2-D packed 4-bit (INT4 or FP4) weight");
  const int64_t k = w.shape[1], group = w.group_size();
  const auto* words = static_cast<const uint32_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scale_inv.data);
  const auto* zeros = static_cast<const int32_t*>(w.zeros.data);
  dequantized_linear(ctx, x, w.shape[0], out, accumulate, 16, [&](int64_t first_row, int64_t rows, void* buffer, bool f32) {
    dequantize_int4_rows(words, scales, zeros, first_row, rows, k, group, buffer, f32, ctx.launch(), w.is_fp4());
    ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
  });
}

}  // namespace deepinfer::cuda
