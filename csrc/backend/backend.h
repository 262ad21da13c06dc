// The op interface of one device. The model calls these and never branches on the device; the CPU backend is
// the reference every other backend is tested against.
#pragma once

#include <memory>
#include <string_view>

#include "backend/ops/dense.h"
#include "backend/ops/mla.h"
#include "backend/ops/moe.h"
#include "backend/ops/rope.h"

namespace deepinfer {

enum class OpKind : uint8_t {
  kLinear, kHeadLinear, kEmbedding, kRmsNorm, kAddRmsNorm, kSiluMul, kAdd, kRope,
  kMlaCacheWrite, kMlaDecode, kMlaPrefill, kMoeRoute, kMoeExperts,
};
std::string_view op_name(OpKind op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;
  virtual bool supports(OpKind op) const = 0;

  virtual void linear(const LinearArgs& a) = 0;
  virtual void head_linear(const HeadLinearArgs& a) = 0;
  virtual void embedding(const EmbeddingArgs& a) = 0;
  virtual void rms_norm(const RmsNormArgs& a) = 0;
  virtual void add_rms_norm(const AddRmsNormArgs& a) = 0;
  virtual void silu_mul(const SiluMulArgs& a) = 0;
  virtual void add(const AddArgs& a) = 0;
  virtual void rope(const RopeArgs& a) = 0;
  virtual void mla_cache_write(const MlaCacheWriteArgs& a) = 0;
  virtual void mla_decode(const MlaDecodeArgs& a) = 0;
  virtual void mla_prefill(const MlaPrefillArgs& a) = 0;
  virtual void moe_route(const MoeRouteArgs& a) = 0;
  virtual void moe_experts(const MoeExpertsArgs& a) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace deepinfer
