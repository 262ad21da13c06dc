// The step's int32 arrays (index arrays and sampling inputs) packed back to back, so that one host-to-device copy
// moves all of them, and the device views the ops take of them.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/ops/attention_metadata.h"
#include "model/forward_batch.h"

namespace deepinfer {

// Where each array starts in the packed buffer (elements). The index arrays come first, in an order that depends
// only on the batch's shape (tokens, sequences, page-table width), so a graph recorded for one shape finds them at
// the same place in every later step of that shape; the sampling inputs follow. Every array starts at a multiple of
// kAlignment elements (16 bytes), since kernels load some of them (the sampling rows) as vectors or structs.
struct StepLayout {
  enum Part : uint8_t {
    kTokenIds, kPositions, kSlotMapping, kLogitsIndices, kQueryStart, kContextLens, kPageTable,
    kSamplingRows, kPenaltyTokens, kPenaltyCounts, kMaskedTokens, kNumParts,
  };
  static constexpr int64_t kAlignment = 4;
  std::array<int64_t, kNumParts> start{};
  std::array<int64_t, kNumParts> count{};
  int64_t packed_size = 0;  // elements, padding included

  int64_t begin(Part p) const { return start[p]; }
  int64_t size(Part p) const { return count[p]; }
  int64_t total() const { return packed_size; }
};

// Appends the batch's arrays to `out` (cleared first) and returns their layout.
StepLayout pack_step(const ForwardBatch& batch, std::vector<int32_t>& out);

// The views of one step's arrays in device memory (or host memory, on the CPU), and its host-side sizes.
struct StepInputs {
  ConstTensorView token_ids;       // [T]
  ConstTensorView positions;       // [T]
  ConstTensorView slot_mapping;    // [T]
  ConstTensorView logits_indices;  // [N]
  AttentionMetadata decode;        // sequences [0, num_decode_seqs)
  AttentionMetadata prefill;       // the rest
  ConstTensorView sampling_rows;   // [N, kSamplingRowWords] (empty without sampling inputs)
  ConstTensorView penalty_tokens;  // [P]
  ConstTensorView penalty_counts;  // [P]
  ConstTensorView masked_tokens;   // [M]
  int64_t num_tokens = 0;
  int64_t num_decode_seqs = 0;
  int64_t num_logits = 0;
};

// Views of `packed` (laid out by pack_step for `batch`) as the step's inputs.
StepInputs bind_step(ConstTensorView packed, const StepLayout& layout, const ForwardBatch& batch);

}  // namespace deepinfer
