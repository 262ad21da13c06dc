#include "backend/cuda/memory/memory_ops.h"

#include "backend/cuda/memory/copy_strided.cuh"
#include "backend/cuda/memory/dummy_weights.cuh"
#include "backend/cuda/memory/embedding.cuh"
#include "backend/cuda/runtime/context.h"

namespace deepinfer::cuda {

void embedding(CudaContext& ctx, const EmbeddingArgs& a) {
  const auto timing = ctx.timed("embedding");
  a.validate();  // shapes and dtypes; the ids are device memory, checked on the host before their upload
  embedding(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

void gather_rows(CudaContext& ctx, const GatherRowsArgs& a) {
  const auto timing = ctx.timed("gather_rows");
  a.validate();
  gather_rows(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, accesses_of(a));
}

void copy_strided(CudaContext& ctx, const CopyStridedArgs& a) {
  const auto timing = ctx.timed("copy_strided");
  a.validate();
  copy_strided(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

void fill_dummy_normal(CudaContext& ctx, const TensorView& dst, const dummy_normal::StreamRange& range) {
  fill_dummy_normal(dst, range, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

void fill_dummy_normal_fp8(CudaContext& ctx, const TensorView& codes, const TensorView& scale_inv,
                           const dummy_normal::StreamRange& range) {
  fill_dummy_normal_fp8(codes, scale_inv, range, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
