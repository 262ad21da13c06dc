// Multi-head Latent Attention over the paged latent cache.
//
// Cache layout, one layer: [num_pages, page_size, latent_dim] with latent_dim = kv_lora_rank + rope_dim; a token's
// row holds the normalized c_kv (kv_a_layernorm output) followed by its rotated k_pe. Nothing else is cached.
#pragma once

#include <cstdint>
#include <span>

#include "backend/ops/attention_metadata.h"
#include "core/tensor.h"

namespace deepinfer {

// cache[slot / page_size, slot % page_size, :] = latent[t, :] for every token t.
struct MlaCacheWriteArgs {
  ConstTensorView latent;              // [T, latent_dim]
  TensorView cache;                    // [num_pages, page_size, latent_dim]
  std::span<const int32_t> slot_mapping;  // [T]
  void validate() const;
};

// Absorbed decode: each sequence has one query; all heads share the latent rows of its pages.
//   scores[h, j] = scale * (q_latent[h] · c_kv[j] + q_pe[h] · k_pe[j]);  out[h] = softmax(scores[h]) · c_kv
struct MlaDecodeArgs {
  ConstTensorView q_latent;   // [T, H, kv_lora_rank]   q_nope already multiplied by W_UK
  ConstTensorView q_pe;       // [T, H, rope_dim]       rotated
  ConstTensorView cache;      // [num_pages, page_size, kv_lora_rank + rope_dim]
  TensorView out_latent;      // [T, H, kv_lora_rank]
  AttentionMetadata meta;     // sequences with exactly one query each; rows = query_start
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
