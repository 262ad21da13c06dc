// The wide MLA decode kernel (64 heads per CTA): V3's 128 heads run as two head blocks.
#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

void launch_mla_decode_wide(const MlaDecodeParams& p, LaunchStream stream) {
  launch_decode_kernel<WideTraits>(mla_decode_wide_kernel<WideTraits>, WideSmem<WideTraits>::kBytes, p, stream);
}

}  // namespace deepinfer::cuda::mla_detail
