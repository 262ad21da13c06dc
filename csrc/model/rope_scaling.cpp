#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace deepinfer {
namespace {

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The rotary dimension whose wavelength completes `num_rotations` turns over the original context.
double correction_dim(double num_rotations, double dim, double base, double max_positions) {
  return dim * std::log(max_positions / (num_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

RopeTables compute_rope_tables(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  const int64_t dim = c.qk_rope_head_dim, half = dim / 2;
  RopeTables t;
  t.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    t.inv_freq[i] = 1.0f / std::pow(static_cast<float>(r.theta), exponent);
  }
  if (r.type != RopeType::kYarn) return t;
  // YaRN: interpolate the low frequencies by `factor`, keep the high ones, ramp linearly in between.
  const double orig = static_cast<double>(r.original_max_position_embeddings);
  double low = std::floor(correction_dim(r.beta_fast, static_cast<double>(dim), r.theta, orig));
  double high = std::ceil(correction_dim(r.beta_slow, static_cast<double>(dim), r.theta, orig));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float extrapolated = t.inv_freq[i];
    const float interpolated = extrapolated / static_cast<float>(r.factor);
    t.inv_freq[i] = interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  t.attention_scaling =
      r.mscale_all_dim != 0.0 && r.mscale != 0.0
          ? static_cast<float>(yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim))
          : static_cast<float>(yarn_mscale(r.factor, 1.0));
  return t;
}

}  // namespace deepinfer
