// Multi-head Latent Attention on CUDA, over the paged latent cache (ops/mla.h; bfloat16, or FP8 rows of
// ops/latent_fp8.h where a kernel takes them): the cache write, the fused step between the projections and attention
// (mla_prepare), the absorbed decode and the decompressing prefill.
//
// How they run.
//   mla_cache_write  one kernel copies the step's latent rows to their slots, or quantizes them into an FP8 cache's
//                    rows (mla_cache_write.cu, latent_fp8_row.cuh).
//   mla_prepare      one kernel for kv_a_layernorm, both ropes, the cache write and the decode query's rope columns
//                    (mla_prepare.cu), instead of the five ops it stands for; into an FP8 cache as well.
//   mla_decode       flash-decoding (mla_decode.cuh): each sequence's context is cut into splits of 64-token tiles,
//                    a CTA takes a block of heads over one split (16 heads: mla_decode_narrow, 64: the wgmma kernel),
//                    and a combine kernel merges the splits' partials from the context's workspace. The split count is
//                    chosen once a call (mla_decode_num_splits, or CudaTuning::mla_decode_splits). Over the FP8
//                    cache (a kF8E4M3 cache tensor: backend/ops/latent_fp8.h) one kernel of 16 heads a CTA runs for
//                    every head count, widening the rows in its QK step (mla_decode_fp8_kernel.cuh). With the value
//                    projection (MlaDecodeArgs::w_uv), W_UV follows on head_linear's kernels; for one sequence its
//                    per-head GEMV combines the partials as it reads them, and the combine kernel is skipped.
//   mla_prefill      the sequences' latent rows are gathered from the cache into a bf16 workspace (FP8 rows widened
//                    on the way), decompressed by one cuBLAS GEMM with kv_b_proj into per-head k_nope | v, then a
//                    causal flash-attention kernel (mla_prefill.cuh: wgmma by default, mma.sync with
//                    CudaTuning::mla_prefill_kernel) reads them.
// Nothing reads device memory on the host: workspaces are sized from host-side bounds (batch, heads, longest context),
// so every op can be recorded in a graph.
#pragma once

#include "backend/ops/mla.h"

namespace deepinfer::cuda {

class CudaContext;

void mla_cache_write(CudaContext& ctx, const MlaCacheWriteArgs& a);
void mla_prepare(CudaContext& ctx, const MlaPrepareArgs& a);
void mla_decode(CudaContext& ctx, const MlaDecodeArgs& a);
void mla_prefill(CudaContext& ctx, const MlaPrefillArgs& a);

}  // namespace deepinfer::cuda
