// The grouped down kernel (prefill): y = act · W_down^T, 128 x 256 tiles on wgmma.
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_down(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_gemm<GemmKind::kDown>(kp, stream);  // bf16 or FP8 weights
}

}  // namespace deepinfer::cuda::moe_detail
