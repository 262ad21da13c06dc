#include "model/deepseek.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace deepinfer {
namespace {

// Matrices go to the backend's activation dtype; norm weights and biases stay float32. Weights a backend sink
// already placed stay where they are.
void upload_weights(ModelWeights& w, Backend& backend) {
  const DType act = backend.activation_dtype();
  const auto place = [&](Tensor& t, DType dtype) {
    if (t.device() == backend.device() && t.dtype() == dtype) return;  // already placed (a backend sink)
    t = backend.upload(std::move(t), dtype);
  };
  const auto matrix = [&](Tensor& t) { place(t, act); };
  const auto vector = [&](Tensor& t) { place(t, DType::kF32); };
  // An FP8 or packed 4-bit weight keeps its codes, scales (and zero points) as they are.
  const auto linear = [&](Weight& w) {
    if (w.is_packed4()) {
      place(w.values, DType::kI32);
      place(w.scale_inv, DType::kF32);
      if (w.has_zeros()) place(w.zeros, DType::kI32);
      return;
    }
    if (!w.is_fp8()) return matrix(w.values);
    place(w.values, DType::kF8E4M3);
    place(w.scale_inv, DType::kF32);
  };
  const auto mlp = [&](MlpWeights& m) {
    linear(m.gate_up);
    linear(m.down);
  };
  const auto decoder_layer = [&](LayerWeights& layer) {
    vector(layer.input_norm);
    vector(layer.post_attention_norm);
    MlaWeights& a = layer.attn;
    for (Weight* t : {&a.q_proj, &a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.o_proj}) linear(*t);
    for (Tensor* t : {&a.kv_b_proj, &a.w_uk_t, &a.w_uv}) matrix(*t);
    vector(a.q_a_norm);
    vector(a.kv_a_norm);
    if (layer.mlp) mlp(*layer.mlp);
    if (layer.moe) {
      if (layer.moe->shared_mlp) mlp(*layer.moe->shared_mlp);
      matrix(layer.moe->gate);
      vector(layer.moe->correction_bias);
      linear(layer.moe->experts_gate_up);
      linear(layer.moe->experts_down);
    }
  };
  matrix(w.embed);
  matrix(w.lm_head);
  vector(w.norm);
  for (LayerWeights& layer : w.layers) decoder_layer(layer);
  if (w.mtp) {
    vector(w.mtp->enorm);
    vector(w.mtp->hnorm);
    linear(w.mtp->eh_proj);
    decoder_layer(w.mtp->block);
    vector(w.mtp->head_norm);
  }
}

}  // namespace

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend, ModelParallel parallel)
    : config_(std::move(config)),
      local_(local_config(config_, parallel.shard)),
      weights_(std::move(weights)),
      parallel_(parallel),
      backend_(backend),
      rope_(compute_rope_tables(config_)),
      softmax_scale_(static_cast<float>(config_.softmax_scale())) {
  DI_CHECK(parallel_.shard.whole() || (parallel_.comm != nullptr && parallel_.comm->size() == parallel_.shard.size &&
                                        parallel_.comm->rank() == parallel_.shard.rank),
           "model: rank ", parallel_.shard.rank, " of ", parallel_.shard.size, " needs the communicator of its group");
  upload_weights(weights_, backend_);
  const auto half = static_cast<int64_t>(rope_.inv_freq.size());
  inv_freq_ = backend_.empty({half}, DType::kF32);
  backend_.copy_to_device(ConstTensorView(rope_.inv_freq.data(), DType::kF32, {half}, Device::kCpu),
                          inv_freq_.view());
}

void DeepseekModel::reduce(Tensor& partial) {
  if (parallel_.shard.splits_attention()) parallel_.comm->all_reduce(partial.view());
}

Tensor DeepseekModel::activation(Shape shape) { return backend_.empty(shape, backend_.activation_dtype()); }

Tensor DeepseekModel::linear(const Tensor& x, const Weight& w) {
  Tensor out = activation({x.shape()[0], w.shape()[0]});
  backend_.linear({.x = x.cview(), .w = w.cview(), .out = out.view()});
  return out;
}

Tensor DeepseekModel::run(const ModelInputs& in, std::span<const TensorView> cache) {
  Tensor logits = backend_.empty({in.num_logits, config_.vocab_size}, DType::kF32);
  run_into(in, cache, logits.view());
  return logits;
}

