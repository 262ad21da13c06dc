// The default implementations of the composed dense ops: each runs the existing ops it stands for. Backends override
// them with fused kernels; the CPU backend keeps these, so they are the reference of those kernels.
#include "backend/backend.h"

namespace deepinfer {

void Backend::linear_silu_mul(const LinearSiluMulArgs& a) {
  a.validate();
  Tensor gate_up = empty({a.x.shape[0], a.w.shape[0]}, a.out.dtype);  // [M, 2I]
  linear({.x = a.x, .w = a.w, .out = gate_up.view()});
  silu_mul({.gate_up = gate_up.cview(), .out = a.out});
}

void Backend::multi_linear(const MultiLinearArgs& a) {
  a.validate();
  for (const LinearTarget& t : a.targets) {
    if (t.silu_mul) {
      linear_silu_mul({.x = a.x, .w = t.w, .out = t.out});
    } else {
      linear({.x = a.x, .w = t.w, .out = t.out});
    }
  }
}

}  // namespace deepinfer
