// How many 8-row token tiles one pass of the small-M expert kernels computes (moe_small_gemm.cuh): one or four.
//
// A pass streams every weight of its expert once, and an expert with more rows than a pass holds streams them again
// in the next pass; a wider pass costs registers, and MMAs and activation loads for rows most experts do not have.
// So the routed experts' average rows decide (routed pairs over routed experts), not the token count. Measured on an
// H100 (moe_bench --small and the engine's v3-slice; benchmarks/results/fp8_h200.md, "MoE small-M: one token tile"):
//   - bf16: one tile is faster below 4 rows an expert on average (V2-Lite at 16-32 tokens, V3 at 16-64), four from 4
//     on (the engine at V3's 128 tokens, 4 rows: one tile 4.6% slower; V2-Lite at 64 tokens, 6 rows: 7% slower);
//   - FP8: the four-tile kernel spills registers, and one tile is faster at every size measured, up to 6 rows an
//     expert on average (V3 at 16-128 tokens, V2-Lite at 64);
//   - INT4 and FP4 keep the rule they were measured with: one tile up to 8 tokens (no expert then has more than 8
//     rows), four beyond.
// Past 8 rows an expert on average the grouped kernels take the layer (moe_experts.cu, moe_resolve_path).
#pragma once

#include <cstdint>

#include "backend/cuda/moe/moe_params.h"

namespace deepinfer::cuda {

inline constexpr int64_t kMoeOneTileMaxTokens = 8;
inline constexpr int64_t kMoeBf16OneTileBelowRows = 4;  // average rows an expert below which bf16 takes one tile
inline constexpr int64_t kMoeFp8OneTileMaxRows = 6;     // average rows an expert up to which FP8 takes one tile

// tokens: rows of the layer; routed_per_token: the routed experts a token chooses (top_k without the shared ones);
// routed_experts: the experts routing chooses among (the whole model's under a shard).
inline int moe_small_token_tiles(int64_t tokens, int64_t routed_per_token, int64_t routed_experts,
                                 MoeWeightFormat format) {
  if (tokens <= kMoeOneTileMaxTokens) return 1;
  const int64_t pairs = tokens * routed_per_token;
  switch (format) {
    case MoeWeightFormat::kBf16: return pairs < kMoeBf16OneTileBelowRows * routed_experts ? 1 : 4;
    case MoeWeightFormat::kFp8: return pairs <= kMoeFp8OneTileMaxRows * routed_experts ? 1 : 4;
    case MoeWeightFormat::kInt4:
    case MoeWeightFormat::kFp4: return 4;
  }
  return 4;
}

}  // namespace deepinfer::cuda