void DeepseekModel::run_into(const ModelInputs& in, std::span<const TensorView> cache, TensorView logits,
                             TensorView hidden) {
  const ModelConfig& c = config_;
  DI_CHECK(static_cast<int64_t>(cache.size()) == c.num_hidden_layers + (has_mtp() ? 1 : 0),
           "model: a latent cache of ", cache.size(), " layers for ", c.num_hidden_layers,
           has_mtp() ? " and the MTP layer" : "");
  DI_CHECK(logits.dtype == DType::kF32 && logits.shape.ndim() == 2 && logits.shape[0] == in.num_logits &&
               logits.shape[1] == c.vocab_size,
           "model: logits ", logits.shape.str(), " ", dtype_name(logits.dtype), " for ", in.num_logits, " rows of ",
           c.vocab_size, " float32 values");
  const int64_t num_tokens = in.num_tokens, d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  Tensor residual = activation({num_tokens, d});                            // [T, D]
  embed(in, residual);
  Tensor h = activation({num_tokens, d});                                   // normalized input of each sublayer
  backend_.rms_norm(
      {.x = residual.cview(), .weight = weights_.layers[0].input_norm.cview(), .out = h.view(), .eps = eps});

  dp_max_tokens_ = in.dp_max_tokens;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights_.layers[static_cast<size_t>(i)];
    Tensor attn_out = attention(layer, i, h, in, cache);                  // [T, D]
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

  head(residual, weights_.norm, in, logits, hidden);
}

void DeepseekModel::head(const Tensor& residual, const Tensor& norm, const ModelInputs& in, TensorView logits,
                         TensorView hidden) {
  const ModelConfig& c = config_;
  const int64_t num_logits = in.num_logits, d = c.hidden_size, local_vocab = local_.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor last = activation({num_logits, d});                                // [N, D]
  if (hidden.data != nullptr) {
    DI_CHECK(hidden.shape == Shape({in.num_tokens, d}) && hidden.dtype == backend_.activation_dtype(),
             "model: hidden states ", hidden.shape.str(), " for ", in.num_tokens, " tokens of ", d);
    backend_.rms_norm({.x = residual.cview(), .weight = norm.cview(), .out = hidden, .eps = eps});
    backend_.gather_rows({.src = ConstTensorView(hidden), .indices = in.logits_indices, .out = last.view()});
  } else {
    // Only the rows that sample need the final norm and the vocabulary projection.
    backend_.gather_rows({.src = residual.cview(), .indices = in.logits_indices, .out = last.view()});
    backend_.rms_norm({.x = last.cview(), .weight = norm.cview(), .out = last.view(), .eps = eps});
  }
  if (!parallel_.shard.splits_attention()) {
    backend_.linear({.x = last.cview(), .w = weights_.lm_head.cview(), .out = logits});  // [N, V] float32
    return;
  }
  // Vocabulary-parallel lm_head: each rank's [N, V / tp] logits, gathered rank-major, then laid side by side.
  const int64_t ranks = parallel_.shard.size;
  Tensor local_logits = backend_.empty({num_logits, local_vocab}, DType::kF32);
  backend_.linear({.x = last.cview(), .w = weights_.lm_head.cview(), .out = local_logits.view()});
  Tensor gathered = backend_.empty({ranks * num_logits, local_vocab}, DType::kF32);  // [tp, N, V / tp]
  parallel_.comm->all_gather(local_logits.cview(), gathered.view());
  for (int64_t r = 0; r < ranks; ++r) {
    backend_.copy_strided({.src = gathered.cview().rows(r * num_logits, num_logits),
                           .dst = logits.columns(r * local_vocab, local_vocab),
                           .src_row_stride = local_vocab, .dst_row_stride = c.vocab_size});
  }
}

void DeepseekModel::embed(const ModelInputs& in, Tensor& out) {
  // Under TP each rank holds a slice of the vocabulary: its rows of the lookup, zeros elsewhere, summed.
  const int64_t local_vocab = local_.vocab_size;
  backend_.embedding({.token_ids = in.token_ids, .table = weights_.embed.cview(), .out = out.view(),
                      .first_row = parallel_.shard.splits_attention() ? parallel_.shard.rank * local_vocab : 0,
                      .vocab_size = config_.vocab_size});
  reduce(out);
}

