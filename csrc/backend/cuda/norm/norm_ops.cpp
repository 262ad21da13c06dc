#include "backend/cuda/norm/norm_ops.h"

#include "backend/cuda/norm/norm_residual.cuh"
#include "backend/cuda/norm/rms_norm.cuh"
#include "backend/cuda/runtime/context.h"

namespace deepinfer::cuda {

void rms_norm(CudaContext& ctx, const RmsNormArgs& a) {
  const auto timing = ctx.timed("rms_norm");
  a.validate();
  if (a.x.dtype == DType::kF32) {
    rms_norm_f32(a, ctx.launch());
  } else {
    rms_norm(a, ctx.launch());
  }
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

void add_rms_norm(CudaContext& ctx, const AddRmsNormArgs& a) {
  const auto timing = ctx.timed("add_rms_norm");
  a.validate();
  const Trigger trigger = ctx.ledger().trigger(OpKind::kAddRmsNorm);
  add_rms_norm(a, trigger == Trigger::kAtStart, ctx.launch());
  ctx.ledger().launched(trigger, OpAccesses::any());
}

}  // namespace deepinfer::cuda
