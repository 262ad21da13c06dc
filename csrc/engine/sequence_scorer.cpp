#include "engine/sequence_scorer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/step_batch.h"
#include "engine/step_runner.h"

namespace deepinfer {

SequenceScorer::SequenceScorer(const EngineOptions& options) : options_(options), loaded_(load_model(options)) {}

std::vector<float> SequenceScorer::last_logits(std::span<const int32_t> tokens, int32_t prefill_chunk,
                                               int32_t decode_tail) {
  const auto n = static_cast<int32_t>(tokens.size());
  DI_CHECK_ARG(n > 0, "no tokens to score");
  DI_CHECK_ARG(decode_tail >= 0 && decode_tail < n, "decode_tail ", decode_tail, " must be in [0, ", n, ")");
  DI_CHECK_ARG(prefill_chunk >= 0, "prefill_chunk must be >= 0");
  const ModelConfig& c = loaded_.model->config();
  const int32_t page_size = options_.page_size;
  const int32_t num_pages = (n + page_size - 1) / page_size;
  LatentCacheShape shape = engine_cache_shape(options_, c);
  shape.num_pages = num_pages + 1;
  LatentCache cache(shape, loaded_.model->backend());
  // Pages in reverse order, so a page-table bug cannot hide behind an identity mapping.
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.rbegin(), pages.rend(), 1);

  std::vector<float> logits;
  int32_t done = 0;
  while (done < n) {
    const int32_t prefill_end = n - decode_tail;
    int32_t count = done < prefill_end ? (prefill_chunk > 0 ? std::min(prefill_chunk, prefill_end - done)
                                                            : prefill_end - done)
                                       : 1;
    ForwardBatchBuilder builder(page_size, num_pages);
    builder.add(tokens.subspan(static_cast<size_t>(done), static_cast<size_t>(count)), done, pages, /*samples=*/true);
    const Tensor out = run_forward(*loaded_.model, cache, std::move(builder).take());
    logits.assign(out.f32_span().begin(), out.f32_span().end());
    done += count;
  }
  return logits;
}

}  // namespace deepinfer
