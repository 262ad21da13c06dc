#include "model/deepseek.h"

#include <cstring>

namespace deepinfer {

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(backend),
      rope_(compute_rope_tables(config_)),
      softmax_scale_(static_cast<float>(config_.softmax_scale())) {}

Tensor DeepseekModel::linear(const Tensor& x, const Tensor& w) {
  Tensor out = Tensor::empty({x.shape()[0], w.shape()[0]}, DType::kF32);
  backend_.linear({.x = x.cview(), .w = w.cview(), .out = out.view()});
  return out;
}

Tensor DeepseekModel::forward(const ForwardBatch& batch, const LatentCache& cache) {
  batch.validate(static_cast<int32_t>(config_.vocab_size));
  const ModelConfig& c = config_;
  const int64_t num_tokens = batch.num_tokens(), d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  Tensor residual = Tensor::empty({num_tokens, d}, DType::kF32);            // [T, D]
  backend_.embedding({.token_ids = batch.token_ids, .table = weights_.embed.cview(), .out = residual.view()});
  Tensor h = Tensor::empty({num_tokens, d}, DType::kF32);                   // normalized input of each sublayer
  backend_.rms_norm({.x = residual.cview(), .weight = weights_.layers[0].input_norm.cview(), .out = h.view(), .eps = eps});

  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights_.layers[static_cast<size_t>(i)];
    Tensor attn_out = attention(layer, i, h, batch, cache);               // [T, D]
    backend_.add_rms_norm({.residual = residual.view(), .x = attn_out.cview(),
                           .weight = layer.post_attention_norm.cview(), .out = h.view(), .eps = eps});
    Tensor ffn_out = layer.moe ? moe(*layer.moe, h) : mlp(*layer.mlp, h);  // [T, D]
    if (i + 1 < c.num_hidden_layers) {
      backend_.add_rms_norm({.residual = residual.view(), .x = ffn_out.cview(),
                             .weight = weights_.layers[static_cast<size_t>(i + 1)].input_norm.cview(), .out = h.view(),
                             .eps = eps});
    } else {
      backend_.add({.x = residual.view(), .y = ffn_out.cview()});
    }
  }

  // Only the rows that sample need the final norm and the vocabulary projection.
  const int64_t num_logits = static_cast<int64_t>(batch.logits_indices.size());
  Tensor last = Tensor::empty({num_logits, d}, DType::kF32);                // [N, D]
  for (int64_t r = 0; r < num_logits; ++r) {
    std::memcpy(last.f32() + r * d, residual.f32() + static_cast<int64_t>(batch.logits_indices[r]) * d,
                sizeof(float) * d);
  }
  backend_.rms_norm({.x = last.cview(), .weight = weights_.norm.cview(), .out = last.view(), .eps = eps});
  return linear(last, weights_.lm_head);                                    // [N, V]
}

Tensor DeepseekModel::attention(const LayerWeights& layer, int64_t layer_index, const Tensor& h,
                                const ForwardBatch& batch, const LatentCache& cache) {
  const ModelConfig& c = config_;
  const MlaWeights& w = layer.attn;
  const int64_t t = h.shape()[0], heads = c.num_attention_heads, rank = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, rope_dim = c.qk_rope_head_dim, qk_dim = c.qk_head_dim(), v = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Queries: [T, H, nope + rope], through the q LoRA when the model has one.
  Tensor q;
  if (c.q_lora_rank) {
    Tensor q_a = linear(h, w.q_a_proj);                                     // [T, q_lora_rank]
    backend_.rms_norm({.x = q_a.cview(), .weight = w.q_a_norm.cview(), .out = q_a.view(), .eps = eps});
    q = linear(q_a, w.q_b_proj);                                            // [T, H * qk_dim]
  } else {
    q = linear(h, w.q_proj);
  }
  // Latent: [T, rank + rope] = [c_kv | k_pe]; c_kv normalized, k_pe rotated; this row is what the cache keeps.
  Tensor latent = linear(h, w.kv_a_proj);
  const TensorView c_kv{latent.f32(), DType::kF32, {t, rank}, Device::kCpu};
  backend_.rms_norm({.x = c_kv, .weight = w.kv_a_norm.cview(), .out = c_kv, .eps = eps, .row_stride = rank + rope_dim});
  const RopeArgs rope_common{.inv_freq = rope_.inv_freq, .attention_scaling = rope_.attention_scaling,
                             .interleaved = c.rope.interleaved};
  RopeArgs q_rope = rope_common;
  q_rope.x = q.f32() + nope;
  q_rope.num_tokens = t;
  q_rope.num_heads = heads;
  q_rope.rot_dim = rope_dim;
  q_rope.token_stride = heads * qk_dim;
  q_rope.head_stride = qk_dim;
  q_rope.positions = batch.positions;
  backend_.rope(q_rope);
  RopeArgs k_rope = q_rope;
  k_rope.x = latent.f32() + rank;
  k_rope.num_heads = 1;
  k_rope.token_stride = rank + rope_dim;
  k_rope.head_stride = 0;
  backend_.rope(k_rope);

  const TensorView layer_cache = cache.layer(layer_index);
  backend_.mla_cache_write({.latent = latent.cview(), .cache = layer_cache, .slot_mapping = batch.slot_mapping});

  Tensor attn = Tensor::empty({t, heads, v}, DType::kF32);                  // [T, H, v]
  const int32_t num_decode = batch.num_decode_seqs;
  if (num_decode > 0) {
    // Absorbed decode: q_latent = q_nope · W_UK per head; attend over the shared latent; out = o_latent · W_UV^T.
    Tensor q_nope = Tensor::empty({num_decode, heads, nope}, DType::kF32);  // [Td, H, nope]
    Tensor q_pe = Tensor::empty({num_decode, heads, rope_dim}, DType::kF32);
    for (int64_t r = 0; r < num_decode * heads; ++r) {
      std::memcpy(q_nope.f32() + r * nope, q.f32() + r * qk_dim, sizeof(float) * nope);
      std::memcpy(q_pe.f32() + r * rope_dim, q.f32() + r * qk_dim + nope, sizeof(float) * rope_dim);
    }
    Tensor q_latent = Tensor::empty({num_decode, heads, rank}, DType::kF32);
    backend_.head_linear({.x = q_nope.cview(), .w = w.w_uk_t.cview(), .out = q_latent.view()});
    Tensor o_latent = Tensor::empty({num_decode, heads, rank}, DType::kF32);
    backend_.mla_decode({.q_latent = q_latent.cview(), .q_pe = q_pe.cview(), .cache = layer_cache,
                         .out_latent = o_latent.view(), .meta = batch.attention(0, num_decode), .kv_lora_rank = rank,
                         .softmax_scale = softmax_scale_});
    backend_.head_linear({.x = o_latent.cview(), .w = w.w_uv.cview(), .out = attn.view().rows(0, num_decode)});
  }
  const int32_t num_prefill = batch.num_seqs() - num_decode;
  if (num_prefill > 0) {
    backend_.mla_prefill({.q = q.view().reshaped({t, heads, qk_dim}), .cache = layer_cache,
                          .kv_b = w.kv_b_proj.cview(), .out = attn.view(),
                          .meta = batch.attention(num_decode, num_prefill), .kv_lora_rank = rank,
                          .qk_nope_head_dim = nope, .v_head_dim = v, .softmax_scale = softmax_scale_});
  }
  Tensor out = Tensor::empty({t, c.hidden_size}, DType::kF32);
  backend_.linear({.x = attn.view().reshaped({t, heads * v}), .w = w.o_proj.cview(), .out = out.view()});
  return out;
}

