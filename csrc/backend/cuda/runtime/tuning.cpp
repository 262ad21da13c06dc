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

// Variable `name`'s integer value in [lo, hi], or `fallback` when it is unset or empty.
int int_in_range(const char* name, int fallback, long lo, long hi, const char* what) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  DI_CHECK(end != value && *end == '\0' && errno == 0 && n >= lo && n <= hi, name, "=", value, " is not ", what,
           " in [", lo, ", ", hi, "]");
  return static_cast<int>(n);
}

}  // namespace

CudaTuning CudaTuning::from_env() {
  return {.pdl = !env_flag("DEEPINFER_DISABLE_PDL"),
          .skinny_gemm = !env_flag("DEEPINFER_DISABLE_SKINNY_GEMM"),
          .mla_prefill_kernel = prefill_kernel(std::getenv("DEEPINFER_MLA_PREFILL")),
          .mla_decode_splits = int_in_range("DEEPINFER_MLA_DECODE_SPLITS", 0, 1, kMlaDecodeMaxSplits, "a split count"),
          .fp8_skinny_max_tokens = int_in_range("DEEPINFER_FP8_SKINNY_MAX_TOKENS", CudaTuning{}.fp8_skinny_max_tokens,
                                                0, 64, "a token count"),
          .profile_ops = env_flag("DEEPINFER_PROFILE_OPS")};
}

}  // namespace deepinfer::cuda
