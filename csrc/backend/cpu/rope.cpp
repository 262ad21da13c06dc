// Rotary embedding on the CPU. Angles are computed in fp32 as position * inv_freq, like the reference models.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void rope(const RopeArgs& a) {
  a.validate();
  DI_CHECK(a.device == Device::kCpu && a.dtype == DType::kF32, "cpu rope: x must be float32 in host memory, got ",
           dtype_name(a.dtype), " on ", device_name(a.device));
  const int64_t half = a.rot_dim / 2, tokens = a.num_tokens();
  const int32_t* positions = a.positions.as<int32_t>();
  const float* inv_freq = a.inv_freq.f32();
  float* const x_base = static_cast<float*>(a.x);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_v[i] = std::cos(angle) * a.attention_scaling;
      sin_v[i] = std::sin(angle) * a.attention_scaling;
    }
    for (int64_t h = 0; h < a.num_heads; ++h) {
      float* x = x_base + t * a.token_stride + h * a.head_stride;
      for (int64_t i = 0; i < half; ++i) {
        // Interleaved: the pair (2i, 2i+1) rotates by angle i. Half-split: the pair (i, i + half).
        float& x0 = a.interleaved ? x[2 * i] : x[i];
        float& x1 = a.interleaved ? x[2 * i + 1] : x[i + half];
        const float r0 = x0 * cos_v[i] - x1 * sin_v[i];
        const float r1 = x1 * cos_v[i] + x0 * sin_v[i];
        x0 = r0;
        x1 = r1;
      }
    }
  }
}

}  // namespace deepinfer::cpu
