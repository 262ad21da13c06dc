// Parameters of the mla_prepare kernel: for each token t, in place,
//   latent[t, :rank] = rms_norm(latent[t, :rank]) * kv_a_norm   c_kv, also written to its cache row
//   latent[t, rank:] = rope(latent[t, rank:])                    k_pe, also written to its cache row
//   q[t, h, nope:]   = rope(q[t, h, nope:]) for every head h      q_pe, also into q_abs[t, h, rank:] if t < num_decode
// The cache row of token t is slot_mapping[t]; a slot outside [0, num_slots) is skipped (-1 marks a padding token),
// as in the latent-cache write. Rope is the rope kernel's (rope_params.h): pair i is (2i, 2i + 1) when interleaved,
// else (i, i + rope_dim / 2), rotated by position * inv_freq[i] with cos and sin scaled by attention_scaling.
// Elements are float32 or bfloat16 (the launcher's dtype); the math is fp32. The cache holds the same elements, or
// FP8 rows (backend/ops/latent_fp8.h; the launcher's choice, from the cache's dtype): then each token's cache row is
// quantize_latent_fp8_row of its latent row as the kernel wrote it back.
#pragma once

#include <cstdint>

#include "backend/cuda/mla/latent_fp8_row_params.h"

namespace deepinfer::cuda {

struct MlaPrepareParams {
  void* latent = nullptr;                 // [num_tokens, rank + rope_dim]: c_kv | k_pe
  void* q = nullptr;                      // [num_tokens, num_heads, nope + rope_dim]: q_nope | q_pe
  void* q_abs = nullptr;                  // [num_decode, num_heads, rank + rope_dim]; null when num_decode is 0
  void* cache = nullptr;                  // [num_slots, rank + rope_dim] = [num_pages, page_size, rank + rope_dim],
                                          // or FP8 rows [num_slots, fp8_row.row_bytes]
  const int32_t* slot_mapping = nullptr;  // [num_tokens], device memory
  const int32_t* positions = nullptr;     // [num_tokens], device memory
  const float* kv_a_norm = nullptr;       // [rank], device memory
  const float* inv_freq = nullptr;        // [rope_dim / 2], device memory
  int64_t num_tokens = 0;
  int64_t num_decode = 0;                 // the first num_decode tokens also fill q_abs
  int64_t num_heads = 0;
  int64_t rank = 0;                       // kv_lora_rank: the normalized columns of a latent row
  int64_t nope = 0;                       // q columns before the rope ones in each head
  int64_t rope_dim = 0;                   // even
  int64_t num_slots = 0;
  int64_t heads_per_block = 1;            // q heads one block rotates (the launcher's split of a token's heads)
  float eps = 1e-6f;
  float attention_scaling = 1.0f;
  bool interleaved = true;
  LatentFp8RowParams fp8_row;             // the FP8 cache's row layout (unused for a cache of elements)
};

}  // namespace deepinfer::cuda
