// The small-M down kernel (decode): y = act · W_down^T for each active expert's rows,
// bf16 or FP8 weights (INT4: moe_small_int4_down.cu; FP4: moe_small_fp4_down.cu).
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_down(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kInt4) {
    launch_small_int4_down(kp, stream);  // instantiations/moe_small_int4_down.cu
    return;
  }
  if (kp.p.weight_format == MoeWeightFormat::kFp4) {
    launch_small_fp4_down(kp, stream);  // instantiations/moe_small_fp4_down.cu
    return;
  }
  launch_small_gemm_for_format<GemmKind::kDown>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
