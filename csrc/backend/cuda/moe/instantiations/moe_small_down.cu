// The small-M down kernel (decode): y = act · W_down^T for each active expert's rows.
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_small_down(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.num_tokens <= 8) {
    launch_small_gemm_in_fewest_waves<GemmKind::kDown, 1>(kp, stream);
  } else {
    launch_small_gemm<SmallTraits<GemmKind::kDown, 4>>(kp, stream);
  }
}

}  // namespace deepinfer::cuda::moe_detail
