// DeepSeekMoE on CUDA (ops/moe.h): routing (moe_route), the experts on given ids (moe_experts), and both with one
// alignment (moe), bfloat16 experts with hidden and intermediate sizes in multiples of 32; FP8 experts (128 x 128
// block scales) and INT4 experts (W4A16, core/weight.h: one group size for both weights, a multiple of 32 dividing
// both sizes) against bfloat16 x.
//
// How they run (moe.cuh has the kernels in stream order). The route kernel scores each token's experts, picks its
// top-k (greedy, group-limited or V3's noaux_tc), appends the shared experts with weight 1, and groups the (token,
// pair) rows by expert; with the router weight at decode sizes it computes the router logits first, itself. The
// expert kernels then run the SwiGLU FFN per active expert: the small-M kernels (each active expert's weights streamed
// once, split-K; one persistent launch for V3-sized decode) or the grouped kernels (128 x 256 warpgroup-MMA tiles,
// persistent over all experts), and a deterministic weighted combine in slot order. moe_experts takes the ids as an
// input and aligns them itself; moe aligns once, as it routes. The kernels' scratch (alignment, activations,
// per-pair outputs, a zeroed header of counters) is one of the context's workspaces, 256-byte aligned; the header is
// zeroed again whenever the buffer is new or its layout (experts, hidden) changes, and every call leaves it zero.
// Nothing reads device memory on the host, so every op can be recorded in a graph.
#pragma once

#include "backend/ops/moe.h"

namespace deepinfer::cuda {

class CudaContext;

void moe_route(CudaContext& ctx, const MoeRouteArgs& a);
void moe_experts(CudaContext& ctx, const MoeExpertsArgs& a);
void moe(CudaContext& ctx, const MoeArgs& a);

}  // namespace deepinfer::cuda
