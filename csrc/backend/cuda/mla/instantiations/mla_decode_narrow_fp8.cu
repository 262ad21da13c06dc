// The MLA decode kernel over the FP8 latent cache (16 heads per CTA): every head count that is a multiple of 16.
#include "backend/cuda/mla/mla_decode_fp8_kernel.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_narrow_fp8(const MlaDecodeParams& p, LaunchStream stream) {
  using T = MlaDecodeFp8Traits;
  using Qk = NarrowFp8Qk;
  launch_decode_kernel<T>(mla_decode_narrow_kernel<T, Qk>, NarrowSmem<T, Qk>::kBytes, p, stream);
}

}  // namespace deepinfer::cuda::mla_detail
