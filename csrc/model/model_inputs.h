// What the layers read of one step: views on the backend's device of the step's index arrays. The engine builds,
// checks and uploads them (engine/step_batch.h); the model only runs its layers over them.
#pragma once

#include <cstdint>

#include "backend/ops/attention_metadata.h"
#include "core/tensor.h"

namespace deepinfer {

// Every value was checked on the host before the upload: device ops do not re-check.
struct ModelInputs {
  ConstTensorView token_ids;       // [T]
  ConstTensorView positions;       // [T]
  ConstTensorView slot_mapping;    // [T]  page_id * page_size + offset: where each token's latent goes
  ConstTensorView logits_indices;  // [N]  rows whose next-token logits are wanted
  AttentionMetadata decode;        // sequences [0, num_decode_seqs): one query each, the absorbed decode path
  AttentionMetadata prefill;       // the rest
  int64_t num_tokens = 0;
  int64_t num_decode_seqs = 0;
  int64_t num_logits = 0;
  // Data-parallel attention: the most tokens any rank of the group computes this step. The MoE layers gather every
  // rank's tokens padded to this many (0: no DP group).
  int64_t dp_max_tokens = 0;
};

}  // namespace deepinfer
