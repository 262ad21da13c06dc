// The small-M down kernel (decode): y = act · W_down^T for each active expert's rows,
// bf16 or FP8 weights.
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_down(const MoeKernelParams& kp, LaunchStream stream) {
  launch_small_gemm_for_format<GemmKind::kDown>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
