// The grouped down kernel (prefill) with INT4 weights (W4A16): y = act · W_down^T, 128 x 256 tiles on wgmma, the
// weights dequantized to bf16 in shared memory (moe_grouped_gemm.cuh).
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_int4_down(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_gemm_of<GroupedTraits<GemmKind::kDown, MoeWeightFormat::kInt4>>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
