// The grouped gate/up kernel (prefill): act = silu(x · W_gate^T) * (x · W_up^T), 128 x (128 + 128) tiles on wgmma.
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_gemm<GemmKind::kGateUp>(kp, stream);  // bf16 or FP8 weights
}

}  // namespace deepinfer::cuda::moe_detail
