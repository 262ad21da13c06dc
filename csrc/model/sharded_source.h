// One rank's view of a checkpoint under tensor parallelism: the tensors the loader asks for, in the shapes of the
// rank's part (local_config), read as that rank's slice of the stored tensors. No rank reads the others' slices
// into memory.
#pragma once

#include <memory>
#include <string>

#include "model/model_shard.h"
#include "model/weights.h"

namespace deepinfer {

// How a stored tensor is split across the TP ranks (model_shard.h says why each is split so).
enum class TensorSplit : uint8_t {
  kReplicated,
  kRows,          // the output features: q/q_b/kv_b by heads, gate/up by channels, embedding and lm_head by vocab
  kColumns,       // the input features: o_proj by heads, down_proj by channels
  kHalvesRows,    // a fused [E, 2I, D] gate_up: the rows of each half (gate, up), per expert
};
// Routed experts are whole under expert parallelism (their ranks hold whole experts; the loader picks them).
TensorSplit tensor_split(const std::string& name, bool expert_parallel);

// `inner` (which must outlive it) read through `shard`. Without TP (one rank, or data-parallel attention) it reads
// `inner`'s whole tensors.
std::unique_ptr<WeightSource> make_sharded_source(const WeightSource& inner, const ModelShard& shard);

}  // namespace deepinfer
