#include "backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string_view name() const override { return "cpu"; }
  bool supports(OpKind) const override { return true; }

  void linear(const LinearArgs& a) override { cpu::linear(a); }
  void head_linear(const HeadLinearArgs& a) override { cpu::head_linear(a); }
  void embedding(const EmbeddingArgs& a) override { cpu::embedding(a); }
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
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace deepinfer
