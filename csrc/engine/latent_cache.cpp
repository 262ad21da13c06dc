#include "engine/latent_cache.h"

#include <algorithm>
#include <numeric>

#include "engine/step_batch.h"
#include "engine/step_runner.h"

namespace deepinfer {

LatentCache::LatentCache(LatentCacheShape shape, Backend& backend) : shape_(shape) {
  DI_CHECK(shape.num_pages > 0 && shape.page_size > 0 && shape.latent_dim > 0, "latent cache: ", shape.num_pages,
           " pages of ", shape.page_size, " tokens x ", shape.latent_dim);
  layers_.reserve(static_cast<size_t>(shape.num_layers));
  views_.reserve(static_cast<size_t>(shape.num_layers));
  for (int64_t i = 0; i < shape.num_layers; ++i) {
    // Zeros, so a page never written reads as finite values (a bug reading one shows up as wrong numbers, not NaN).
    layers_.push_back(backend.zeros({shape.num_pages, shape.page_size, shape.row_elements()},
                                    shape.dtype(backend.activation_dtype())));
    views_.push_back(layers_.back().view());
  }
}

namespace {

// The working memory of the largest step, measured: one prefill of max_num_batched_tokens tokens (capped by the
// model's positions) into a cache of just the pages it needs. A device backend's pool keeps the memory it took, so
// afterwards the device's used memory counts the weights, the step's peak activations and workspaces together.
void profile_largest_step(DeepseekModel& model, int32_t max_num_batched_tokens, const LatentCacheShape& shape) {
  const int32_t page_size = shape.page_size;
  const ModelConfig& c = model.config();
  const auto tokens =
      static_cast<int32_t>(std::min<int64_t>(max_num_batched_tokens, c.max_position_embeddings - 1));
  const int32_t pages = (tokens + page_size - 1) / page_size;
  LatentCacheShape step_shape = shape;
  step_shape.num_pages = pages;
  const LatentCache cache(step_shape, model.backend());
  std::vector<int32_t> token_ids(static_cast<size_t>(tokens)), page_ids(static_cast<size_t>(pages));
  for (int32_t pos = 0; pos < tokens; ++pos) {
    token_ids[static_cast<size_t>(pos)] = pos % static_cast<int32_t>(c.vocab_size);
  }
  std::iota(page_ids.begin(), page_ids.end(), 0);
  ForwardBatchBuilder builder(page_size, pages);
  builder.add(token_ids, 0, page_ids, /*samples=*/true);
  ForwardBatch batch = std::move(builder).take();
  // Every rank of a data-parallel group profiles this same step, so its MoE layers gather as many tokens from each.
  batch.dp_max_tokens = tokens;
  run_forward(model, cache, batch);  // waits for the step
}

}  // namespace

int64_t latent_cache_pages(const CacheBudget& budget, const LatentCacheShape& shape, DeepseekModel& model) {
  const int64_t page_bytes = shape.bytes_per_page(model.backend().activation_dtype());
  if (budget.num_cache_pages > 0) return budget.num_cache_pages;
  if (!model.backend().memory_info()) return budget.cache_memory_bytes / page_bytes;  // the host's memory
  profile_largest_step(model, budget.max_num_batched_tokens, shape);
  const DeviceMemoryInfo mem = *model.backend().memory_info();
  const int64_t used = mem.total_bytes - mem.free_bytes;  // weights, working memory, the CUDA context, other processes
  // Decode graphs: the logits buffer they all write ([max_num_seqs, V] float32) and the arena for a decode step's
  // temporaries (far less than the prefill measured above), with room to spare. Plus the sampler and fragmentation.
  const int64_t graph_reserve =
      budget.graphs ? int64_t{2} * budget.max_num_seqs * model.config().vocab_size * 4 + (int64_t{256} << 20) : 0;
  const int64_t reserve = graph_reserve + (int64_t{512} << 20);
  const auto usable = static_cast<int64_t>(budget.gpu_memory_utilization * static_cast<double>(mem.total_bytes)) -
                      used - reserve;
  DI_CHECK_ARG(usable >= page_bytes, "gpu_memory_utilization ", budget.gpu_memory_utilization, " of ",
               mem.total_bytes >> 20, " MiB leaves no room for the latent cache (", used >> 20,
               " MiB in use after a step of ", budget.max_num_batched_tokens, " tokens, ", reserve >> 20,
               " MiB reserved for graphs and workspaces)");
  return usable / page_bytes;
}

}  // namespace deepinfer
