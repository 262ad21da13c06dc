#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <utility>

#include "core/half.h"

namespace deepinfer {
namespace {

void expect_same_layout(const ConstTensorView& src, const ConstTensorView& dst, const char* what) {
  DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), what, ": ", src.shape.str(), " ",
           dtype_name(src.dtype), " into ", dst.shape.str(), " ", dtype_name(dst.dtype));
  cpu::expect_host(src, what);
  cpu::expect_host(dst, what);
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string_view name() const override { return "cpu"; }
  bool supports(OpKind) const override { return true; }

  // Host memory is this backend's device memory: allocations are plain host tensors, copies are memcpy, and an
  // upload that needs no conversion hands the tensor back untouched.
  DType activation_dtype() const override { return DType::kF32; }
  Tensor empty(Shape shape, DType dtype) override { return Tensor::empty(shape, dtype); }
  Tensor zeros(Shape shape, DType dtype) override { return Tensor::zeros(shape, dtype); }
  void copy_to_device(ConstTensorView host, TensorView dst) override {
    expect_same_layout(host, dst, "cpu copy_to_device");
    if (dst.bytes() > 0) std::memcpy(dst.data, host.data, dst.bytes());
  }
  void copy_to_host(ConstTensorView src, TensorView host) override {
    expect_same_layout(src, host, "cpu copy_to_host");
    if (host.bytes() > 0) std::memcpy(host.data, src.data, host.bytes());
  }
  Tensor upload(Tensor host, DType dtype) override {
    cpu::expect_host(host.cview(), "upload");
    if (host.dtype() == dtype) return host;
    DI_CHECK(host.dtype() == DType::kF32 && dtype == DType::kBF16, "cpu upload: cannot convert ",
             dtype_name(host.dtype()), " to ", dtype_name(dtype));
    Tensor out = Tensor::empty(host.shape(), dtype);
    const float* src = host.f32();
    auto* dst = out.view().as<uint16_t>();
    for (int64_t i = 0; i < host.numel(); ++i) dst[i] = float_to_bf16(src[i]);
    return out;
  }

  void linear(const LinearArgs& a) override { cpu::linear(a); }
  void head_linear(const HeadLinearArgs& a) override { cpu::head_linear(a); }
  void embedding(const EmbeddingArgs& a) override { cpu::embedding(a); }
  void gather_rows(const GatherRowsArgs& a) override { cpu::gather_rows(a); }
  void copy_strided(const CopyStridedArgs& a) override { cpu::copy_strided(a); }
  void rms_norm(const RmsNormArgs& a) override { cpu::rms_norm(a); }
  void add_rms_norm(const AddRmsNormArgs& a) override { cpu::add_rms_norm(a); }
  void silu_mul(const SiluMulArgs& a) override { cpu::silu_mul(a); }
  void add(const AddArgs& a) override { cpu::add(a); }
  void rope(const RopeArgs& a) override { cpu::rope(a); }
  void mla_cache_write(const MlaCacheWriteArgs& a) override { cpu::mla_cache_write(a); }
  void mla_decode(const MlaDecodeArgs& a) override { cpu::mla_decode(a); }
  void mla_prefill(const MlaPrefillArgs& a) override { cpu::mla_prefill(a); }
  void moe_route(const MoeRouteArgs& a) override { cpu::moe_route(a); }
  void moe_experts(const MoeExpertsArgs& a) override { cpu::moe_experts(a); }
  void sample(const SampleArgs& a) override { cpu::sample(a); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace deepinfer
