// The W8A8 grouped down kernel (prefill with FP8 experts and FP8 activations): y = act · W_down^T from e4m3 act
// codes, 128 x 128 tiles on FP8 wgmma.
#include "backend/cuda/moe/moe_grouped_w8a8.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_w8a8_down(const MoeKernelParams& kp, LaunchStream stream) {
  launch_grouped_w8a8<GemmKind::kDown>(kp, stream);
}

}  // namespace deepinfer::cuda::moe_detail
