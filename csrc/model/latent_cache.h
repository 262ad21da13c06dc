// The paged latent cache's memory: per layer [num_pages, page_size, kv_lora_rank + rope_dim], on the backend's
// device, in its activation dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/config.h"

namespace deepinfer {

struct LatentCacheShape {
  int64_t num_layers = 0;
  int32_t num_pages = 0;
  int32_t page_size = 64;
  int64_t latent_dim = 0;

  int64_t bytes_per_page(DType dtype) const {
    return num_layers * page_size * latent_dim * static_cast<int64_t>(dtype_size(dtype));
  }
};

class LatentCache {
 public:
  // Allocated (and zeroed) through `backend`, which must outlive the cache.
  LatentCache(LatentCacheShape shape, Backend& backend);
  const LatentCacheShape& shape() const { return shape_; }
  TensorView layer(int64_t i) const { return layers_[static_cast<size_t>(i)].view(); }

 private:
  LatentCacheShape shape_;
  std::vector<Tensor> layers_;
};

}  // namespace deepinfer
