// The MLA prefill attention kernel at DeepSeek's dims (q/k head 128 + 64, v head 128).
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/mla_prefill_kernels.cuh"

namespace deepinfer::cuda::mla_prefill_detail {

void launch_mla_prefill_attention(const MlaPrefillAttentionParams& p, LaunchStream stream) {
  using T = MlaPrefillTraits;
  const auto kernel = mla_prefill_attention_kernel<T>;
  const dim3 grid((p.max_queries + T::kBlockM - 1) / T::kBlockM, p.num_heads, p.num_seqs);
  launch_pdl_large_smem(kernel, {.grid = grid, .block = dim3(T::kThreads), .smem_bytes = T::kSmemBytes}, stream, p);
}

}  // namespace deepinfer::cuda::mla_prefill_detail
