#include "backend/cuda/runtime/launch.h"

#include "core/env_flag.h"

namespace deepinfer::cuda {

bool pdl_enabled() {
  static const bool enabled = !env_flag("DEEPINFER_DISABLE_PDL");
  return enabled;
}

bool early_trigger_enabled() {
  static const bool enabled = !env_flag("DEEPINFER_DISABLE_EARLY_TRIGGER");
  return enabled;
}

}  // namespace deepinfer::cuda
