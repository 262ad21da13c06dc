// The grouped gate/up kernel (prefill) with INT4 weights (W4A16): act = silu(x · W_gate^T) * (x · W_up^T),
// 128 x (128 + 128) tiles on wgmma, the weights dequantized to bf16 in shared memory (moe_grouped_gemm.cuh).
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_int4_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_gemm_of<GroupedTraits<GemmKind::kGateUp, MoeWeightFormat::kInt4>>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
