// What attention ops need to find each sequence's queries and its pages in the latent cache.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace deepinfer {

// Sequences [0, num_seqs) of a flat batch. Sequence s owns query rows [query_start[s], query_start[s+1]) and,
// after this step's cache write, `context_lens[s]` cached tokens; its query i sits at absolute position
// context_lens[s] - num_queries + i. Page p of sequence s is page_table[s, p].
//
// The three arrays are int32 tensors on the op's device (the engine uploads them once per step); the scalars are
// host values. validate() checks the arrays' values only when they are in host memory; a device backend trusts
// them (ForwardBatch::validate checked them on the host before the upload).
struct AttentionMetadata {
  ConstTensorView query_start;   // [num_seqs + 1] int32
  ConstTensorView context_lens;  // [num_seqs] int32
  ConstTensorView page_table;    // [num_seqs, max_pages_per_seq] int32; entries past a sequence's pages unused
  int32_t num_seqs = 0;
  int32_t max_pages_per_seq = 0;
  int32_t max_context_len = 0;   // >= every context_lens[s]; the CUDA decode picks its split count from it
  int64_t total_context_len = 0; // the sum of context_lens (0 = not given: a backend bounds it by num_seqs x max)

  // Element reads: host tensors only (the CPU backend and validate()).
  int32_t query_begin(int32_t s) const { return query_start.as<int32_t>()[s]; }
  int32_t num_queries(int32_t s) const { return query_begin(s + 1) - query_begin(s); }
  int32_t context_len(int32_t s) const { return context_lens.as<int32_t>()[s]; }
  int32_t page(int32_t s, int32_t p) const {
    return page_table.as<int32_t>()[static_cast<int64_t>(s) * max_pages_per_seq + p];
  }
};

}  // namespace deepinfer
