// The small-M gate/up kernel (decode) with INT4 weights (W4A16): act = silu(x · W_gate^T) * (x · W_up^T) for each
// active expert's rows, the codes' q - z formed in registers and each row's group scale applied to the fp32 partial
// sums (moe_small_gemm.cuh).
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_int4_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_small_gemm_for_tokens<GemmKind::kGateUp, MoeWeightFormat::kInt4>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
