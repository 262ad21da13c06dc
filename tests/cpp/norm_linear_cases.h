// The norm_linear op cases of the CPU op tests (a device backend runs the same cases against the CPU): the op against
// its naive formula, and arguments it must reject before writing anything.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "op_test_harness.h"

namespace deepinfer::op_test {

// The shapes of one case: T rows of D, with or without the sublayer output x, and the targets' widths (target 1, when
// there is one, is gated: silu(normed · gate^T) * (normed · up^T)).
struct NormLinearShape {
  int64_t tokens = 0, dim = 0;
  std::vector<int64_t> widths;
  bool with_x = true;

  int64_t weight_rows(size_t i) const { return i == 1 ? 2 * widths[i] : widths[i]; }
  std::string name() const {
    std::string s = str_cat("norm_linear_", tokens, "x", dim, with_x ? "_add" : "_no_add");
    for (const int64_t w : widths) s += str_cat("_", w);
    return s;
  }
};

// The random values of a case, drawn once.
struct NormLinearValues {
  std::vector<float> x, residual, norm;
  std::vector<std::vector<float>> ws;

  NormLinearValues(const NormLinearShape& s, uint64_t seed) {
    Rng rng(seed);
    x = rng.uniform(s.tokens * s.dim);
    residual = rng.uniform(s.tokens * s.dim, -2.0f, 2.0f);
    norm = rng.uniform(s.dim, 0.5f, 1.5f);
    for (size_t i = 0; i < s.widths.size(); ++i) ws.push_back(rng.uniform(s.weight_rows(i) * s.dim));
  }
};

inline constexpr float kNormLinearEps = 1e-5f;

// residual_out = residual_in + x, normed = rms_norm(residual_out) * norm, each target's product of normed; in double.
inline Outputs norm_linear_naive(const NormLinearShape& s, const NormLinearValues& v) {
  const int64_t t = s.tokens, d = s.dim;
  std::vector<double> res(t * d), normed(t * d);
  for (int64_t i = 0; i < t; ++i) {
    double sum_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      res[i * d + j] = double(v.residual[i * d + j]) + (s.with_x ? double(v.x[i * d + j]) : 0.0);
      sum_sq += res[i * d + j] * res[i * d + j];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / double(d) + kNormLinearEps);
    for (int64_t j = 0; j < d; ++j) normed[i * d + j] = double(v.norm[j]) * res[i * d + j] * inv_rms;
  }
  Outputs outs = {{"residual_out", res}, {"normed", normed}};
  for (size_t k = 0; k < s.widths.size(); ++k) {
    const int64_t n = s.widths[k];
    const auto dot = [&](int64_t token, int64_t row) {
      double acc = 0.0;
      for (int64_t j = 0; j < d; ++j) acc += normed[token * d + j] * v.ws[k][row * d + j];
      return acc;
    };
    std::vector<double> out(t * n);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (k == 1) {
          const double gate = dot(i, j);
          out[i * n + j] = gate / (1.0 + std::exp(-gate)) * dot(i, n + j);
        } else {
          out[i * n + j] = dot(i, j);
        }
      }
    }
    outs.push_back({str_cat("out", k), out});
  }
  return outs;
}

