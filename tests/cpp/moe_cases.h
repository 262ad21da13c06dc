// The MoE op cases of the CPU op tests, against the naive formulas below (a device backend runs the same cases against
// the CPU), and the expert ids the CUDA tests' own expert cases draw. With s shared experts, a token's row holds its
// top_k routed pairs, then experts E .. E + s - 1 in order with weight exactly 1 (ops/moe.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "core/half.h"
#include "core/weight.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {

struct RouteConfig {
  ExpertScoring scoring = ExpertScoring::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
  int64_t experts = 0, n_group = 1, topk_group = 1, top_k = 1;  // experts: the routed ones (the logits' width)
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  int64_t num_shared = 0;

  int64_t pairs() const { return top_k + num_shared; }
};

// The order of a token's routed experts is not part of the contract: both sides are sorted by expert id per token. The
// shared pairs that follow are, and are compared exactly (ids and weights) in place.
inline Outputs sorted_route(std::span<const double> ids, std::span<const double> weights, int64_t top_k,
                            int64_t num_shared) {
  Output id_out{.name = "ids", .values = {}, .compare = Compare::kExact}, weight_out{.name = "weights", .values = {}};
  Output shared_out{.name = "shared_pairs", .values = {}, .compare = Compare::kExact};
  const auto pairs = static_cast<size_t>(top_k + num_shared);
  for (size_t t = 0; t * pairs < ids.size(); ++t) {
    std::vector<std::pair<double, double>> routed;
    for (size_t k = 0; k < static_cast<size_t>(top_k); ++k) {
      routed.emplace_back(ids[t * pairs + k], weights[t * pairs + k]);
    }
    std::sort(routed.begin(), routed.end());
    for (const auto& [id, w] : routed) {
      id_out.values.push_back(id);
      weight_out.values.push_back(w);
    }
    for (size_t k = static_cast<size_t>(top_k); k < pairs; ++k) {
      shared_out.values.push_back(ids[t * pairs + k]);
      shared_out.values.push_back(weights[t * pairs + k]);
    }
  }
  return {id_out, weight_out, shared_out};
}

// Indices of `values` by descending value, ties to the lower index.
inline std::vector<int64_t> order_desc(const std::vector<double>& values) {
  std::vector<int64_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  return idx;
}

