// The grouped down kernel (prefill): y = act · W_down^T, 128 x 256 tiles on wgmma; with FP8 activations, act
// quantized and the W8A8 kernel instead.
#include "backend/cuda/gemm/fp8_convert.cuh"
#include "backend/cuda/moe/moe_grouped_gemm.cuh"

namespace deepinfer::cuda::moe_detail {

void launch_grouped_down(const MoeKernelParams& kp, LaunchStream stream) {
  if (kp.p.weight_format == MoeWeightFormat::kInt4) {
    launch_grouped_int4_down(kp, stream);  // instantiations/moe_grouped_int4_down.cu
    return;
  }
  if (kp.p.weight_format == MoeWeightFormat::kFp4) {
    launch_grouped_fp4_down(kp, stream);  // instantiations/moe_grouped_fp4_down.cu
    return;
  }
  if (moe_grouped_w8a8_supported(kp.p)) {
    // Every pair's row, also those of pairs without one (held elsewhere under a shard): the kernel reads only rows
    // the gate/up kernel wrote.
    const int64_t pairs = static_cast<int64_t>(kp.p.num_tokens) * kp.p.top_k;
    quantize_fp8_activations(kp.act, /*x_f32=*/false, pairs, kp.p.inter, kp.act_codes, kp.act_scales, stream);
    launch_grouped_w8a8_down(kp, stream);
    return;
  }
  launch_grouped_gemm<GemmKind::kDown>(kp, stream);  // bf16 or FP8 (W8A16) weights
}

}  // namespace deepinfer::cuda::moe_detail