inline void add_norm_linear(CaseRegistry& r, const NormLinearShape& s, uint64_t seed) {
  const NormLinearValues v(s, seed);
  r.add({.op = OpKind::kNormLinear,
         .name = s.name(),
         .run = [=](OpRunner& run) -> Outputs {
           const int64_t t = s.tokens, d = s.dim;
           std::vector<LinearTarget> targets;
           for (size_t i = 0; i < s.widths.size(); ++i) {
             targets.push_back({.w = run.upload(HostTensor::f32({s.weight_rows(i), d}, v.ws[i])),
                                .out = run.output({t, s.widths[i]}, DType::kF32), .silu_mul = i == 1});
           }
           const TensorView residual_out = run.output({t, d}, DType::kF32), normed = run.output({t, d}, DType::kF32);
           run.backend().norm_linear({.x = s.with_x ? run.upload(HostTensor::f32({t, d}, v.x)) : ConstTensorView{},
                                      .residual_in = run.upload(HostTensor::f32({t, d}, v.residual)),
                                      .residual_out = residual_out,
                                      .norm_weight = run.upload(HostTensor::f32({d}, v.norm)),
                                      .eps = kNormLinearEps, .normed = normed, .targets = targets});
           Outputs outs = {{"residual_out", run.fetch(residual_out)}, {"normed", run.fetch(normed)}};
           for (size_t i = 0; i < targets.size(); ++i) outs.push_back({str_cat("out", i), run.fetch(targets[i].out)});
           return outs;
         },
         .naive = [=]() { return norm_linear_naive(s, v); }});
}

// Arguments norm_linear must reject. Every tensor of such a case is uploaded read-only, so the harness also checks
// that nothing was written before the throw.
enum class BadNormLinear : uint8_t {
  kResidualOutIsResidualIn,  // the race the two residual buffers exist to avoid
  kResidualOutOverlapsX,
  kNormedIsX,
  kTargetOutIsNormed,
  kXRows,         // x [T + 1, D]
  kNormWeight,    // norm_weight [D + 1]
  kTargetK,       // a target's w [N, D + 32]
  kNoTargets,
};

inline void add_norm_linear_rejects(CaseRegistry& r, const std::string& name, BadNormLinear bad) {
  constexpr int64_t t = 3, d = 64, n = 5;
  Rng rng(static_cast<uint64_t>(bad) + 900);
  const std::vector<float> a = rng.uniform(2 * (t + 1) * (d + 32)), b = rng.uniform(2 * (t + 1) * (d + 32));
  const std::vector<float> c = rng.uniform(2 * (t + 1) * (d + 32)), w = rng.uniform(n * (d + 32));
  const std::vector<float> out = rng.uniform(t * d);
  r.add({.op = OpKind::kNormLinear,
         .name = "norm_linear_rejects_" + name,
         .run = [=](OpRunner& run) -> Outputs {
           const auto ro = [&](Shape shape, const std::vector<float>& values) {
             return run.upload(HostTensor::f32(shape, std::vector<float>(values.begin(), values.begin() +
                                                                                             shape.numel())));
           };
           TensorView x = ro({bad == BadNormLinear::kXRows ? t + 1 : t, d}, a);
           const TensorView residual_in = ro({t, d}, b);
           TensorView residual_out = ro({t, d}, c);
           TensorView normed = ro({t, d}, out);
           if (bad == BadNormLinear::kResidualOutIsResidualIn) residual_out = residual_in;
           if (bad == BadNormLinear::kNormedIsX) normed = x;
           if (bad == BadNormLinear::kResidualOutOverlapsX) {
             const TensorView both = ro({2 * t, d}, a);  // x is its first rows, residual_out starts inside them
             x = both.rows(0, t);
             residual_out = both.rows(t - 1, t);
           }
           const int64_t k = bad == BadNormLinear::kTargetK ? d + 32 : d;
           const TensorView target_out = bad == BadNormLinear::kTargetOutIsNormed
                                             ? TensorView(normed.data, DType::kF32, Shape{t, n}, normed.device)
                                             : ro({t, n}, out);
           const LinearTarget target{.w = ro({n, k}, w), .out = target_out};
           const std::span<const LinearTarget> targets(&target, bad == BadNormLinear::kNoTargets ? 0 : 1);
           run.backend().norm_linear({.x = x, .residual_in = residual_in, .residual_out = residual_out,
                                      .norm_weight = ro({bad == BadNormLinear::kNormWeight ? d + 1 : d}, c),
                                      .eps = kNormLinearEps, .normed = normed, .targets = targets});
           return {};
         },
         .expect = Expect::kThrows});
}

}  // namespace deepinfer::op_test