void DeepseekModel::run_mtp_into(const ModelInputs& in, std::span<const TensorView> cache, ConstTensorView prev_hidden,
                                 TensorView logits, TensorView hidden) {
  const ModelConfig& c = config_;
  DI_CHECK(has_mtp(), "model: loaded without its MTP layer");
  const int64_t n = c.num_hidden_layers, t = in.num_tokens, d = c.hidden_size;
  DI_CHECK(static_cast<int64_t>(cache.size()) == n + 1, "model: a latent cache of ", cache.size(), " layers for ", n,
           " and the MTP layer");
  DI_CHECK(prev_hidden.shape == Shape({t, d}), "model: MTP hidden input ", prev_hidden.shape.str(), " for ", t,
           " tokens of ", d);
  const MtpWeights& mtp = *weights_.mtp;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // x = eh_proj([enorm(Emb(t_{p+1})) ; hnorm(h_p)])
  Tensor embedded = activation({t, d});
  embed(in, embedded);
  Tensor both = activation({t, 2 * d});                                     // [T, 2D]
  Tensor normed = activation({t, d});
  backend_.rms_norm({.x = embedded.cview(), .weight = mtp.enorm.cview(), .out = normed.view(), .eps = eps});
  backend_.copy_strided({.src = normed.cview(), .dst = both.view().columns(0, d), .src_row_stride = d,
                         .dst_row_stride = 2 * d});
  backend_.rms_norm({.x = prev_hidden, .weight = mtp.hnorm.cview(), .out = normed.view(), .eps = eps});
  backend_.copy_strided({.src = normed.cview(), .dst = both.view().columns(d, d), .src_row_stride = d,
                         .dst_row_stride = 2 * d});
  Tensor residual = linear(both, mtp.eh_proj);                              // [T, D]

  // One decoder block over its own latent cache (layer n of `cache`).
  const LayerWeights& block = mtp.block;
  Tensor h = activation({t, d});
  backend_.rms_norm({.x = residual.cview(), .weight = block.input_norm.cview(), .out = h.view(), .eps = eps});
  dp_max_tokens_ = in.dp_max_tokens;
  Tensor attn_out = attention(block, n, h, in, cache);
  backend_.add_rms_norm({.residual = residual.view(), .x = attn_out.cview(), .weight = block.post_attention_norm.cview(),
                         .out = h.view(), .eps = eps});
  const Tensor ffn_out = block.moe ? moe(*block.moe, h) : mlp(*block.mlp, h);
  backend_.add({.x = residual.view(), .y = ffn_out.cview()});
  head(residual, mtp.head_norm, in, logits, hidden);
}

