// The small-M gate/up kernel (decode): act = silu(x · W_gate^T) * (x · W_up^T) for each active expert's rows,
// bf16 or FP8 weights.
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_small_gemm_for_format<GemmKind::kGateUp>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