// One token's routing, straight from DeepSeek's description (see DESIGN.md), then the shared experts.
inline void naive_route_token(const RouteConfig& c, const float* logits, const std::vector<float>& bias,
                              std::vector<double>& ids, std::vector<double>& weights) {
  const int64_t e_count = c.experts, per_group = c.experts / c.n_group;
  std::vector<double> scores(e_count);
  if (c.scoring == ExpertScoring::kSigmoid) {
    for (int64_t e = 0; e < e_count; ++e) scores[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
  } else {
    double max_logit = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t e = 0; e < e_count; ++e) max_logit = std::max(max_logit, double(logits[e]));
    for (int64_t e = 0; e < e_count; ++e) sum += std::exp(logits[e] - max_logit);
    for (int64_t e = 0; e < e_count; ++e) scores[e] = std::exp(logits[e] - max_logit) / sum;
  }
  std::vector<double> choice = scores;
  for (size_t e = 0; e < bias.size(); ++e) choice[e] += bias[e];
  if (c.method != TopkMethod::kGreedy && c.n_group > 1) {
    std::vector<double> group_score(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(members.rbegin(), members.rend());
      group_score[g] = c.method == TopkMethod::kNoauxTc ? members[0] + members[1] : members[0];
    }
    const std::vector<int64_t> groups = order_desc(group_score);
    for (size_t rank = static_cast<size_t>(c.topk_group); rank < groups.size(); ++rank) {
      for (int64_t e = groups[rank] * per_group; e < (groups[rank] + 1) * per_group; ++e) {
        choice[e] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  const std::vector<int64_t> chosen = order_desc(choice);
  double sum = 0.0;
  for (int64_t k = 0; k < c.top_k; ++k) sum += scores[chosen[k]];
  for (int64_t k = 0; k < c.top_k; ++k) {
    ids.push_back(double(chosen[k]));
    const double w = c.norm_topk_prob ? scores[chosen[k]] / (sum + 1e-20) : scores[chosen[k]];
    weights.push_back(w * c.routed_scaling_factor);
  }
  for (int64_t j = 0; j < c.num_shared; ++j) {
    ids.push_back(double(c.experts + j));
    weights.push_back(1.0);
  }
}

inline std::string route_name(const std::string& tag, const RouteConfig& c) {
  return str_cat("moe_route_", tag, c.num_shared > 0 ? str_cat("_shared", c.num_shared) : "");
}

inline void add_moe_route(CaseRegistry& r, const std::string& tag, const RouteConfig& c, int64_t tokens,
                          std::vector<float> logits, std::vector<float> bias) {
  r.add({.op = OpKind::kMoeRoute,
         .name = route_name(tag, c),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView ids = run.output({tokens, c.pairs()}, DType::kI32);
           const TensorView weights = run.output({tokens, c.pairs()}, DType::kF32);
           const auto bias_len = static_cast<int64_t>(bias.size());
           run.backend().moe_route({.logits = run.upload(HostTensor::f32({tokens, c.experts}, logits)),
                                    .correction_bias = run.upload(HostTensor::f32({bias_len}, bias)),
                                    .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring,
                                    .method = c.method, .n_group = c.n_group, .topk_group = c.topk_group,
                                    .norm_topk_prob = c.norm_topk_prob,
                                    .routed_scaling_factor = c.routed_scaling_factor,
                                    .num_shared_experts = c.num_shared});
           return sorted_route(run.fetch(ids), run.fetch(weights), c.top_k, c.num_shared);
         },
         .naive = [=]() -> Outputs {
           std::vector<double> ids, weights;
           for (int64_t t = 0; t < tokens; ++t) naive_route_token(c, logits.data() + t * c.experts, bias, ids, weights);
           return sorted_route(ids, weights, c.top_k, c.num_shared);
         }});
}

inline void add_random_moe_route(CaseRegistry& r, const std::string& tag, const RouteConfig& c, int64_t tokens,
                                 bool bias, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> logits = rng.uniform(tokens * c.experts, -4.0f, 4.0f);
  add_moe_route(r, tag, c, tokens, logits, bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{});
}

// Logits on a grid of nine values (-1.9, -1.4, .., 2.1): many experts tie on their score, and groups on theirs, so the
// choice at the top-k boundary rests on the tie rule (the lower index) alone. The grid holds no x and -x, whose
// sigmoids sum to exactly 1 and would tie groups in exact arithmetic only.
inline void add_tied_moe_route(CaseRegistry& r, const std::string& tag, const RouteConfig& c, int64_t tokens,
                               uint64_t seed) {
  Rng rng(seed);
  std::vector<float> logits = rng.uniform(tokens * c.experts, -2.0f, 2.0f);
  for (float& v : logits) v = std::round(v * 2.0f) / 2.0f + 0.1f;
  add_moe_route(r, tag, c, tokens, logits, {});
}

// V3 routing where the best expert by unbiased score sits in a group that loses on its top-2 sum, and every biased
// score is negative: masking the dropped groups with 0 instead of -inf would pick their experts.
constexpr RouteConfig kMaskedGroupRoute{.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                        .experts = 16, .n_group = 4, .topk_group = 2, .top_k = 4,
                                        .norm_topk_prob = true, .routed_scaling_factor = 2.5f};

inline void masked_group_inputs(int64_t tokens, std::vector<float>& logits, std::vector<float>& bias) {
  Rng rng(77);
  // group 0: one near-certain expert and three near-zero ones (top-2 sum ~1.0); groups 1 and 2: two experts at
  // ~0.69 each (top-2 sum ~1.38); group 3: four at ~0.5 (top-2 sum ~1.0). Each logit gets a little noise.
  const float pattern[16] = {6, -6, -6, -6, 0.8f, -6, 0.8f, -6, -6, 0.8f, -6, 0.8f, 0, 0, 0, 0};
  logits.clear();
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> noise = rng.uniform(16, -0.05f, 0.05f);
    for (size_t e = 0; e < 16; ++e) logits.push_back(pattern[e] + noise[e]);
  }
  bias = rng.uniform(16, -1.01f, -0.99f);
}

// The experts of an experts case: `routed` routed experts (top_k of them a token) and `shared` after them.
struct ExpertsShape {
  int64_t tokens = 0, dim = 0, inter = 0, routed = 0, top_k = 1, shared = 0;

  int64_t experts() const { return routed + shared; }
  int64_t pairs() const { return top_k + shared; }
  std::string str() const {
    return str_cat("t", tokens, "_d", dim, "_i", inter, "_e", routed, "_k", top_k,
                   shared > 0 ? str_cat("_s", shared) : "");
  }
};

// A routing result as moe_route leaves it: per token, top_k distinct random routed experts with weights in [0, 1),
// then the shared experts routed .. routed + shared - 1 with weight 1.
struct ExpertPairs {
  std::vector<int32_t> ids;    // [tokens, top_k + shared]
  std::vector<float> weights;  // [tokens, top_k + shared]
};

// Which routed experts random_expert_pairs may draw: any, or none of a shard's (its routed experts outside it).
enum class PairsHeld : uint8_t { kAny, kNone };

inline ExpertPairs random_expert_pairs(Rng& rng, const ExpertsShape& s, PairsHeld held = PairsHeld::kAny,
                                       const ExpertShard& shard = {}) {
  ExpertPairs out;
  std::vector<int32_t> candidates(static_cast<size_t>(s.routed));
  std::iota(candidates.begin(), candidates.end(), 0);
  if (held == PairsHeld::kNone) {
    std::erase_if(candidates, [&](int32_t e) {
      return e >= shard.first_routed && e < shard.first_routed + shard.num_local_routed;
    });
  }
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<int32_t> perm = candidates;
    rng.shuffle(perm);
    out.ids.insert(out.ids.end(), perm.begin(), perm.begin() + s.top_k);
    for (int64_t j = 0; j < s.shared; ++j) out.ids.push_back(static_cast<int32_t>(s.routed + j));
  }
  for (int64_t t = 0; t < s.tokens; ++t) {
    const std::vector<float> routed = rng.uniform(s.top_k, 0.0f, 1.0f);
    out.weights.insert(out.weights.end(), routed.begin(), routed.end());
    out.weights.insert(out.weights.end(), static_cast<size_t>(s.shared), 1.0f);
  }
  return out;
}

