// Parameters of the RMSNorm kernel with an optional fused residual add. Rows are float32 or bfloat16 (one dtype per
// launch, chosen by the launcher), the weight float32, the math fp32. rms(v) = sqrt(mean(v^2) + eps).
//   with a residual:    residual[r] = round(residual[r] + x[r]);  out[r] = residual[r] / rms(residual[r]) * weight
//   without (nullptr):  out[r] = x[r] / rms(x[r]) * weight
// The rounded residual is what is normalized, so `out` is exactly rms_norm of the residual later layers read.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct NormResidualParams {
  const void* x = nullptr;          // [rows, dim], rows x_row_stride elements apart
  void* residual = nullptr;         // [rows, dim], rows residual_row_stride apart, updated in place; or nullptr
  const float* weight = nullptr;    // [dim]
  void* out = nullptr;              // [rows, dim], rows out_row_stride apart; may alias x, not residual
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t x_row_stride = 0;         // elements
  int64_t residual_row_stride = 0;  // elements
  int64_t out_row_stride = 0;       // elements
  float eps = 1e-6f;
  bool trigger_early = false;       // the next kernel may launch as soon as this one starts (LaunchLedger::trigger)
};

}  // namespace deepinfer::cuda
