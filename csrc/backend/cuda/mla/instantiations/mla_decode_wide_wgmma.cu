// The wgmma variant of the wide MLA decode kernel (64 heads per CTA): V3's 128 heads run as two head blocks.
#include "backend/cuda/mla/mla_decode_wgmma.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_wide_wgmma(const MlaDecodeParams& p, LaunchStream stream) {
  launch_decode_kernel<WideTraits>(mla_decode_wide_wgmma_kernel<WideTraits>, WgmmaSmem<WideTraits>::kBytes, p,
                                   stream);
}

}  // namespace deepinfer::cuda::mla_detail