// out[t] = sum_k w[t, k] * down_e(finish_act(silu(gate_e(x[t])) * up_e(x[t]))) over the routed and shared pairs, in
// double, each down product through finish_y; a pair of weight 0 adds nothing and is skipped (a shard's pairs held
// elsewhere).
template <typename FinishAct, typename FinishY>
std::vector<double> naive_experts_with(const ExpertsShape& s, const std::vector<float>& x,
                                       const std::vector<float>& w_gate_up, const std::vector<float>& w_down,
                                       const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                       FinishAct finish_act, FinishY finish_y) {
  const int64_t dim = s.dim, inter = s.inter, pairs = s.pairs();
  std::vector<double> out(s.tokens * dim, 0.0), act(inter);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t k = 0; k < pairs; ++k) {
      if (weights[t * pairs + k] == 0.0f) continue;
      const int64_t e = ids[t * pairs + k];
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t c = 0; c < dim; ++c) {
          g += double(w_gate_up[(e * 2 * inter + i) * dim + c]) * x[t * dim + c];
          u += double(w_gate_up[(e * 2 * inter + inter + i) * dim + c]) * x[t * dim + c];
        }
        act[i] = g / (1.0 + std::exp(-g)) * u;
      }
      finish_act(act);
      for (int64_t c = 0; c < dim; ++c) {
        double y = 0.0;
        for (int64_t i = 0; i < inter; ++i) y += double(w_down[(e * dim + c) * inter + i]) * act[i];
        out[t * dim + c] += double(weights[t * pairs + k]) * finish_y(y);
      }
    }
  }
  return out;
}

inline std::vector<double> naive_experts(const ExpertsShape& s, const std::vector<float>& x,
                                         const std::vector<float>& w_gate_up, const std::vector<float>& w_down,
                                         const std::vector<int32_t>& ids, const std::vector<float>& weights) {
  return naive_experts_with(s, x, w_gate_up, w_down, ids, weights, [](std::vector<double>&) {},
                            [](double y) { return y; });
}

