// Between the MLA decode launcher (mla_decode.cu) and its kernel instantiations (instantiations/mla_decode_*.cu).
// Not part of the op's interface.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/mla/mla_decode_params.h"
#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda::mla_detail {

constexpr int kHeadDim = 576;      // kv_lora_rank + qk_rope_head_dim: one (widened) cache row, one query row
constexpr int kValueDim = 512;     // kv_lora_rank: the output row
constexpr int kBlockN = 64;        // tokens per tile loaded into shared memory
constexpr int kThreads = 256;      // threads per CTA of the attention kernels
constexpr int kNarrowHeads = 16;   // heads per CTA, narrow kernel
constexpr int kWideHeads = 64;     // heads per CTA, wide kernel
constexpr int kMaxSplits = 128;    // upper bound of the split heuristic
constexpr int kMaxForcedSplits = kMlaDecodeMaxSplits;  // upper bound of p.num_splits and p.forced_splits

// `p.num_splits` is resolved (>= 1) and the workspace is set when it is above 1. The first three read p.cache (bf16),
// the last p.cache_fp8.
void launch_mla_decode_narrow(const MlaDecodeParams& p, LaunchStream stream);
void launch_mla_decode_wide(const MlaDecodeParams& p, LaunchStream stream);
void launch_mla_decode_wide_wgmma(const MlaDecodeParams& p, LaunchStream stream);
void launch_mla_decode_narrow_fp8(const MlaDecodeParams& p, LaunchStream stream);  // p.cache_fp8

}  // namespace deepinfer::cuda::mla_detail
