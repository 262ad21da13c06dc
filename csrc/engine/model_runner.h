// Turns a scheduler plan into the model's flat ForwardBatch (decode sequences first).
#pragma once

#include <vector>

#include "engine/scheduler.h"
#include "model/forward_batch.h"

namespace deepinfer {

struct PreparedBatch {
  ForwardBatch batch;
  // For every sampling chunk in plan order: its row in the logits the model returns.
  std::vector<int32_t> logits_row_of_sampling_chunk;
  std::vector<const ScheduledChunk*> sampling_chunks;  // plan order
};

PreparedBatch prepare_batch(const SchedulePlan& plan, int32_t page_size);

}  // namespace deepinfer
