// DeepSeekMoE: routing and the routed experts' SwiGLU FFN with the weighted combine.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/weight.h"
#include "model/config.h"

namespace deepinfer {

// Chooses top_k experts per token from router logits (V2: softmax, greedy or group-limited by group max;
// V3: sigmoid, selection on score + e_score_correction_bias, group score = sum of the top-2 biased scores,
// non-selected groups masked with -inf). Weights are the unbiased scores of the chosen experts, normalized
// when norm_topk_prob, times routed_scaling_factor.
//
// With num_shared_experts = s, each token's row has top_k + s pairs: its top_k routed experts first, then the shared
// experts E .. E + s - 1 (E = logits.shape[1]) in order, each with weight exactly 1 (never normalized or scaled). The
// experts op then computes routed and shared experts together, on weights that stack the shared experts after the
// routed ones.
struct MoeRouteArgs {
  ConstTensorView logits;          // [T, E] float32
  ConstTensorView correction_bias; // [E] or empty (V3 only)
  TensorView topk_ids;             // [T, top_k + s] int32: routed ids in [0, E), then E .. E + s - 1
  TensorView topk_weights;         // [T, top_k + s] float32: routed weights, then s times 1.0
  ExpertScoring scoring = ExpertScoring::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  int64_t num_shared_experts = 0;  // s
  void validate() const;
};

// The experts a layer's weights hold under expert parallelism: routed experts [first_routed, first_routed +
// num_local_routed) of num_routed (global ids, as routing writes them) in slots [0, num_local_routed), then, when
// holds_shared, the shared experts (global ids num_routed .. num_routed + s - 1) in the slots after them. Pairs of
// experts the weights do not hold add nothing: a token none of whose experts is held gets a zero row, and the ranks'
// outputs sum to the whole layer's. The default (num_local_routed < 0) holds every expert: ids index the weights.
struct ExpertShard {
  int64_t first_routed = 0;
  int64_t num_local_routed = -1;
  int64_t num_routed = 0;
  bool holds_shared = true;

  bool all() const { return num_local_routed < 0; }
  // Experts the weights hold, with s shared experts in the model.
  int64_t num_held(int64_t num_shared) const { return num_local_routed + (holds_shared ? num_shared : 0); }
  // The weights' slot of global expert `id`, or -1 when they do not hold it.
  int64_t slot(int64_t id) const {
    if (all()) return id;
    if (id < num_routed) return id >= first_routed && id < first_routed + num_local_routed ? id - first_routed : -1;
    return holds_shared ? num_local_routed + (id - num_routed) : -1;
  }
};

// out[t] = sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, k]. E counts every
// expert of the weights (routed and shared) and top_k every pair of a token (moe_route's top_k + s). Under a shard,
// the ids are global, e is the weights' slot of topk_ids[t, k] (ExpertShard::slot), and pairs it does not hold add
// nothing.
struct MoeExpertsArgs {
  ConstTensorView x;             // [T, D]
  WeightView w_gate_up;          // [E, 2I, D]  gate rows then up rows (bf16, or FP8 with per-expert block scales)
  WeightView w_down;             // [E, D, I]
  ConstTensorView topk_ids;      // [T, top_k] int32, each in [0, E); under a shard in [0, num_routed + s)
  ConstTensorView topk_weights;  // [T, top_k] float32
  TensorView out;                // [T, D]  overwritten
  ExpertShard shard;             // default: the weights hold every expert
  int64_t num_shared_experts = 0;  // s, read under a shard only (the weights' expert count and the ids' range)
  void validate() const;
};

// The routed part of a MoE layer in one op: moe_route(route), then moe_experts on its ids and weights. That
// composition defines it (Backend::moe, moe_composed.cpp). A backend that groups the (token, pair) rows by expert
// while it routes (the CUDA kernels) overrides it and does not group them a second time. route.topk_ids and
// route.topk_weights are written as moe_route writes them.
struct MoeArgs {
  MoeRouteArgs route;
  ConstTensorView x;          // [T, D]
  WeightView w_gate_up;       // [E + s, 2I, D]  the routed experts, then the shared ones (a shard: the ones it holds)
  WeightView w_down;          // [E + s, D, I]
  TensorView out;             // [T, D]  overwritten
  // The router, optional. Given ([E, D], x's dtype), the op first writes router_logits = x · router^T (float32,
  // [T, E], the buffer route.logits views), then routes on them: a backend may then compute the logits inside its
  // routing (the CUDA kernels do at decode sizes). Empty: route.logits is an input and router_logits stays empty.
  ConstTensorView router;
  TensorView router_logits;
  // The experts the weights hold (num_routed = E when not all): routing still runs over all E and writes global ids.
  ExpertShard shard;

  // The experts half, on the routing outputs.
  MoeExpertsArgs experts() const {
    return {.x = x, .w_gate_up = w_gate_up, .w_down = w_down, .topk_ids = route.topk_ids,
            .topk_weights = route.topk_weights, .out = out, .shard = shard,
            .num_shared_experts = route.num_shared_experts};
  }
  void validate() const;
};

}  // namespace deepinfer