Tensor DeepseekModel::attention(const LayerWeights& layer, int64_t layer_index, const Tensor& h,
                                const ModelInputs& in, std::span<const TensorView> cache) {
  const ModelConfig& c = local_;  // this rank's heads
  const MlaWeights& w = layer.attn;
  const int64_t t = h.shape()[0], heads = c.num_attention_heads, rank = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, rope_dim = c.qk_rope_head_dim, qk_dim = c.qk_head_dim(), v = c.v_head_dim;
  const int64_t latent_dim = rank + rope_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Queries [T, H, nope + rope], through the q LoRA when the model has one, and the latent [T, rank + rope] =
  // [c_kv | k_pe] (c_kv normalized and k_pe rotated below: the row the cache keeps). The two projections of h are one
  // op, so a decode step reads both weights in one launch.
  Tensor latent = activation({t, latent_dim});
  Tensor q;
  if (c.q_lora_rank) {
    Tensor q_a = activation({t, *c.q_lora_rank});                          // [T, q_lora_rank]
    const std::array targets{LinearTarget{.w = w.q_a_proj.cview(), .out = q_a.view()},
                             LinearTarget{.w = w.kv_a_proj.cview(), .out = latent.view()}};
    backend_.multi_linear({.x = h.cview(), .targets = targets});
    backend_.rms_norm({.x = q_a.cview(), .weight = w.q_a_norm.cview(), .out = q_a.view(), .eps = eps});
    q = linear(q_a, w.q_b_proj);                                            // [T, H * qk_dim]
  } else {
    q = activation({t, heads * qk_dim});
    const std::array targets{LinearTarget{.w = w.q_proj.cview(), .out = q.view()},
                             LinearTarget{.w = w.kv_a_proj.cview(), .out = latent.view()}};
    backend_.multi_linear({.x = h.cview(), .targets = targets});
  }
  const TensorView q_heads = q.view().reshaped({t, heads, qk_dim});        // [T, H, nope + rope]
  // The decode query in the layout of the absorbed decode kernel: q_abs[s, h] = [q_nope[s, h] · W_UK[h] | q_pe[s, h]].
  const int64_t num_decode = in.num_decode_seqs;
  Tensor q_abs = num_decode > 0 ? activation({num_decode, heads, latent_dim}) : Tensor();  // [Td, H, rank + rope]
  // Normalizes c_kv, rotates q_pe and k_pe, writes the latent rows into the cache and the decode tokens' rotated q_pe
  // into q_abs, in one op.
  const TensorView layer_cache = cache[static_cast<size_t>(layer_index)];
  backend_.mla_prepare({.latent = latent.view(), .q = q_heads, .q_abs = q_abs.view(), .cache = layer_cache,
                        .slot_mapping = in.slot_mapping, .positions = in.positions, .kv_a_norm = w.kv_a_norm.cview(),
                        .inv_freq = inv_freq_.cview(), .kv_lora_rank = rank, .eps = eps,
                        .attention_scaling = rope_.attention_scaling, .interleaved = c.rope.interleaved});

  Tensor attn = activation({t, heads, v});                                  // [T, H, v]
  if (num_decode > 0) {
    // Absorbed decode: q_nope into latent space per head (the rank columns of q_abs), attend over the shared latent,
    // out = o_latent · W_UV^T per head.
    const TensorView q_dec = q_heads.rows(0, num_decode);                  // [Td, H, nope + rope]
    backend_.head_linear({.x = q_dec.columns(0, nope), .w = w.w_uk_t.cview(), .out = q_abs.view().columns(0, rank),
                          .x_head_stride = qk_dim, .out_head_stride = latent_dim});
    Tensor o_latent = activation({num_decode, heads, rank});                // [Td, H, rank], the op's scratch
    backend_.mla_decode({.q = q_abs.cview(), .cache = layer_cache, .out_latent = o_latent.view(), .meta = in.decode,
                         .kv_lora_rank = rank, .softmax_scale = softmax_scale_, .w_uv = w.w_uv.cview(),
                         .out = attn.view().rows(0, num_decode)});
  }
  if (in.prefill.num_seqs > 0) {
    backend_.mla_prefill({.q = q_heads, .cache = layer_cache, .kv_b = w.kv_b_proj.cview(), .out = attn.view(),
                          .meta = in.prefill, .kv_lora_rank = rank, .qk_nope_head_dim = nope, .v_head_dim = v,
                          .softmax_scale = softmax_scale_});
  }
  Tensor out = activation({t, c.hidden_size});                              // [T, D]
  backend_.linear({.x = attn.view().reshaped({t, heads * v}), .w = w.o_proj.cview(), .out = out.view()});
  reduce(out);  // the heads of every rank
  return out;
}

Tensor DeepseekModel::mlp(const MlpWeights& w, const Tensor& h) {
  Tensor out = mlp_part(w, h);
  reduce(out);  // the channels of every rank
  return out;
}

Tensor DeepseekModel::mlp_part(const MlpWeights& w, const Tensor& h) {
  Tensor act = activation({h.shape()[0], w.down.shape()[1]});              // [T, I] = silu(gate) * up
  backend_.linear_silu_mul({.x = h.cview(), .w = w.gate_up.cview(), .out = act.view()});
  return linear(act, w.down);                                               // [T, D]
}

// Under expert parallelism the stacked weights hold this rank's routed experts only (the shared experts are
// shared_mlp, split by channels as under TP): routing still ranks all of them, and the op computes the pairs it holds.
ExpertShard DeepseekModel::expert_shard(const MoeWeights& w) const {
  if (shard().whole() || !shard().expert_parallel) return {};  // every expert
  return {.first_routed = w.first_expert,
          .num_local_routed = w.experts_gate_up.shape()[0],
          .num_routed = w.num_routed_experts,
          .holds_shared = false};
}

