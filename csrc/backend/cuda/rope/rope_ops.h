// Rotary position embedding on CUDA, in place, on float32 or bfloat16 elements in device memory (positions and
// inv_freq in device memory too).
//
// How it runs: one thread per (token, group of heads, pair) computes its pair's cos and sin once (precise sincosf:
// positions reach 10^5 radians) and rotates that pair in each head of its group (rope.cu; the math in
// rope_rotation.cuh, which mla_prepare's kernel shares). The entry point validates the arguments, builds the kernel's
// parameters (rope_params.h) and queues it on the context's stream.
#pragma once

#include "backend/ops/rope.h"

namespace deepinfer::cuda {

class CudaContext;

void rope(CudaContext& ctx, const RopeArgs& a);

}  // namespace deepinfer::cuda
