// The small-M down kernel (decode) with INT4 weights (W4A16): y = act · W_down^T for each active expert's rows
// (moe_small_gemm.cuh).
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_int4_down(const MoeKernelParams& kp, LaunchStream stream) {
  launch_small_gemm_for_tokens<GemmKind::kDown, MoeWeightFormat::kInt4>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
