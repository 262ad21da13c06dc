// The W8A8 grouped gate/up kernel (prefill with FP8 experts and FP8 activations): act = silu(x · W_gate^T) *
// (x · W_up^T) from e4m3 x codes, 128 x (64 + 64) tiles on FP8 wgmma.
#include "backend/cuda/moe/moe_grouped_w8a8.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_w8a8_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_w8a8<GemmKind::kGateUp>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
