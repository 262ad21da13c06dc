// The paged latent cache's memory: per layer [num_pages, page_size, kv_lora_rank + rope_dim], on the backend's
// device, in its activation dtype or in the FP8 layout (backend/ops/latent_fp8.h: [num_pages, page_size, row bytes]),
// and how many pages it gets. Which page holds which tokens is the cache manager's
// bookkeeping (engine/cache_manager.h); the model only writes and attends the views it is handed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/ops/latent_fp8.h"
#include "core/tensor.h"
#include "model/deepseek.h"

namespace deepinfer {

struct LatentCacheShape {
  int64_t num_layers = 0;
  int32_t num_pages = 0;
  int32_t page_size = 64;
  int64_t latent_dim = 0;    // kv_lora_rank + rope_dim
  int64_t kv_lora_rank = 0;  // where c_kv ends in a row: the FP8 layout's codes
  bool fp8 = false;          // the FP8 layout (kv_cache_dtype "fp8"), else the activation dtype

  // The cache tensors' dtype and last dimension, for a backend computing in `activation`.
  DType dtype(DType activation) const { return fp8 ? DType::kF8E4M3 : activation; }
  int64_t row_elements() const {
    return fp8 ? LatentFp8Layout{.rank = kv_lora_rank, .rope_dim = latent_dim - kv_lora_rank}.row_bytes()
               : latent_dim;
  }
  int64_t bytes_per_page(DType activation) const {
    return num_layers * page_size * row_elements() * static_cast<int64_t>(dtype_size(dtype(activation)));
  }
};

class LatentCache {
 public:
  // Allocated (and zeroed) through `backend`, which must outlive the cache.
  LatentCache(LatentCacheShape shape, Backend& backend);
  const LatentCacheShape& shape() const { return shape_; }
  // One view per layer, what the model's layers write and attend.
  std::span<const TensorView> layers() const { return views_; }

 private:
  LatentCacheShape shape_;
  std::vector<Tensor> layers_;
  std::vector<TensorView> views_;  // of layers_
};

// What sizes the cache: the engine options of the same names.
struct CacheBudget {
  int32_t num_cache_pages = 0;          // > 0: exactly this many pages
  int64_t cache_memory_bytes = 0;       // a backend whose memory is the host's: the cache's bytes
  double gpu_memory_utilization = 0.9;  // a device: the fraction of its memory for weights, working memory and cache
  int32_t max_num_batched_tokens = 0;   // the largest step, whose working memory is measured
  int32_t max_num_seqs = 0;             // rows of the decode graphs' logits
  bool graphs = false;                  // decode graphs will be recorded: room for their memory
};

// Pages a cache of `shape` (its num_pages aside) gets: a fixed count, the host budget, or on a device what
// gpu_memory_utilization of its memory leaves after the weights, the largest step's working memory (that step runs
// here once, to measure it) and the decode graphs' memory. Throws InvalidArgument when that leaves no room.
int64_t latent_cache_pages(const CacheBudget& budget, const LatentCacheShape& shape, DeepseekModel& model);

}  // namespace deepinfer
