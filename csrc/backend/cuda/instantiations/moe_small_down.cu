// The small-M down kernel (decode): y = act · W_down^T for each active expert's rows.
#include "backend/cuda/moe_small_gemm.cuh"
#include "backend/cuda/moe_stream_gemm.cuh"
#include "core/env_flag.h"

namespace deepinfer::cuda::moe_detail {

void launch_small_down(const MoeKernelParams& kp, cudaStream_t stream) {
  static const bool registers = env_flag("DEEPINFER_MOE_SMALL_REGISTERS");
  static const bool late = env_flag("DEEPINFER_MOE_DOWN_LATE");
  if (registers) {
    if (kp.p.num_tokens <= 8) {
      launch_small_gemm<SmallTraits<GemmKind::kDown, 1>>(kp, stream);
    } else {
      launch_small_gemm<SmallTraits<GemmKind::kDown, 4>>(kp, stream);
    }
    return;
  }
  if (kp.p.num_tokens <= 8) {
    launch_stream_gemm<StreamTraits<GemmKind::kDown, 1>>(kp, stream, !late);
  } else {
    launch_stream_gemm<StreamTraits<GemmKind::kDown, 4>>(kp, stream, !late);
  }
}

}  // namespace deepinfer::cuda::moe_detail
