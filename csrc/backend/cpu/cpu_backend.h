// The CPU reference backend: fp32, simple loops, OpenMP across tokens and heads, BLAS for GEMMs.
#pragma once

#include "backend/backend.h"

namespace deepinfer::cpu {

// The CPU ops read and write host memory only (validate() has already checked that all tensors share a device).
inline void expect_host(const ConstTensorView& t, const char* op) {
  DI_CHECK(t.device == Device::kCpu || t.numel() == 0, "cpu ", op, ": tensors must be in host memory, got one on ",
           device_name(t.device));
}

void linear(const LinearArgs& a);
void head_linear(const HeadLinearArgs& a);
void embedding(const EmbeddingArgs& a);
void gather_rows(const GatherRowsArgs& a);
void copy_strided(const CopyStridedArgs& a);
void rms_norm(const RmsNormArgs& a);
void add_rms_norm(const AddRmsNormArgs& a);
void silu_mul(const SiluMulArgs& a);
void add(const AddArgs& a);
void rope(const RopeArgs& a);
void mla_cache_write(const MlaCacheWriteArgs& a);
void mla_decode(const MlaDecodeArgs& a);
void mla_prefill(const MlaPrefillArgs& a);
void moe_route(const MoeRouteArgs& a);
void moe_experts(const MoeExpertsArgs& a);
void sample(const SampleArgs& a);

}  // namespace deepinfer::cpu