// DeepSeek's W8A8 recipe as the CUDA grouped kernels state it (moe_grouped_w8a8.cuh), written out on the host: every
// row of 128 channels of x, and of the SwiGLU output, quantized to e4m3 with scale amax / 448 (v * (1 / scale), nearest
// even, saturating), the products of the codes times the scales summed exactly, act and y rounded to bf16 where the
// kernels store them.
template <typename Value>
void quantize_rows_e4m3(std::vector<Value>& v, int64_t width) {
  for (size_t row = 0; row < v.size(); row += static_cast<size_t>(width)) {
    for (int64_t b = 0; b < width; b += 128) {
      float amax = 0.0f;
      for (int64_t c = b; c < b + 128; ++c) amax = std::max(amax, std::abs(static_cast<float>(v[row + c])));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
      for (int64_t c = b; c < b + 128; ++c) {
        v[row + c] = e4m3_to_float(float_to_e4m3(static_cast<float>(v[row + c]) * inv)) * scale;
      }
    }
  }
}

inline double round_bf16(double v) { return bf16_to_float(float_to_bf16(static_cast<float>(v))); }

inline std::vector<double> naive_experts_w8a8(const ExpertsShape& s, std::vector<float> x,
                                              const std::vector<float>& w_gate_up, const std::vector<float>& w_down,
                                              const std::vector<int32_t>& ids, const std::vector<float>& weights) {
  quantize_rows_e4m3(x, s.dim);
  const auto finish_act = [&](std::vector<double>& act) {
    for (double& a : act) a = round_bf16(a);
    quantize_rows_e4m3(act, s.inter);
  };
  return naive_experts_with(s, x, w_gate_up, w_down, ids, weights, finish_act, round_bf16);
}

// Expert parallelism (ExpertShard, ops/moe.h). The test's own statement of which experts a shard holds, apart from
// ExpertShard::slot: its routed range, and the shared experts (global ids from `routed` on) when it holds them.
inline bool shard_holds(const ExpertShard& shard, int64_t routed, int64_t id) {
  if (shard.all()) return true;
  return id < routed ? id >= shard.first_routed && id < shard.first_routed + shard.num_local_routed
                     : shard.holds_shared;
}

// Shard `index` of `count` (the routed experts split evenly, the remainder on the last ones); the shared experts on
// shard `shared_on` only.
inline ExpertShard even_shard(int64_t routed, int64_t index, int64_t count, int64_t shared_on) {
  const int64_t first = routed * index / count, end = routed * (index + 1) / count;
  return {.first_routed = first, .num_local_routed = end - first, .num_routed = routed,
          .holds_shared = index == shared_on};
}

inline std::string shard_name(const ExpertShard& shard) {
  if (shard.all()) return "";
  return str_cat("_ep_r", shard.first_routed, "_n", shard.num_local_routed, shard.holds_shared ? "_shared" : "");
}

// The part of the whole model's expert values ([routed + shared] experts of `per_expert` values each) a shard's
// weights hold, in its slot order: its routed experts, then the shared ones when it holds them.
template <typename T>
std::vector<T> shard_values(const std::vector<T>& all, int64_t per_expert, const ExpertShard& shard, int64_t routed,
                            int64_t shared) {
  if (shard.all()) return all;
  std::vector<T> held;
  for (int64_t e = 0; e < routed + shared; ++e) {
    if (!shard_holds(shard, routed, e)) continue;
    held.insert(held.end(), all.begin() + e * per_expert, all.begin() + (e + 1) * per_expert);
  }
  return held;
}

// The pairs' weights with those of experts the shard does not hold zeroed: a shard's output is the whole model's op
// over its pairs alone.
inline std::vector<float> held_weights(const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                       const ExpertShard& shard, int64_t routed) {
  std::vector<float> held = weights;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!shard_holds(shard, routed, ids[i])) held[i] = 0.0f;
  }
  return held;
}

