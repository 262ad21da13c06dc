#include "model/model_shard.h"

#include "core/error.h"

namespace deepinfer {

void ModelShard::validate(const ModelConfig& c) const {
  DI_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of ", size, " tensor-parallel ranks");
  DI_CHECK_ARG(!dp_attention || expert_parallel, "data-parallel attention needs expert parallelism for the experts "
               "(enable_expert_parallel): a rank's tokens meet the others' only in the MoE layers");
  if (size == 1) return;
  if (dp_attention) {
    DI_CHECK_ARG(c.n_routed_experts > 0, "data-parallel attention over ", size, " ranks needs a MoE model");
    DI_CHECK_ARG(size <= c.n_routed_experts, "expert parallelism over ", size, " ranks needs at least as many "
                 "routed experts; the model has ", c.n_routed_experts);
    DI_CHECK_ARG(c.n_routed_experts % size == 0, "data-parallel attention over ", size,
                 " ranks: the ranks do not divide n_routed_experts (", c.n_routed_experts, ")");
    return;
  }
  const auto divides = [&](int64_t value, const char* what) {
    DI_CHECK_ARG(value % size == 0, "tensor_parallel_size ", size, " does not divide ", what, " (", value, ")");
  };
  divides(c.num_attention_heads, "num_attention_heads");
  divides(c.vocab_size, "vocab_size");
  divides(c.intermediate_size, "intermediate_size");
  if (c.n_routed_experts == 0) return;
  divides(c.n_shared_experts * c.moe_intermediate_size, "the shared experts' width (n_shared_experts * "
          "moe_intermediate_size)");
  if (expert_parallel) {
    DI_CHECK_ARG(size <= c.n_routed_experts, "expert parallelism over ", size, " ranks needs at least as many "
                 "routed experts; the model has ", c.n_routed_experts);
    divides(c.n_routed_experts, "n_routed_experts");
  } else {
    divides(c.moe_intermediate_size, "moe_intermediate_size");
  }
}

int64_t ModelShard::num_experts(const ModelConfig& c) const {
  return expert_parallel ? c.n_routed_experts / size : c.n_routed_experts;
}

int64_t ModelShard::first_expert(const ModelConfig& c) const { return expert_parallel ? rank * num_experts(c) : 0; }

ModelConfig local_config(const ModelConfig& config, const ModelShard& shard) {
  shard.validate(config);
  ModelConfig c = config;
  if (!shard.splits_attention()) return c;
  c.num_attention_heads /= shard.size;
  c.vocab_size /= shard.size;
  c.intermediate_size /= shard.size;
  if (!shard.expert_parallel) c.moe_intermediate_size /= shard.size;
  return c;
}

}  // namespace deepinfer
