#include "backend/cuda/runtime/tuning.h"

#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/mla/mla_decode_params.h"
#include "core/env_flag.h"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

MlaPrefillKernel prefill_kernel(const char* value) {
  const std::string_view name = value == nullptr ? "" : value;
  if (name.empty() || name == "wgmma") return MlaPrefillKernel::kWgmma;
  DI_CHECK(name == "mma", "DEEPINFER_MLA_PREFILL must be wgmma or mma (or unset: wgmma), got \"", name, "\"");
  return MlaPrefillKernel::kMma;
}

int decode_splits(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  DI_CHECK(end != value && *end == '\0' && errno == 0 && n >= 1 && n <= kMlaDecodeMaxSplits,
           "DEEPINFER_MLA_DECODE_SPLITS=", value, " is not a split count in [1, ", kMlaDecodeMaxSplits, "]");
  return static_cast<int>(n);
}

}  // namespace

CudaTuning CudaTuning::from_env() {
  return {.pdl = !env_flag("DEEPINFER_DISABLE_PDL"),
          .skinny_gemm = !env_flag("DEEPINFER_DISABLE_SKINNY_GEMM"),
          .mla_prefill_kernel = prefill_kernel(std::getenv("DEEPINFER_MLA_PREFILL")),
          .mla_decode_splits = decode_splits(std::getenv("DEEPINFER_MLA_DECODE_SPLITS")),
          .profile_ops = env_flag("DEEPINFER_PROFILE_OPS")};
}

}  // namespace deepinfer::cuda
