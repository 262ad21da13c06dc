// The grouped gate/up kernel (prefill): act = silu(x · W_gate^T) * (x · W_up^T), 128 x (128 + 128) tiles on wgmma;
// with FP8 activations, x quantized and the W8A8 kernel instead.
#include "backend/cuda/gemm/fp8_convert.cuh"
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_gate_up(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kInt4) {
    launch_grouped_int4_gate_up(kp, stream);  // instantiations/moe_grouped_int4_gate_up.cu
    return;
  }
  if (kp.p.weight_format == MoeWeightFormat::kFp4) {
    launch_grouped_fp4_gate_up(kp, stream);  // instantiations/moe_grouped_fp4_gate_up.cu
    return;
  }
  if (moe_grouped_w8a8_supported(kp.p)) {
    quantize_fp8_activations(kp.p.x, /*x_f32=*/false, kp.p.num_tokens, kp.p.hidden, kp.x_codes, kp.x_scales, stream);
    launch_grouped_w8a8_gate_up(kp, stream);
    return;
  }
  launch_grouped_gemm<GemmKind::kGateUp>(kp, stream);  // bf16 or FP8 (W8A16) weights
}

}  // namespace deepinfer::cuda::moe_detail