// out[t] = sum_k w[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])) over the routed and shared pairs; with a shard,
// over the pairs of the experts it holds, its weights those of the whole model's it holds (the naive side computes
// on the whole model's weights).
inline void add_moe_experts(CaseRegistry& r, const ExpertsShape& s, uint64_t seed, const ExpertShard& shard = {},
                            PairsHeld held = PairsHeld::kAny) {
  Rng rng(seed);
  const int64_t tokens = s.tokens, dim = s.dim, inter = s.inter, experts = s.experts(), pairs = s.pairs();
  const int64_t held_experts = shard.all() ? experts : shard.num_held(s.shared);
  const std::vector<float> x = rng.uniform(tokens * dim);
  const std::vector<float> w_gate_up = rng.uniform(experts * 2 * inter * dim);
  const std::vector<float> w_down = rng.uniform(experts * dim * inter);
  const ExpertPairs routing = random_expert_pairs(rng, s, held, shard);
  const std::vector<float> shard_gate_up = shard_values(w_gate_up, 2 * inter * dim, shard, s.routed, s.shared);
  const std::vector<float> shard_down = shard_values(w_down, dim * inter, shard, s.routed, s.shared);
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_", s.str(), shard_name(shard), held == PairsHeld::kNone ? "_none_held" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({tokens, dim}, DType::kF32);
           run.backend().moe_experts(
               {.x = run.upload(HostTensor::f32({tokens, dim}, x)),
                .w_gate_up = run.upload(HostTensor::f32({held_experts, 2 * inter, dim}, shard_gate_up)),
                .w_down = run.upload(HostTensor::f32({held_experts, dim, inter}, shard_down)),
                .topk_ids = run.upload(HostTensor::i32({tokens, pairs}, routing.ids)),
                .topk_weights = run.upload(HostTensor::f32({tokens, pairs}, routing.weights)),
                .out = out,
                .shard = shard,
                .num_shared_experts = s.shared});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           return {{"out", naive_experts(s, x, w_gate_up, w_down, routing.ids,
                                         held_weights(routing.ids, routing.weights, shard, s.routed))}};
         }});
}

// Block-scaled FP8 expert weights built on the host, as a checkpoint stores them: each expert matrix [rows, cols]
// quantized by 128 x 128 blocks (quantize_fp8_block_rows, scale amax / 448), and the dequantized values the naive
// formulas compute with (what both backends must compute, whatever they do with the activations).
struct Fp8Experts {
  Shape shape;                     // [experts, rows, cols]
  std::vector<uint8_t> codes;      // e4m3
  std::vector<float> scale_inv;    // fp8_scale_shape(shape)
  std::vector<float> dequantized;  // e4m3(code) * scale_inv, [experts, rows, cols]

  static Fp8Experts quantize(std::span<const float> values, int64_t experts, int64_t rows, int64_t cols) {
    Fp8Experts w{.shape = {experts, rows, cols}, .codes = {}, .scale_inv = {}, .dequantized = {}};
    const auto matrix = static_cast<size_t>(rows * cols);
    const auto blocks = static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols));
    DI_CHECK(values.size() == static_cast<size_t>(experts) * matrix, values.size(), " values for ", w.shape.str());
    w.codes.resize(values.size());
    w.scale_inv.resize(static_cast<size_t>(experts) * blocks);
    w.dequantized.resize(values.size());
    for (size_t e = 0; e < static_cast<size_t>(experts); ++e) {
      const std::span<uint8_t> codes(w.codes.data() + e * matrix, matrix);
      const std::span<float> scales(w.scale_inv.data() + e * blocks, blocks);
      quantize_fp8_block_rows(values.subspan(e * matrix, matrix), rows, cols, Fp8ScaleFormat::kFloat, codes, scales);
      dequantize_fp8_blocks(codes, rows, cols, scales, {kFp8Block, kFp8Block},
                            std::span<float>(w.dequantized.data() + e * matrix, matrix));
    }
    return w;
  }

  // The experts a shard holds (shard_values on the codes, scales and dequantized values alike).
  Fp8Experts shard(const ExpertShard& sh, int64_t routed, int64_t shared) const {
    const int64_t per_expert = shape[1] * shape[2];
    const int64_t blocks = fp8_blocks(shape[1]) * fp8_blocks(shape[2]);
    const int64_t held = sh.all() ? shape[0] : sh.num_held(shared);
    return {.shape = {held, shape[1], shape[2]},
            .codes = shard_values(codes, per_expert, sh, routed, shared),
            .scale_inv = shard_values(scale_inv, blocks, sh, routed, shared),
            .dequantized = shard_values(dequantized, per_expert, sh, routed, shared)};
  }

  // The codes and scales in the runner's memory; `w8a8`: WeightView::fp8_activations.
  WeightView upload(OpRunner& run, bool w8a8 = false) const {
    const TensorView c = run.upload(HostTensor::from_raw(shape, DType::kF8E4M3, codes.data()));
    const TensorView s = run.upload(HostTensor::f32(fp8_scale_shape(shape), scale_inv));
    return {ConstTensorView(c), ConstTensorView(s), w8a8};
  }
};

