// mla_cache_write and mla_prepare: one kernel each.
#include "backend/cuda/mla/mla_cache_write.cuh"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/cuda/mla/mla_prepare.cuh"
#include "backend/cuda/runtime/context.h"

namespace deepinfer::cuda {

void mla_cache_write(CudaContext& ctx, const MlaCacheWriteArgs& a) {
  const auto timing = ctx.timed("mla_cache_write");
  a.validate();  // shapes and dtypes; the slots are device memory, checked on the host before their upload
  mla_cache_write(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, accesses_of(a));
}

// One kernel for the norm, both ropes, the cache write and the decode query's rope columns (mla_prepare.cu).
void mla_prepare(CudaContext& ctx, const MlaPrepareArgs& a) {
  const auto timing = ctx.timed("mla_prepare");
  mla_prepare(a, ctx.launch());  // validates: shapes, dtypes, devices; the slots are device memory
  ctx.ledger().launched(Trigger::kAfterWait, accesses_of(a));
}

}  // namespace deepinfer::cuda
