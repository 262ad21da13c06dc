// Fused MoE for Hopper (sm_90a): routing, token -> expert alignment, grouped SwiGLU experts and the weighted combine,
// all on the device with no host synchronization and no host loop over experts.
//
// Kernels, in stream order (each a programmatic dependent launch of the one before):
//   1. route     (with the router weight: first the logits, one expert row a warp, the last CTA routes)
//                one warp a token: scores, group limit, top-k, weights, then the shared experts (weight 1) after the
//                routed ones; per-block expert histograms; the last block
//                to finish scans the counts (CUB), pads each expert's row range to 128, lists the active experts and,
//                for small batches, also scatters the (token, slot) pairs into their rows
//   2. scatter   (larger batches) stable placement of each pair in its expert's rows: row_pair[row] = t * top_k + j
//   3. gate/up   act[pair] = silu(x[t] · W_gate[e]^T) * (x[t] · W_up[e]^T), bf16
//   4. down      y[pair] = act[pair] · W_down[e]^T, bf16
//   5. combine   out[t] = add[t] + sum_j weight[t, j] * y[t * top_k + j]: a gather in slot order, no atomics, so the
//                output is bitwise deterministic. Up to 32 tokens on the small-M path, the last down CTA of each column
//                block does it instead (one kernel less on the decode path).
// Steps 3-4 run either the small-M kernels (each active expert's weights streamed once, split-K, mma.sync with the
// weight rows as M) or the grouped kernels (128 x 256 tiles, warpgroup MMA, one persistent CTA per SM walking the
// (expert row block, column block) tiles).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "backend/cuda/moe/moe_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// Bytes of workspace the calls below need for `p` (a workspace sized for more tokens serves fewer).
size_t moe_workspace_bytes(const MoeParams& p);

// Zeroes the workspace's completion counter and count accumulators; once per workspace (every call leaves them zero).
void moe_workspace_init(const MoeParams& p, cudaStream_t stream);

// The expert kernels `moe_experts(p, ...)` runs.
MoeExpertsPath moe_resolve_path(const MoeParams& p);

// Whether the route kernel can compute the router logits itself (MoeParams::router_weight): every token's x fits its
// shared memory and a lane holds its share of a router row in registers.
bool moe_fused_router_supported(int64_t num_tokens, int64_t hidden);

// Routing (when p.router_logits is set) and the alignment into the workspace. Throws deepinfer::Error on bad
// parameters; queues kernels on `stream`.
void moe_route_align(const MoeParams& p, LaunchStream stream);

// Expert GEMMs and the combine into p.out, reading the alignment moe_route_align left in the workspace.
void moe_experts(const MoeParams& p, LaunchStream stream);

// moe_route_align, then moe_experts.
void moe_forward(const MoeParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
