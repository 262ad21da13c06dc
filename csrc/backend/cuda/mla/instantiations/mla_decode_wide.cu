// The wide MLA decode kernel (64 heads per CTA): V3's 128 heads run as two head blocks.
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_wide(const MlaDecodeParams& p, LaunchStream stream) {
  using T = WideTraits;
  constexpr int kSmemBytes = WideSmem<T>::kBytes;
  const auto kernel = mla_decode_wide_kernel<T>;
  CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // Head blocks vary fastest, so the CTAs that read the same tiles run side by side and share them through L2.
  const dim3 grid(p.num_heads / T::kHeads, p.num_splits, p.batch);
  launch_pdl(kernel, {.grid = grid, .block = dim3(kThreads), .smem_bytes = kSmemBytes}, stream, p);
}

}  // namespace deepinfer::cuda::mla_detail
