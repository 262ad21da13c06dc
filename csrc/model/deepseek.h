// DeepSeek V2/V3: embed -> [MLA + (dense MLP | MoE)] x L -> norm -> lm_head. The math lives here; the device
// specifics live behind Backend.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/latent_cache.h"
#include "model/rope_scaling.h"
#include "model/weights.h"

namespace deepinfer {

class DeepseekModel {
 public:
  DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }

  // Writes the latents of the batch's tokens into `cache`, attends, and returns the logits of
  // batch.logits_indices as [logits_indices.size(), vocab_size].
  Tensor forward(const ForwardBatch& batch, const LatentCache& cache);

 private:
  // h [T, D] -> attention output [T, D]; writes the layer's latents into the cache.
  Tensor attention(const LayerWeights& layer, int64_t layer_index, const Tensor& h, const ForwardBatch& batch,
                   const LatentCache& cache);
  Tensor mlp(const MlpWeights& w, const Tensor& h);
  Tensor moe(const MoeWeights& w, const Tensor& h);
  Tensor linear(const Tensor& x, const Tensor& w);

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  RopeTables rope_;
  float softmax_scale_;
};

}  // namespace deepinfer
