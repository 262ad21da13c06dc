#include "backend/cuda/elementwise/elementwise_ops.h"

#include "backend/cuda/elementwise/elementwise.cuh"
#include "backend/cuda/runtime/context.h"

namespace deepinfer::cuda {

void add(CudaContext& ctx, const AddArgs& a) {
  const auto timing = ctx.timed("add");
  a.validate();
  add(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, accesses_of(a));
}

void silu_mul(CudaContext& ctx, const SiluMulArgs& a) {
  const auto timing = ctx.timed("silu_mul");
  a.validate();
  silu_mul(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
