// Parameters of the MLA prefill kernels over the paged bf16 latent cache (DeepSeek dims: kv_lora_rank 512, rope 64,
// qk_nope 128, v 128). Semantics are the CPU reference's (backend/cpu/mla.cpp, mla_prefill):
//
//   For sequence s with n = query_start[s+1] - query_start[s] > 0 queries and context c = context_lens[s], query i
//   (row query_start[s] + i) sits at position c - n + i and sees keys j <= that position. Key j's latent row is
//   cache[page_table[s, j / page_size], j % page_size, :] = c_kv (512) | k_pe (64); for head h
//     k_nope[j, h] | v[j, h] = c_kv[j] · kv_b[h * 256 .. h * 256 + 256)^T  (128 k_nope rows, then 128 v rows)
//     score = softmax_scale * (q[row, h, :128] · k_nope[j, h] + q[row, h, 128:] · k_pe[j])
//     out[row, h, :] = softmax over j of score, times v[j, h]
//
// Three steps share one workspace: gather (each sequence's latent rows into `latents`: sequence s's key j at row
// start(s) + j, start(s) = context_lens[0] + ... + context_lens[s - 1], so the rows are the sum of the contexts),
// a cuBLAS GEMM (kv = latents[:, :512] · kv_b^T), then the attention kernel. All tensors are contiguous; bf16 values
// are stored as their 16-bit patterns (uint16_t). Over an FP8 cache (backend/ops/latent_fp8.h) the gather widens each
// row into the same bf16 workspace row (c_kv = e4m3 code * power-of-two scale, exact in bf16; k_pe copied), and the
// later steps do not see the difference.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// Step 1: the gather, from the bf16 cache or (cache_fp8 set instead) the FP8 one.
struct MlaPrefillGatherParams {
  const uint16_t* cache = nullptr;         // [num_pages, page_size, 576]
  const uint8_t* cache_fp8 = nullptr;      // [num_pages, page_size, 656]: 512 codes, 4 scales, 64 bf16 k_pe
  const int32_t* page_table = nullptr;     // [num_seqs, max_pages_per_seq]; only the first ceil(ctx / page_size) read
  const int32_t* context_lens = nullptr;   // [num_seqs], device memory
  const int32_t* query_start = nullptr;    // [num_seqs + 1], device memory: sequences without queries are skipped
  uint16_t* latents = nullptr;             // [sum of context_lens, 576]
  int32_t num_seqs = 0;
  int32_t page_size = 64;                  // tokens per page, any positive value
  int32_t max_pages_per_seq = 0;           // row length of page_table
  int32_t max_context_len = 0;             // host-side upper bound of context_lens
};

// Which attention kernel runs step 3: Hopper's warpgroup MMA (mla_prefill_wgmma.cuh, 128-query tiles, the engine's
// default since it measured a lower TTFT at 8k and 32k prompts) or mma.sync (mla_prefill_kernels.cuh,
// 64-query tiles). Both compute the same thing.
enum class MlaPrefillKernel : int32_t { kMma = 0, kWgmma = 1 };

// Step 3: causal attention over the decompressed keys and values.
struct MlaPrefillAttentionParams {
  const uint16_t* q = nullptr;             // [num_tokens, num_heads, 192]: q_nope (128) then rotated q_pe (64)
  const uint16_t* latents = nullptr;       // [sum of context_lens, 576]: the gather's rows (k_pe at 512)
  const uint16_t* kv = nullptr;            // [sum of context_lens, num_heads * 256]: k_nope | v per head
  const int32_t* context_lens = nullptr;   // [num_seqs], device memory
  const int32_t* query_start = nullptr;    // [num_seqs + 1], device memory
  uint16_t* out = nullptr;                 // [num_tokens, num_heads, 128]
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t max_context_len = 0;             // host-side upper bound of context_lens
  int32_t max_queries = 0;                 // host-side upper bound of any sequence's query count (sizes the grid)
  float softmax_scale = 1.0f;
  MlaPrefillKernel kernel = MlaPrefillKernel::kWgmma;
};

}  // namespace deepinfer::cuda
