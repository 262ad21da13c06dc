#include "engine/device_backend.h"

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/device_info.h"
#endif

namespace deepinfer {

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
#ifdef DEEPINFER_HAVE_CUDA
  DI_CHECK_ARG(cuda::device_count() > 0, "device 'cuda': no CUDA device is visible");
  return make_cuda_backend();
#else
  throw InvalidArgument("device 'cuda': this build has no CUDA backend (it was built without nvcc)");
#endif
}

}  // namespace deepinfer
