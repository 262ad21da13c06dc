// DeepSeekMoE on the CPU: routing per token, then one GEMM per expert over the tokens routed to it (under expert
// parallelism, per expert the weights hold).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/weight_values.h"

namespace deepinfer::cpu {
namespace {

// Indices of the k largest values, ties broken by the lower index (deterministic).
std::vector<int64_t> top_indices(std::span<const float> values, int64_t k) {
  std::vector<int64_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace

void moe_route(const MoeRouteArgs& a) {
  a.validate();
  expect_host(a.logits, "moe_route");
  const int64_t tokens = a.logits.shape[0], experts = a.logits.shape[1], shared = a.num_shared_experts;
  const int64_t pairs = a.topk_ids.shape[1], top_k = pairs - shared;  // per token: top_k routed, then the shared
  const int64_t per_group = experts / a.n_group;
  const float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logits = a.logits.f32() + t * experts;
    std::vector<float> scores(static_cast<size_t>(experts));
    if (a.scoring == ExpertScoring::kSigmoid) {
      for (int64_t e = 0; e < experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    } else {
      const float max_logit = *std::max_element(logits, logits + experts);
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(logits[e] - max_logit));
      for (int64_t e = 0; e < experts; ++e) {
        scores[e] = static_cast<float>(std::exp(static_cast<double>(logits[e] - max_logit)) / sum);
      }
    }
    // Selection scores: biased for V3; groups outside the best topk_group are masked with -inf.
    std::vector<float> choice(scores);
    if (a.correction_bias.numel() > 0) {
      for (int64_t e = 0; e < experts; ++e) choice[e] += a.correction_bias.f32()[e];
    }
    if (a.method != TopkMethod::kGreedy && a.n_group > 1) {
      std::vector<float> group_score(static_cast<size_t>(a.n_group));
      for (int64_t g = 0; g < a.n_group; ++g) {
        std::span<const float> members(&choice[g * per_group], static_cast<size_t>(per_group));
        if (a.method == TopkMethod::kNoauxTc) {
          const auto best = top_indices(members, 2);
          group_score[g] = members[best[0]] + members[best[1]];
        } else {
          group_score[g] = *std::max_element(members.begin(), members.end());
        }
      }
      const auto kept = top_indices(group_score, a.topk_group);
      std::vector<bool> keep(static_cast<size_t>(a.n_group), false);
      for (int64_t g : kept) keep[g] = true;
      for (int64_t e = 0; e < experts; ++e) {
        if (!keep[e / per_group]) choice[e] = kNegInf;
      }
    }
    const auto chosen = top_indices(choice, top_k);
    int32_t* ids = a.topk_ids.as<int32_t>() + t * pairs;
    float* weights = a.topk_weights.f32() + t * pairs;
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      ids[k] = static_cast<int32_t>(chosen[k]);
      weights[k] = scores[chosen[k]];
      sum += weights[k];
    }
    const float norm = a.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
    for (int64_t k = 0; k < top_k; ++k) weights[k] *= norm * a.routed_scaling_factor;
    for (int64_t j = 0; j < shared; ++j) {  // the shared experts, stacked after the routed ones: weight 1
      ids[top_k + j] = static_cast<int32_t>(experts + j);
      weights[top_k + j] = 1.0f;
    }
  }
}

void moe_experts(const MoeExpertsArgs& a) {
  a.validate();
  expect_host(a.x, "moe_experts");
  const int64_t tokens = a.x.shape[0], dim = a.x.shape[1], experts = a.w_down.shape[0];
  const int64_t inter = a.w_down.shape[2], top_k = a.topk_ids.shape[1];
  const int32_t* ids = a.topk_ids.as<int32_t>();
  const float* weights = a.topk_weights.f32();
  // Bucket (token, slot) pairs by the weights' expert; under a shard, pairs of experts it does not hold are dropped.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts));
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    const int64_t e = a.shard.slot(ids[i]);
    if (e >= 0) routed[e].push_back(i);
  }
  std::fill(a.out.f32(), a.out.f32() + a.out.numel(), 0.0f);
  std::vector<float> x_e, h_e, act_e, y_e, gate_up_e, down_e;
  for (int64_t e = 0; e < experts; ++e) {
    const auto& pairs = routed[e];
    const int64_t n = static_cast<int64_t>(pairs.size());
    if (n == 0) continue;
    x_e.resize(static_cast<size_t>(n * dim));
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(a.x.f32() + (pairs[r] / top_k) * dim, dim, &x_e[r * dim]);
    }
    h_e.resize(static_cast<size_t>(n * 2 * inter));
    sgemm({.m = n, .n = 2 * inter, .k = dim, .a = x_e.data(), .lda = dim, .b = weight_values(a.w_gate_up.matrix(e), gate_up_e),
           .ldb = dim, .transpose_b = Transpose::kYes, .c = h_e.data(), .ldc = 2 * inter});
    act_e.resize(static_cast<size_t>(n * inter));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        const float g = h_e[r * 2 * inter + i], u = h_e[r * 2 * inter + inter + i];
        act_e[r * inter + i] = g / (1.0f + std::exp(-g)) * u;
      }
    }
    y_e.resize(static_cast<size_t>(n * dim));
    sgemm({.m = n, .n = dim, .k = inter, .a = act_e.data(), .lda = inter, .b = weight_values(a.w_down.matrix(e), down_e),
           .ldb = inter, .transpose_b = Transpose::kYes, .c = y_e.data(), .ldc = dim});
    for (int64_t r = 0; r < n; ++r) {
      float* out = a.out.f32() + (pairs[r] / top_k) * dim;
      const float w = weights[pairs[r]];
      for (int64_t d = 0; d < dim; ++d) out[d] += w * y_e[r * dim + d];
    }
  }
}

}  // namespace deepinfer::cpu
