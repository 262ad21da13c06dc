#include "model/latent_cache.h"

namespace deepinfer {

LatentCache::LatentCache(LatentCacheShape shape, Backend& backend) : shape_(shape) {
  DI_CHECK(shape.num_pages > 0 && shape.page_size > 0 && shape.latent_dim > 0, "latent cache: ", shape.num_pages,
           " pages of ", shape.page_size, " tokens x ", shape.latent_dim);
  layers_.reserve(static_cast<size_t>(shape.num_layers));
  for (int64_t i = 0; i < shape.num_layers; ++i) {
    // Zeros, so a page never written reads as finite values (a bug reading one shows up as wrong numbers, not NaN).
    layers_.push_back(
        backend.zeros({shape.num_pages, shape.page_size, shape.latent_dim}, backend.activation_dtype()));
  }
}

}  // namespace deepinfer
