// The narrow MLA decode kernel (16 heads per CTA): V2-Lite's 16 heads, and any head count that is a multiple of 16
// but not of 64.
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_narrow(const MlaDecodeParams& p, LaunchStream stream) {
  using T = NarrowTraits;
  constexpr int kSmemBytes = NarrowSmem<T>::kBytes;
  const auto kernel = mla_decode_narrow_kernel<T>;
  CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid(p.num_heads / T::kHeads, p.num_splits, p.batch);
  launch_pdl(kernel, {.grid = grid, .block = dim3(kThreads), .smem_bytes = kSmemBytes}, stream, p);
}

}  // namespace deepinfer::cuda::mla_detail
