// Runs one sequence through the model outside the engine loop and returns its last-position logits. Used by
// parity tests against reference implementations, and to check that chunked prefill and absorbed decode agree.
#pragma once

#include <span>
#include <vector>

#include "engine/engine.h"

namespace deepinfer {

class SequenceScorer {
 public:
  explicit SequenceScorer(const EngineOptions& options);

  const ModelConfig& model_config() const { return loaded_.model->config(); }

  // Prefills tokens[0, n - decode_tail) in chunks of `prefill_chunk` tokens (0 = one chunk), then feeds the last
  // `decode_tail` tokens one at a time through the absorbed decode path. Returns the logits after the last token.
  std::vector<float> last_logits(std::span<const int32_t> tokens, int32_t prefill_chunk, int32_t decode_tail);

 private:
  EngineOptions options_;
  LoadedModel loaded_;
};

}  // namespace deepinfer
