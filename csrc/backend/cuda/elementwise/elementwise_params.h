// Parameters of the elementwise kernels. Activations are float32 or bfloat16 (one dtype per launch, chosen by the
// launcher); math is fp32 and each result is rounded once to the element type.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// x[i] += y[i] for i < n.
struct AddParams {
  void* x = nullptr;        // [n]
  const void* y = nullptr;  // [n]
  int64_t n = 0;
};

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i], silu(g) = g / (1 + exp(-g)).
struct SiluMulParams {
  const void* gate_up = nullptr;  // [rows, 2 * inter]
  void* out = nullptr;            // [rows, inter]
  int64_t rows = 0;
  int64_t inter = 0;
};

}  // namespace deepinfer::cuda
