// Turns a scheduler plan into its step: the flat ForwardBatch (decode sequences first) with the sampling inputs of
// the requests that sample.
#pragma once

#include <cstdint>

#include "engine/scheduler.h"
#include "engine/step_batch.h"

namespace deepinfer {

StepBatch build_step_batch(const SchedulePlan& plan, int32_t page_size, int32_t vocab_size);

}  // namespace deepinfer
