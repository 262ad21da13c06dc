// The narrow MLA decode kernel (16 heads per CTA) over the bf16 cache: V2-Lite's 16 heads, and any head count that is
// a multiple of 16 but not of 64.
#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_narrow(const MlaDecodeParams& p, LaunchStream stream) {
  using Qk = NarrowBf16Qk;
  launch_decode_kernel<NarrowTraits>(mla_decode_narrow_kernel<NarrowTraits, Qk>, NarrowSmem<NarrowTraits, Qk>::kBytes,
                                     p, stream);
}

}  // namespace deepinfer::cuda::mla_detail
