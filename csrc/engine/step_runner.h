// Runs one step of the model and samples its tokens on the device: the step's arrays go up in one host-to-device
// copy from staging memory, the sampled tokens come back in its one device-to-host copy. Pure decode steps replay a
// graph recorded for their batch-size and context bucket (CUDA graphs), unless graphs are off.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/latent_cache.h"
#include "engine/step_batch.h"
#include "model/deepseek.h"

namespace deepinfer {

struct StepRunnerOptions {
  bool use_graphs = false;
  int32_t max_graph_batch = 256;  // decode batches up to this many sequences replay graphs
  int32_t max_graph_pages = 0;    // page-table width of the largest context bucket (max_model_len in pages); 0 =
                                  // decode steps keep their own width (no buckets)
  int32_t scratch_page = -1;      // a cache page no request owns: the padding rows of a graph's batch write there
  bool keep_hidden = false;       // keep every token's final hidden state of the last step (the MTP drafter's input)
};

// The decode batch sizes graphs are recorded for, up to `max_batch` (always included).
std::vector<int32_t> graph_batch_buckets(int32_t max_batch);

// A pure decode batch padded to the smallest bucket that holds it, with rows that read and write only
// `scratch_page`, and its page table widened or narrowed to a power of two (at least 8, at most `max_pages`) that
// covers its longest context; decode_context_bound is that width in tokens. The graph of that shape serves it. The
// rows that sample are the same (the first ones); the padding rows' logits exist but nothing samples them.
ForwardBatch pad_decode_batch(const ForwardBatch& batch, std::span<const int32_t> buckets, int32_t max_pages,
                              int32_t scratch_page, int32_t page_size);

// Runs `batch` once, eagerly, outside the step loop (the largest-step profile, the sequence scorer, tests): validates
// it, uploads its arrays in one copy (none on the CPU) and returns the logits of its logits rows as
// [logits rows, vocab_size] float32 in host memory, once the step is done.
Tensor run_forward(DeepseekModel& model, const LatentCache& cache, const ForwardBatch& batch);

// A plan's step's results from its batch's sampled rows (one per logits row): the sampled token of each sampling chunk
// in plan order, and each ScoredRows entry's tokens.
StepResult collect_step_result(const StepBatch& step, std::span<const SampledToken> rows);

// Structured outputs: the mask of each row of `rows` into out[row * words, (row + 1) * words), one task a request on
// the host's threads (a request's rows come together: row j after its first j drafts, consumed and taken back).
void fill_grammar_masks(std::span<const SamplingBatch::GrammarRow> rows, int64_t words, uint32_t* out);

class StepRunner {
 public:
  StepRunner(DeepseekModel& model, const LatentCache& cache, StepRunnerOptions options);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Runs `batch` (batch.sampling filled in for each logits row) and returns one SampledToken per logits row.
  // Validates the batch and its sampling inputs on the host first.
  std::vector<SampledToken> execute(const ForwardBatch& batch);
  // Runs a plan's step: one SampledToken per sampling chunk, in the plan's order, and the scored prompt tokens.
  StepResult execute(const StepBatch& step);
  // Runs `batch`'s forward pass exactly as execute() does (the same graph or eager path), without sampling: what the
  // ranks of a parallel model other than rank 0 run each step. Returns once the step is done.
  void execute_forward(const ForwardBatch& batch);

  // With keep_hidden: the final hidden states ([tokens, hidden_size], after model.norm) of the last step's token
  // rows, in its batch's order, on the device; valid until the next step.
  ConstTensorView last_hidden() const { return last_hidden_; }

  int64_t num_graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t num_graph_replays() const { return num_replays_; }
  int64_t num_graph_captures() const { return num_captures_; }  // more than num_graphs() when graphs were renewed
  // Structured outputs: the grammar masks filled so far, and the host time it took (beside the forward pass).
  int64_t num_grammar_masks() const { return num_grammar_masks_; }
  double grammar_mask_seconds() const { return grammar_mask_seconds_; }

 private:
  struct Graph {
    std::unique_ptr<StepGraph> graph;
    StepInputs inputs;  // views of graph_inputs_ laid out for this graph's key
  };
  using GraphKey = std::pair<int32_t, int32_t>;  // padded batch, page-table width

  // The logits of a step's forward pass (a graph's, or those of an eager run, which the struct keeps alive), and the
  // views of its inputs.
  struct Forward {
    Tensor eager_inputs, eager_logits;
    ConstTensorView logits;
    StepInputs in;
  };
  // Where a step of `tokens` rows writes its hidden states (keep_hidden), or an empty view.
  TensorView hidden_rows(int64_t tokens, bool graph);
  Forward forward(const ForwardBatch& batch);
  bool graph_eligible(const ForwardBatch& batch) const;
  // Copies the packed arrays into `dst` (device) through the staging buffer.
  void upload(const std::vector<int32_t>& packed, TensorView dst);
  // Structured outputs: the allowed-token bitmaps of the step's constrained rows, [G, ceil(V / 32)] on the device.
  // Filled on the host (several matchers at once) after the forward pass was launched, so they overlap it.
  // The sampler's allowed_tokens rows on the device: `sb`'s grammars' masks filled here, or its given masks.
  ConstTensorView grammar_masks(const SamplingBatch& sb);
  ConstTensorView replay_graph(const ForwardBatch& padded, const StepLayout& layout);

  DeepseekModel& model_;
  Backend& backend_;
  const LatentCache& cache_;
  StepRunnerOptions options_;
  std::vector<int32_t> buckets_;
  std::vector<int32_t> packed_;   // host scratch for pack_step
  Tensor staging_;                // page-locked on a GPU
  Tensor mask_staging_;           // page-locked: the grammar masks, apart from staging_ (its copy may be in flight)
  Tensor masks_;                  // device: the grammar masks the sampler reads
  Tensor graph_inputs_;           // device: the packed arrays every graph reads (its address is recorded)
  Tensor graph_logits_;           // device: [largest bucket, V] float32, where every graph writes its logits
  Tensor graph_hidden_;           // device: [largest bucket, D], where every graph writes its hidden states
  Tensor eager_hidden_;           // device: the last eager step's hidden states
  ConstTensorView last_hidden_;
  std::map<GraphKey, Graph> graphs_;
  int64_t num_replays_ = 0;
  int64_t num_captures_ = 0;
  int64_t num_grammar_masks_ = 0;
  double grammar_mask_seconds_ = 0.0;
};

}  // namespace deepinfer
