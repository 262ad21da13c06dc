// The small-M gate/up kernel (decode): act = silu(x · W_gate^T) * (x · W_up^T) for each active expert's rows,
// bf16 or FP8 weights (INT4: moe_small_int4_gate_up.cu; FP4: moe_small_fp4_gate_up.cu).
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kInt4) {
    launch_small_int4_gate_up(kp, stream);  // instantiations/moe_small_int4_gate_up.cu
    return;
  }
  if (kp.p.weight_format == MoeWeightFormat::kFp4) {
    launch_small_fp4_gate_up(kp, stream);  // instantiations/moe_small_fp4_gate_up.cu
    return;
  }
  launch_small_gemm_for_format<GemmKind::kGateUp>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
