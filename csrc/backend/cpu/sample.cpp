// PLACEHOLDER: replaced by the CPU reference of ops/sample.h.
#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void sample(const SampleArgs&) { throw UnsupportedOp("cpu sample: not implemented yet"); }

}  // namespace deepinfer::cpu