// The shared experts are the last s experts of the stacked weights (see MoeWeights): routing appends them to every
// token's top-k with weight 1, and one moe op computes the router logits, routes, and computes the routed and the
// shared experts together.
Tensor DeepseekModel::moe(const MoeWeights& w, const Tensor& h) {
  if (parallel_.shard.dp_attention && !parallel_.shard.whole()) return moe_data_parallel(w, h);
  Tensor out = moe_routed(w, h);
  if (w.shared_mlp) {  // expert parallelism: this rank's channels of the shared experts
    const Tensor shared = mlp_part(*w.shared_mlp, h);
    backend_.add({.x = out.view(), .y = shared.cview()});
  }
  reduce(out);  // every rank's experts (or channels of them)
  return out;
}

// The routing and this rank's experts over `h`'s tokens (the shared ones too when the stacked weights hold them).
Tensor DeepseekModel::moe_routed(const MoeWeights& w, const Tensor& h) {
  const ModelConfig& c = config_;
  const int64_t t = h.shape()[0];
  const int64_t pairs = c.num_experts_per_tok + w.num_shared_experts;           // k + s a token
  Tensor router_logits = backend_.empty({t, w.gate.shape()[0]}, DType::kF32);  // [T, E] float32, the op's
  Tensor topk_ids = backend_.empty({t, pairs}, DType::kI32);                    // [T, k + s]
  Tensor topk_weights = backend_.empty({t, pairs}, DType::kF32);                // [T, k + s]
  Tensor out = activation({t, c.hidden_size});                                  // [T, D]
  backend_.moe({.route = {.logits = router_logits.cview(), .correction_bias = w.correction_bias.cview(),
                          .topk_ids = topk_ids.view(), .topk_weights = topk_weights.view(), .scoring = c.scoring,
                          .method = c.topk_method, .n_group = c.n_group, .topk_group = c.topk_group,
                          .norm_topk_prob = c.norm_topk_prob,
                          .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
                          .num_shared_experts = w.num_shared_experts},
                .x = h.cview(), .w_gate_up = w.experts_gate_up.cview(), .w_down = w.experts_down.cview(),
                .out = out.view(), .router = w.gate.cview(), .router_logits = router_logits.view(),
                .shard = expert_shard(w)});
  return out;
}

// Data-parallel attention: each rank holds its own tokens. They are padded to the group's largest step, gathered from
// every rank, routed and run through this rank's experts; the sums of all ranks' experts come back to the tokens'
// ranks (reduce-scatter), and each rank adds its shared experts for its own tokens. A rank with no request this step
// still computes a padded step, so that the others' collectives meet.
Tensor DeepseekModel::moe_data_parallel(const MoeWeights& w, const Tensor& h) {
  const int64_t t = h.shape()[0], d = config_.hidden_size, ranks = parallel_.shard.size;
  const int64_t padded = dp_max_tokens_;
  DI_CHECK(padded >= t, "model: ", t, " tokens on a rank of a data-parallel step of at most ", padded);
  Tensor mine = backend_.zeros({padded, d}, backend_.activation_dtype());      // [T_max, D]: h, then zeros
  if (t > 0) backend_.copy_strided({.src = h.cview(), .dst = mine.view().rows(0, t), .src_row_stride = d,
                                    .dst_row_stride = d});
  Tensor all = activation({ranks * padded, d});                                 // every rank's, rank-major
  parallel_.comm->all_gather(mine.cview(), all.view());
  const Tensor routed = moe_routed(w, all);                                     // this rank's experts, all tokens
  Tensor summed = activation({padded, d});
  parallel_.comm->reduce_scatter(routed.cview(), summed.view());               // every rank's experts, my tokens
  Tensor out = activation({t, d});
  if (t > 0) backend_.copy_strided({.src = summed.cview().rows(0, t), .dst = out.view(), .src_row_stride = d,
                                    .dst_row_stride = d});
  if (w.shared_mlp && t > 0) {
    const Tensor shared = mlp_part(*w.shared_mlp, h);
    backend_.add({.x = out.view(), .y = shared.cview()});
  }
  return out;
}

}  // namespace deepinfer
