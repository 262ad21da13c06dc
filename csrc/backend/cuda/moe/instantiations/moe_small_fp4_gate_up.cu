// The small-M gate/up kernel (decode) with FP4 weights (weight-only NVFP4 / MXFP4): each lane's e2m1 values
// times its word's group scale in registers, then the bf16 MMAs (moe_small_gemm.cuh).
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_fp4_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_small_gemm_for_tokens<GemmKind::kGateUp, MoeWeightFormat::kFp4>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
