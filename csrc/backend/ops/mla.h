// Multi-head Latent Attention over the paged latent cache.
//
// Cache layout, one layer: [num_pages, page_size, latent_dim] with latent_dim = kv_lora_rank + rope_dim; a token's
// row holds the normalized c_kv (kv_a_layernorm output) followed by its rotated k_pe. Nothing else is cached.
#pragma once

#include <cstdint>

#include "backend/ops/attention_metadata.h"
#include "core/tensor.h"

namespace deepinfer {

// cache[slot / page_size, slot % page_size, :] = latent[t, :] for every token t.
struct MlaCacheWriteArgs {
  ConstTensorView latent;        // [T, latent_dim]
  TensorView cache;              // [num_pages, page_size, latent_dim]
  ConstTensorView slot_mapping;  // [T] int32, each in [0, num_pages * page_size)
  void validate() const;
};

// Absorbed decode: each sequence has one query, row s of q; all heads share the latent rows of its pages.
//   scores[h, j] = scale * (q_latent[h] · c_kv[j] + q_pe[h] · k_pe[j]);  out[h] = softmax(scores[h]) · c_kv
// q is one tensor, q_latent (q_nope · W_UK) then the rotated q_pe in each head row, as the CUDA kernel reads it.
struct MlaDecodeArgs {
  ConstTensorView q;          // [S, H, kv_lora_rank + rope_dim]
  ConstTensorView cache;      // [num_pages, page_size, kv_lora_rank + rope_dim]
  TensorView out_latent;      // [S, H, kv_lora_rank]
  AttentionMetadata meta;     // S sequences of exactly one query each (query_start 0, 1, ..., S up to an offset)
  int64_t kv_lora_rank = 0;
  float softmax_scale = 1.0f;
  void validate() const;
};

// Prefill (and chunked prefill over a cached prefix): keys and values are decompressed from the cache with
// kv_b_proj, then causal attention with q/k head size nope + rope and v head size v_head_dim.
struct MlaPrefillArgs {
  ConstTensorView q;          // [T, H, nope + rope]   rope part rotated
  ConstTensorView cache;      // [num_pages, page_size, kv_lora_rank + rope_dim]
  ConstTensorView kv_b;       // [H * (nope + v), kv_lora_rank]
  TensorView out;             // [T, H, v]
  AttentionMetadata meta;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t v_head_dim = 0;
  float softmax_scale = 1.0f;
  void validate() const;
};

}  // namespace deepinfer
