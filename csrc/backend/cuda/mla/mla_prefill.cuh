// MLA prefill (and chunked prefill over a cached prefix) for Hopper (sm_90a), in the decompressing form: each prefill
// sequence's latent rows are gathered out of the paged cache into a contiguous workspace, one GEMM with kv_b_proj
// (cuBLAS, in mla_prefill_op.cpp) decompresses them into per-head k_nope | v, and a flash-attention kernel runs the causal
// attention (one CTA per sequence, head and 64-query tile; 64-key tiles streamed through shared memory with cp.async;
// online softmax in fp32; mma.sync for Q·K^T and P·V; no score matrix in memory). A Hopper variant of the attention
// kernel (mla_prefill_wgmma.cuh: warpgroup MMA, 128-query and 128-key tiles, P in registers) is chosen through
// MlaPrefillAttentionParams::kernel. No allocation, no host synchronization: the workspace is sized from host-side
// bounds (num_seqs * max_context_len rows).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/mla/mla_prefill_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// The dims the kernels take (DeepSeek V2/V3).
inline constexpr int64_t kMlaPrefillRank = 512;
inline constexpr int64_t kMlaPrefillRope = 64;
inline constexpr int64_t kMlaPrefillNope = 128;
inline constexpr int64_t kMlaPrefillV = 128;

// Checks the parameters (throws deepinfer::Error) and queues the gather on `stream`.
void mla_prefill_gather(const MlaPrefillGatherParams& p, LaunchStream stream);

// Checks the parameters (throws deepinfer::Error) and queues the attention kernel p.kernel names on `stream`.
void mla_prefill_attention(const MlaPrefillAttentionParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
