#include "backend/cuda/runtime/launch.h"

#include "core/env_flag.h"

namespace deepinfer::cuda {

bool pdl_enabled() {
  static const bool enabled = !env_flag("DEEPINFER_DISABLE_PDL");
  return enabled;
}

bool trigger_early(bool next_op_may_start_early) {
  static const bool enabled = !env_flag("DEEPINFER_DISABLE_EARLY_TRIGGER");
  return next_op_may_start_early && enabled;
}

}  // namespace deepinfer::cuda