// moe_experts with FP8 weights (fp32 x and out here, the CPU's) against the naive formula on the dequantized weights.
// With a shard, its weights are the quantized whole model's experts it holds (the blocks are per expert), and the
// naive side computes on the whole model's over the pairs it holds.
inline void add_moe_experts_fp8(CaseRegistry& r, const ExpertsShape& s, uint64_t seed, const ExpertShard& shard = {}) {
  Rng rng(seed);
  const int64_t tokens = s.tokens, dim = s.dim, inter = s.inter, experts = s.experts(), pairs = s.pairs();
  const std::vector<float> x = rng.uniform(tokens * dim);
  const Fp8Experts w_gate_up = Fp8Experts::quantize(rng.uniform(experts * 2 * inter * dim), experts, 2 * inter, dim);
  const Fp8Experts w_down = Fp8Experts::quantize(rng.uniform(experts * dim * inter), experts, dim, inter);
  const ExpertPairs routing = random_expert_pairs(rng, s);
  const Fp8Experts shard_gate_up = w_gate_up.shard(shard, s.routed, s.shared);
  const Fp8Experts shard_down = w_down.shard(shard, s.routed, s.shared);
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_fp8_", s.str(), shard_name(shard)),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({tokens, dim}, DType::kF32);
           run.backend().moe_experts({.x = run.upload(HostTensor::f32({tokens, dim}, x)),
                                      .w_gate_up = shard_gate_up.upload(run),
                                      .w_down = shard_down.upload(run),
                                      .topk_ids = run.upload(HostTensor::i32({tokens, pairs}, routing.ids)),
                                      .topk_weights = run.upload(HostTensor::f32({tokens, pairs}, routing.weights)),
                                      .out = out,
                                      .shard = shard,
                                      .num_shared_experts = s.shared});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           return {{"out", naive_experts(s, x, w_gate_up.dequantized, w_down.dequantized, routing.ids,
                                         held_weights(routing.ids, routing.weights, shard, s.routed))}};
         }});
}

// What a moe case returns: its routing outputs as the route cases compare them, the layer output, and with a router
// the logits the op wrote.
inline Outputs moe_outputs(OpRunner& run, const TensorView& ids, const TensorView& weights, const TensorView& out,
                           const TensorView& router_logits, int64_t top_k, int64_t num_shared) {
  Outputs o = sorted_route(run.fetch(ids), run.fetch(weights), top_k, num_shared);
  o.push_back({"out", run.fetch(out)});
  if (router_logits.data != nullptr) o.push_back({"router_logits", run.fetch(router_logits)});
  return o;
}