Tensor DeepseekModel::mlp(const MlpWeights& w, const Tensor& h) {
  Tensor gate_up = linear(h, w.gate_up);                                    // [T, 2I]
  Tensor act = Tensor::empty({h.shape()[0], w.down.shape()[1]}, DType::kF32);  // [T, I]
  backend_.silu_mul({.gate_up = gate_up.cview(), .out = act.view()});
  return linear(act, w.down);                                               // [T, D]
}

Tensor DeepseekModel::moe(const MoeWeights& w, const Tensor& h) {
  const ModelConfig& c = config_;
  const int64_t t = h.shape()[0];
  Tensor router_logits = linear(h, w.gate);                                 // [T, E]
  Tensor topk_ids = Tensor::empty({t, c.num_experts_per_tok}, DType::kI32);
  Tensor topk_weights = Tensor::empty({t, c.num_experts_per_tok}, DType::kF32);
  backend_.moe_route({.logits = router_logits.cview(), .correction_bias = w.correction_bias.cview(),
                      .topk_ids = topk_ids.view(), .topk_weights = topk_weights.view(), .scoring = c.scoring,
                      .method = c.topk_method, .n_group = c.n_group, .topk_group = c.topk_group,
                      .norm_topk_prob = c.norm_topk_prob,
                      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor)});
  Tensor out = Tensor::empty({t, c.hidden_size}, DType::kF32);
  backend_.moe_experts({.x = h.cview(), .w_gate_up = w.experts_gate_up.cview(), .w_down = w.experts_down.cview(),
                        .topk_ids = topk_ids.cview(), .topk_weights = topk_weights.cview(), .out = out.view()});
  if (w.shared) {
    Tensor shared = mlp(*w.shared, h);                                      // shared experts see every token
    backend_.add({.x = out.view(), .y = shared.cview()});
  }
  return out;
}

void ForwardBatch::validate(int32_t vocab_size) const {
  const size_t t = token_ids.size();
  DI_CHECK(positions.size() == t && slot_mapping.size() == t, "forward batch: ", t, " tokens but ",
           positions.size(), " positions and ", slot_mapping.size(), " slots");
  DI_CHECK(query_start.size() == context_lens.size() + 1 && query_start.back() == static_cast<int32_t>(t),
           "forward batch: query_start does not cover the ", t, " tokens");
  DI_CHECK(page_table.size() == context_lens.size() * static_cast<size_t>(max_pages_per_seq),
           "forward batch: page table size ", page_table.size());
  DI_CHECK(num_decode_seqs >= 0 && num_decode_seqs <= num_seqs(), "forward batch: ", num_decode_seqs,
           " decode sequences of ", num_seqs());
  for (int32_t id : token_ids) {
    DI_CHECK(id >= 0 && id < vocab_size, "forward batch: token id ", id, " outside [0, ", vocab_size, ")");
  }
  for (int32_t r : logits_indices) {
    DI_CHECK(r >= 0 && r < static_cast<int32_t>(t), "forward batch: logits row ", r, " of ", t);
  }
}

}  // namespace deepinfer
