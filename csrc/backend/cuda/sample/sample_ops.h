// Sampling on the device (ops/sample.h): penalties, masks (token lists and grammar bitmaps), temperature, top-k /
// top-p / min-p, the draw and the logprobs of each row of logits, all in one launch with no host synchronization (the
// only device-to-host copy of a step is its tokens).
//
// How it runs: one group of CTAs per row (sample.cu: a cluster of up to 8 CTAs when there are few rows, partial
// results meeting in distributed shared memory). A first pass reads the row, applying penalties and masks, and finds
// the greedy token; rows with top-k or top-p then keep only the tokens at or above a floor that no other token can
// reach, and radix selects over order-preserving keys find the thresholds the CPU reference computes; the draw races
// counter-based Gumbel noise (core/counter_rng.h). The entry point checks that the inputs are device tensors and
// queues the kernel on the context's stream.
#pragma once

#include "backend/ops/sample.h"

namespace deepinfer::cuda {

class CudaContext;

void sample(CudaContext& ctx, const SampleArgs& a);

}  // namespace deepinfer::cuda
