// Parameters of the RMSNorm kernel: out[r, :] = x[r, :] / rms(x[r, :]) * weight, with bf16 rows, an fp32 weight and
// fp32 math. rms(v) = sqrt(mean(v^2) + eps).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct RmsNormParams {
  const uint16_t* x = nullptr;    // [rows, dim] bf16, rows x_row_stride elements apart
  const float* weight = nullptr;  // [dim] fp32
  uint16_t* out = nullptr;        // [rows, dim] bf16, rows out_row_stride elements apart; may alias x
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t x_row_stride = 0;       // elements
  int64_t out_row_stride = 0;     // elements
  float eps = 1e-6f;
};

}  // namespace deepinfer::cuda
