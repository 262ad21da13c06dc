// The CUDA backend: a shell over a CudaContext (runtime/context.h: stream, memory pool, graphs, profiler, cuBLAS,
// workspaces, tuning). Each op forwards to its family's entry point (gemm/, mla/, moe/, norm/, rope/, sample/,
// elementwise/, memory/), which validates the arguments on the host (shapes, dtypes, devices; never reading device
// memory), chooses its kernels and queues them, or its cuBLAS call, on the context's stream. Index arrays (token ids,
// positions, slots, attention metadata) arrive as device tensors: no op copies anything from the host.
#include "backend/cuda/cuda_backend.h"

#include <utility>

#include <cuda_runtime_api.h>

#include "backend/cuda/elementwise/elementwise_ops.h"
#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/memory/memory_ops.h"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/norm/norm_ops.h"
#include "backend/cuda/rope/rope_ops.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/sample/sample_ops.h"

namespace deepinfer {
namespace {

bool cuda_supports(OpKind op) {
  switch (op) {
    case OpKind::kLinear:
    case OpKind::kLinearSiluMul:
    case OpKind::kMultiLinear:
    case OpKind::kHeadLinear:
    case OpKind::kMlaPrefill:  // bfloat16, DeepSeek's dims (rank 512, rope 64, nope 128, v 128); cuBLAS decompresses
#ifdef DEEPINFER_HAVE_CUBLAS
      return true;
#else
      return false;
#endif
    case OpKind::kEmbedding:
    case OpKind::kGatherRows:
    case OpKind::kCopyStrided:
    case OpKind::kRmsNorm:
    case OpKind::kAddRmsNorm:
    case OpKind::kSiluMul:
    case OpKind::kAdd:
    case OpKind::kRope:
    case OpKind::kMlaCacheWrite:
    case OpKind::kMlaPrepare:
    case OpKind::kMlaDecode:   // bfloat16, DeepSeek's 512 + 64 latent, heads in multiples of 16
    case OpKind::kMoeRoute:    // up to 256 routed experts, 264 with the shared ones, 10 pairs a token
    case OpKind::kMoeExperts:  // bfloat16, hidden and intermediate sizes in multiples of 32
    case OpKind::kMoe:         // both of the above
    case OpKind::kSample:
      return true;
  }
  return false;
}

class CudaBackend final : public Backend {
 public:
  // The device must already be current (make_cuda_backend makes it so).
  explicit CudaBackend(const cuda::CudaTuning& tuning) : ctx_(tuning) {}

  Device device() const override { return Device::kCuda; }
  std::string_view name() const override { return "cuda"; }
  bool supports(OpKind op) const override { return cuda_supports(op); }

  DType activation_dtype() const override { return DType::kBF16; }
  std::optional<DeviceMemoryInfo> memory_info() const override { return ctx_.memory_info(); }
  std::string fp8_unsupported_reason() const override { return ctx_.fp8_unsupported_reason(); }
  Tensor empty(Shape shape, DType dtype) override { return ctx_.empty(shape, dtype); }
  Tensor zeros(Shape shape, DType dtype) override { return ctx_.zeros(shape, dtype); }
  Tensor staging(Shape shape, DType dtype) override { return ctx_.staging(shape, dtype); }
  void copy_to_device(ConstTensorView host, TensorView dst) override { ctx_.copy_to_device(host, dst); }
  void copy_to_host(ConstTensorView src, TensorView host) override { ctx_.copy_to_host(src, host); }
  Tensor upload(Tensor host, DType dtype) override { return ctx_.upload(std::move(host), dtype); }
  bool fill_dummy_normal(TensorView dst, const dummy_normal::StreamRange& range) override {
    cuda::fill_dummy_normal(ctx_, dst, range);
    return true;
  }
  bool fill_dummy_normal_fp8(TensorView codes, TensorView scale_inv, const dummy_normal::StreamRange& range) override {
    cuda::fill_dummy_normal_fp8(ctx_, codes, scale_inv, range);
    return true;
  }
  std::unique_ptr<StepGraph> capture(const std::function<void()>& work) override { return ctx_.capture(work); }

  void linear(const LinearArgs& a) override { cuda::linear(ctx_, a); }
  void linear_silu_mul(const LinearSiluMulArgs& a) override { cuda::linear_silu_mul(ctx_, a); }
  void multi_linear(const MultiLinearArgs& a) override { cuda::multi_linear(ctx_, a); }
  void head_linear(const HeadLinearArgs& a) override { cuda::head_linear(ctx_, a); }
  void embedding(const EmbeddingArgs& a) override { cuda::embedding(ctx_, a); }
  void gather_rows(const GatherRowsArgs& a) override { cuda::gather_rows(ctx_, a); }
  void copy_strided(const CopyStridedArgs& a) override { cuda::copy_strided(ctx_, a); }
  void rms_norm(const RmsNormArgs& a) override { cuda::rms_norm(ctx_, a); }
  void add_rms_norm(const AddRmsNormArgs& a) override { cuda::add_rms_norm(ctx_, a); }
  void silu_mul(const SiluMulArgs& a) override { cuda::silu_mul(ctx_, a); }
  void add(const AddArgs& a) override { cuda::add(ctx_, a); }
  void rope(const RopeArgs& a) override { cuda::rope(ctx_, a); }
  void mla_cache_write(const MlaCacheWriteArgs& a) override { cuda::mla_cache_write(ctx_, a); }
  void mla_prepare(const MlaPrepareArgs& a) override { cuda::mla_prepare(ctx_, a); }
  void mla_decode(const MlaDecodeArgs& a) override { cuda::mla_decode(ctx_, a); }
  void mla_prefill(const MlaPrefillArgs& a) override { cuda::mla_prefill(ctx_, a); }
  void moe_route(const MoeRouteArgs& a) override { cuda::moe_route(ctx_, a); }
  void moe_experts(const MoeExpertsArgs& a) override { cuda::moe_experts(ctx_, a); }
  void moe(const MoeArgs& a) override { cuda::moe(ctx_, a); }
  void sample(const SampleArgs& a) override { cuda::sample(ctx_, a); }

  cuda::CudaContext& context() { return ctx_; }

 private:
  cuda::CudaContext ctx_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return make_cuda_backend(device_index, cuda::CudaTuning::from_env());
}

std::unique_ptr<Backend> make_cuda_backend(int device_index, const cuda::CudaTuning& tuning) {
  int count = 0;
  CUDA_TRY(cudaGetDeviceCount(&count));
  DI_CHECK(device_index >= 0 && device_index < count, "cuda backend: device ", device_index, " of ", count);
  CUDA_TRY(cudaSetDevice(device_index));
  return std::make_unique<CudaBackend>(tuning);
}

cuda::CudaContext& cuda_context_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  DI_CHECK(cuda != nullptr, "a CUDA backend is needed here, not the ", backend.name(), " backend");
  return cuda->context();
}

}  // namespace deepinfer
