#include "backend/cuda/rope/rope_ops.h"

#include "backend/cuda/rope/rope.cuh"
#include "backend/cuda/runtime/context.h"

namespace deepinfer::cuda {

void rope(CudaContext& ctx, const RopeArgs& a) {
  const auto timing = ctx.timed("rope");
  a.validate();
  DI_CHECK(a.device == Device::kCuda, "cuda rope: x, positions and inv_freq must be in device memory");
  if (a.num_tokens() == 0 || a.num_heads == 0 || a.rot_dim == 0) return;
  rope({.x = a.x, .positions = a.positions.as<int32_t>(), .inv_freq = a.inv_freq.as<float>(),
        .num_tokens = a.num_tokens(), .num_heads = a.num_heads, .rot_dim = a.rot_dim,
        .token_stride = a.token_stride, .head_stride = a.head_stride, .attention_scaling = a.attention_scaling,
        .interleaved = a.interleaved},
       a.dtype, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
