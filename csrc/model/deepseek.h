// DeepSeek V2/V3: embed -> [MLA + (dense MLP | MoE)] x L -> norm -> lm_head. The math lives here; the device
// specifics live behind Backend: the model allocates through it and only ever hands it views.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/latent_cache.h"
#include "model/rope_scaling.h"
#include "model/step_inputs.h"
#include "model/weights.h"

namespace deepinfer {

class DeepseekModel {
 public:
  // Takes `weights` placed on the backend's device by a backend sink (load_weights with make_backend_sink), or
  // host float32 ones, which it uploads once: matrices in the activation dtype, norm weights and biases in float32.
  // `backend` must outlive the model.
  DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }

  // Writes the latents of the batch's tokens into `cache`, attends, and returns the logits of
  // batch.logits_indices as [logits_indices.size(), vocab_size] float32, on the backend's device. Validates the batch
  // on the host and uploads its arrays.
  Tensor forward(const ForwardBatch& batch, const LatentCache& cache);
  // The same on inputs already on the device (bind_step): queues device work only, never waits for the device, so a
  // backend can record it as a graph.
  Tensor run(const StepInputs& in, const LatentCache& cache);
  // The same, writing the logits into `logits` ([logits rows, vocab_size] float32, on the device): a recorded graph
  // keeps writing where it was recorded to write.
  void run_into(const StepInputs& in, const LatentCache& cache, TensorView logits);
  // The logits forward() returned, as float32 in host memory for the sampler (a copy only on a GPU).
  Tensor logits_on_host(Tensor logits) const;

 private:
  // h [T, D] -> attention output [T, D]; writes the layer's latents into the cache.
  Tensor attention(const LayerWeights& layer, int64_t layer_index, const Tensor& h, const StepInputs& in,
                   const LatentCache& cache);
  Tensor mlp(const MlpWeights& w, const Tensor& h);
  Tensor moe(const MoeWeights& w, const Tensor& h);
  Tensor linear(const Tensor& x, const Tensor& w);
  Tensor activation(Shape shape);  // uninitialized, on the backend's device, in its activation dtype

  ModelConfig config_;
  ModelWeights weights_;  // on the backend's device
  Backend& backend_;
  RopeTables rope_;
  Tensor inv_freq_;       // [qk_rope_head_dim / 2] float32, on the backend's device
  float softmax_scale_;
};

}  // namespace deepinfer
