// Which part of the model one rank holds.
//
// Tensor parallelism (TP, tp_size ranks): every rank holds num_attention_heads / tp of the MLA heads (the rows of
// q_proj / q_b_proj and kv_b_proj of its heads, the columns of o_proj), intermediate_size / tp channels of each dense
// MLP and of the shared experts, and vocab_size / tp rows of the embedding and of lm_head. Without expert
// parallelism every routed expert is split the same way (moe_intermediate_size / tp channels of each). The latent
// cache is shared by all heads, so every TP rank holds all of it; the low-rank projections (q_a, kv_a), the norms and
// the router are replicated.
//
// Expert parallelism (EP, ep_size ranks, the same ranks as TP): the routed experts are partitioned instead, rank r
// holding experts [r E / ep, (r + 1) E / ep) whole; the shared experts stay split as under TP.
//
// Each rank's partial results (o_proj, the MLP's down_proj, the experts) are summed by an all-reduce.
//
// Data-parallel attention (dp_attention, with EP; DeepSeek's production layout): every rank holds the whole model
// but its share of the routed experts, and runs attention, the dense layers and the shared experts for its own
// requests with its own latent cache. The MoE layers gather every rank's tokens, compute the rank's experts for all
// of them and scatter the sums back (all-gather, reduce-scatter).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace deepinfer {

struct ModelShard {
  int32_t rank = 0;
  int32_t size = 1;             // TP ranks (1: the whole model)
  bool expert_parallel = false;  // routed experts partitioned across the ranks instead of split
  bool dp_attention = false;     // attention data-parallel (each rank its own requests), experts expert-parallel

  bool whole() const { return size == 1; }
  // Whether this rank holds a slice of the attention, dense layers and vocabulary (tensor parallelism).
  bool splits_attention() const { return size > 1 && !dp_attention; }
  // Throws InvalidArgument naming the values when `config` cannot be split this way (heads, intermediate sizes,
  // vocabulary or experts not divisible by the ranks, more ranks than experts).
  void validate(const ModelConfig& config) const;
  // The routed experts this rank holds: [first_expert(), first_expert() + num_experts()).
  int64_t num_experts(const ModelConfig& config) const;
  int64_t first_expert(const ModelConfig& config) const;
};

// The dimensions of one rank's part: heads, intermediate sizes and vocabulary divided by the ranks (the routed
// experts' intermediate size only without EP). Everything else as in `config`. The loader reads shapes from it.
ModelConfig local_config(const ModelConfig& config, const ModelShard& shard);

}  // namespace deepinfer