// The whole routed part (ops/moe.h, MoeArgs): routing from random logits (and a V3 bias), then the routed and shared
// experts on its result; checks the routing outputs (as the route cases do) and the layer output. With `router`, the
// op gets a random router weight instead and computes the logits, which are checked too. With a shard, the weights
// are the experts it holds, routing is the whole model's (global ids), and the output sums the pairs it holds.
inline void add_moe(CaseRegistry& r, const std::string& tag, const RouteConfig& c, int64_t tokens_, int64_t dim_,
                    int64_t inter_, bool bias, uint64_t seed, bool router = false, const ExpertShard& shard = {}) {
  const ExpertsShape s{.tokens = tokens_, .dim = dim_, .inter = inter_, .routed = c.experts, .top_k = c.top_k,
                       .shared = c.num_shared};
  Rng rng(seed);
  const int64_t tokens = s.tokens, dim = s.dim, inter = s.inter, experts = s.experts(), pairs = s.pairs();
  const std::vector<float> given_logits = router ? std::vector<float>{} : rng.uniform(tokens * c.experts, -4.0f, 4.0f);
  const std::vector<float> router_w = router ? rng.uniform(c.experts * dim, -2.0f, 2.0f) : std::vector<float>{};
  const std::vector<float> bias_values = bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{};
  const std::vector<float> x = rng.uniform(tokens * dim);
  const std::vector<float> w_gate_up = rng.uniform(experts * 2 * inter * dim);
  const std::vector<float> w_down = rng.uniform(experts * dim * inter);
  const int64_t held_experts = shard.all() ? experts : shard.num_held(s.shared);
  const std::vector<float> shard_gate_up = shard_values(w_gate_up, 2 * inter * dim, shard, s.routed, s.shared);
  const std::vector<float> shard_down = shard_values(w_down, dim * inter, shard, s.routed, s.shared);
  // The router's logits in double, as the naive side routes on them.
  std::vector<float> router_logits;
  if (router) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < c.experts; ++e) {
        double acc = 0.0;
        for (int64_t d = 0; d < dim; ++d) acc += double(x[t * dim + d]) * router_w[e * dim + d];
        router_logits.push_back(static_cast<float>(acc));
      }
    }
  }
  r.add({.op = OpKind::kMoe,
         .name = str_cat("moe_", tag, "_", s.str(), router ? "_router" : "", shard_name(shard)),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView ids = run.output({tokens, pairs}, DType::kI32);
           const TensorView weights = run.output({tokens, pairs}, DType::kF32);
           const TensorView out = run.output({tokens, dim}, DType::kF32);
           const TensorView logits_out = router ? run.output({tokens, c.experts}, DType::kF32) : TensorView{};
           const auto bias_len = static_cast<int64_t>(bias_values.size());
           run.backend().moe({.route = {.logits = router ? ConstTensorView(logits_out)
                                                         : ConstTensorView(run.upload(HostTensor::f32(
                                                               {tokens, c.experts}, given_logits))),
                                        .correction_bias = run.upload(HostTensor::f32({bias_len}, bias_values)),
                                        .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring,
                                        .method = c.method, .n_group = c.n_group, .topk_group = c.topk_group,
                                        .norm_topk_prob = c.norm_topk_prob,
                                        .routed_scaling_factor = c.routed_scaling_factor,
                                        .num_shared_experts = c.num_shared},
                              .x = run.upload(HostTensor::f32({tokens, dim}, x)),
                              .w_gate_up = run.upload(HostTensor::f32({held_experts, 2 * inter, dim}, shard_gate_up)),
                              .w_down = run.upload(HostTensor::f32({held_experts, dim, inter}, shard_down)),
                              .out = out,
                              .router = router ? ConstTensorView(run.upload(HostTensor::f32({c.experts, dim},
                                                                                            router_w)))
                                               : ConstTensorView{},
                              .router_logits = logits_out,
                              .shard = shard});
           return moe_outputs(run, ids, weights, out, logits_out, c.top_k, c.num_shared);
         },
         .naive = [=]() -> Outputs {
           const std::vector<float>& logits = router ? router_logits : given_logits;
           std::vector<double> ids, weights;
           for (int64_t t = 0; t < tokens; ++t) {
             naive_route_token(c, logits.data() + t * c.experts, bias_values, ids, weights);
           }
           Outputs o = sorted_route(ids, weights, c.top_k, c.num_shared);
           const std::vector<int32_t> int_ids(ids.begin(), ids.end());
           const std::vector<float> float_weights(weights.begin(), weights.end());
           o.push_back({"out", naive_experts(s, x, w_gate_up, w_down, int_ids,
                                             held_weights(int_ids, float_weights, shard, c.experts))});
           if (router) o.push_back({"router_logits", std::vector<double>(router_logits.begin(), router_logits.end())});
           return o;
         }});
}

}  // namespace deepinfer::op_test
