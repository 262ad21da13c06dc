// Which tensors of an op's prefetch hint (MultiLinearArgs::prefetch) a kernel pulls into L2.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cuda/l2_prefetch_params.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

// The tensors in order, each whole while `budget_bytes` holds it (part of a tensor would leave the rest to stream
// when it is read anyway), at most kL2PrefetchMaxRegions of them. Empty tensors are skipped; the first tensor that
// does not fit, or that is not 16-byte aligned and a multiple of 16 bytes, ends the plan.
L2PrefetchRegions plan_l2_prefetch(std::span<const ConstTensorView> tensors, int64_t budget_bytes, bool after_wait);

}  // namespace deepinfer::cuda
