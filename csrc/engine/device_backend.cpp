#include "engine/device_backend.h"

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/parallel/nccl_communicator.h"
#include "backend/cuda/runtime/device_info.h"
#endif

namespace deepinfer {

std::unique_ptr<Backend> make_backend(const std::string& device, int index) {
  if (device == "cpu") return make_cpu_backend();
#ifdef DEEPINFER_HAVE_CUDA
  const int visible = cuda::device_count();
  DI_CHECK_ARG(visible > 0, "device 'cuda': no CUDA device is visible");
  DI_CHECK_ARG(index < visible, "rank ", index, " needs GPU ", index, ", but ", visible,
               " CUDA device(s) are visible: tensor_parallel_size must be at most the visible GPUs");
  return make_cuda_backend(index);
#else
  throw InvalidArgument(
      "device 'cuda': this build has no CUDA backend (pip install . builds it where nvcc and a Hopper GPU are; "
      "-C cmake.define.DEEPINFER_CUDA=ON forces it)");
#endif
}

std::unique_ptr<Communicator> make_device_communicator(Backend& backend, Communicator& host,
                                                       std::chrono::milliseconds timeout) {
  if (backend.device() == Device::kCpu) return nullptr;
#ifdef DEEPINFER_HAVE_CUDA
  return make_nccl_communicator(backend, host,
                                std::chrono::ceil<std::chrono::seconds>(timeout));
#else
  static_cast<void>(host);
  static_cast<void>(timeout);
  throw InvalidArgument("device collectives: this build has no CUDA backend");
#endif
}

}  // namespace deepinfer
