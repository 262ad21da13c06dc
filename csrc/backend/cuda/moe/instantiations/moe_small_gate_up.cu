// The small-M gate/up kernel (decode): act = silu(x · W_gate^T) * (x · W_up^T) for each active expert's rows.
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  // Up to 8 tokens no expert has more than 8 rows (one pass of one token tile); beyond, 32 rows a pass.
  if (kp.p.num_tokens <= 8) {
    launch_small_gemm_in_fewest_waves<GemmKind::kGateUp, 1>(kp, stream);
  } else {
    launch_small_gemm<SmallTraits<GemmKind::kGateUp, 4>>(kp, stream);
  }
}

}  // namespace deepinfer::cuda::moe_detail
