// The grouped gate/up kernel (prefill) with FP4 weights (weight-only NVFP4 / MXFP4): 128 x 256 tiles on wgmma, the
// weights' e2m1 values times their group scales rounded to bf16 in shared memory (moe_grouped_gemm.cuh).
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_fp4_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_gemm_of<GroupedTraits<GemmKind::kGateUp, MoeWeightFormat::kFp4>>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
