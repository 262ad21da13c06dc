// DeepSeekMoE: routing and the routed experts' SwiGLU FFN with the weighted combine.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/config.h"

namespace deepinfer {

// Chooses top_k experts per token from router logits (V2: softmax, greedy or group-limited by group max;
// V3: sigmoid, selection on score + e_score_correction_bias, group score = sum of the top-2 biased scores,
// non-selected groups masked with -inf). Weights are the unbiased scores of the chosen experts, normalized
// when norm_topk_prob, times routed_scaling_factor.
struct MoeRouteArgs {
  ConstTensorView logits;          // [T, E] float32
  ConstTensorView correction_bias; // [E] or empty (V3 only)
  TensorView topk_ids;             // [T, top_k] int32
  TensorView topk_weights;         // [T, top_k] float32
  ExpertScoring scoring = ExpertScoring::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  void validate() const;
};

// out[t] = sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, k].
struct MoeExpertsArgs {
  ConstTensorView x;             // [T, D]
  ConstTensorView w_gate_up;     // [E, 2I, D]  gate rows then up rows
  ConstTensorView w_down;        // [E, D, I]
  ConstTensorView topk_ids;      // [T, top_k] int32, each in [0, E)
  ConstTensorView topk_weights;  // [T, top_k] float32
  TensorView out;                // [T, D]  overwritten
  void validate() const;
};

}  // namespace deepinfer
