// DeepSeek V2/V3: embed -> [MLA + (dense MLP | MoE)] x L -> norm -> lm_head. The math lives here; the device
// specifics live behind Backend: the model allocates through it and only ever hands it views.
#pragma once

#include <memory>
#include <span>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model_inputs.h"
#include "model/model_shard.h"
#include "parallel/communicator.h"
#include "model/rope_scaling.h"
#include "model/weights.h"

namespace deepinfer {

// One rank's place in a tensor/expert-parallel group: its shard of the weights, and the group's communicator,
// which sums the ranks' partial results (o_proj, the MLP and MoE outputs, the embedding) and gathers the
// vocabulary's logits. A whole model (shard.size 1) needs no communicator.
struct ModelParallel {
  ModelShard shard;
  Communicator* comm = nullptr;  // outlives the model
};

class DeepseekModel {
 public:
  // Takes `weights` placed on the backend's device by a backend sink (load_weights with make_backend_sink), or
  // host float32 ones, which it uploads once: matrices in the activation dtype, norm weights and biases in float32.
  // `backend` must outlive the model. `config` is the whole model's; under parallelism `weights` are the shard's
  // (load_weights with the shard's local_config).
  DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend, ModelParallel parallel = {});

  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return parallel_.shard; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }

  // Runs the layers over one step's inputs: writes the latents of its tokens into `cache` (the paged latent cache,
  // one [num_pages, page_size, latent_dim] view per layer), attends, and returns the logits of in.logits_indices as
  // [num_logits, vocab_size] float32 on the backend's device. Queues device work only, never waits for the device,
  // so a backend can record it as a graph.
  Tensor run(const ModelInputs& in, std::span<const TensorView> cache);
  // The same, writing the logits into `logits` ([num_logits, vocab_size] float32, on the device): a recorded graph
  // keeps writing where it was recorded to write. With `hidden` ([num_tokens, hidden_size], activation dtype) it also
  // writes every token's final hidden state there (after model.norm: what the MTP layer reads). `cache` may hold
  // the MTP layer's after the main layers'.
  void run_into(const ModelInputs& in, std::span<const TensorView> cache, TensorView logits, TensorView hidden = {});

  // The MTP layer (MtpWeights; the model was loaded with it) over one step's inputs: token i of `in` is t_{p+1} for
  // position p = in.positions[i], whose main-model hidden state is row i of `prev_hidden` ([T, D]). Writes the
  // layer's latents into cache[num_hidden_layers], the logits of in.logits_indices (predicting t_{p+2}) into
  // `logits`, and, with `hidden`, every row's output after the head's norm (the vector the head reads, which the
  // next draft reads as its h when the layer is applied again).
  bool has_mtp() const { return weights_.mtp.has_value(); }
  void run_mtp_into(const ModelInputs& in, std::span<const TensorView> cache, ConstTensorView prev_hidden,
                    TensorView logits, TensorView hidden = {});

 private:
  // Emb(in.token_ids) into `out` [T, D]; under TP each rank looks up its slice of the vocabulary (zeros elsewhere)
  // and the ranks' rows are summed.
  void embed(const ModelInputs& in, Tensor& out);
  // The final norm of the rows of `residual` that have logits, and the vocabulary projection into `logits`; with
  // `hidden`, the norm of every row into it first (the logits rows gathered from it).
  void head(const Tensor& residual, const Tensor& norm, const ModelInputs& in, TensorView logits, TensorView hidden);
  // h [T, D] -> attention output [T, D]; writes the layer's latents into the cache.
  Tensor attention(const LayerWeights& layer, int64_t layer_index, const Tensor& h, const ModelInputs& in,
                   std::span<const TensorView> cache);
  Tensor mlp(const MlpWeights& w, const Tensor& h);
  Tensor mlp_part(const MlpWeights& w, const Tensor& h);  // this rank's channels' share, before the sum
  Tensor moe(const MoeWeights& w, const Tensor& h);
  Tensor moe_routed(const MoeWeights& w, const Tensor& h);         // routing + this rank's experts
  Tensor moe_data_parallel(const MoeWeights& w, const Tensor& h);  // gathered tokens, scattered sums
  ExpertShard expert_shard(const MoeWeights& w) const;  // the experts the layer's stacked weights hold
  Tensor linear(const Tensor& x, const Weight& w);
  // Sums a partial result over the TP ranks, in place (nothing to do on one rank).
  void reduce(Tensor& partial);
  Tensor activation(Shape shape);  // uninitialized, on the backend's device, in its activation dtype

  ModelConfig config_;    // the whole model's
  ModelConfig local_;     // this rank's dimensions (local_config)
  ModelWeights weights_;  // on the backend's device
  ModelParallel parallel_;
  Backend& backend_;
  RopeTables rope_;
  Tensor inv_freq_;       // [qk_rope_head_dim / 2] float32, on the backend's device
  float softmax_scale_;
  int64_t dp_max_tokens_ = 0;  // the step's (ModelInputs::dp_max_tokens), for the MoE layers
};

}  // namespace deepinfer
