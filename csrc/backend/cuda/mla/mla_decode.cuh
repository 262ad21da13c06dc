// MLA decode (absorbed form) over the paged bf16 latent cache, for Hopper (sm_90a).
//
// Flash-decoding: each sequence's context is cut into `num_splits` ranges of 64-token tiles; one CTA handles a block
// of heads over one range (every tile it loads is shared by all heads of the block), and writes either the final
// output (one split) or an fp32 partial output plus its log-sum-exp into the workspace, which a combine kernel
// merges. No allocation, no host synchronization: the split count depends only on host-side values.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "backend/cuda/mla/mla_decode_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// The split count the launcher uses for `p` (p.num_splits if set, else a heuristic over batch, heads,
// max_context_len and num_sms, or p.forced_splits where the heuristic would choose).
int mla_decode_num_splits(const MlaDecodeParams& p);

// Bytes of workspace `mla_decode(p, ...)` needs; 0 when it runs without splits.
size_t mla_decode_workspace_bytes(const MlaDecodeParams& p);

// Checks the parameters (throws deepinfer::Error) and queues the kernels on `stream`.
void mla_decode(const MlaDecodeParams& p, LaunchStream stream);

}  // namespace deepinfer::cuda
