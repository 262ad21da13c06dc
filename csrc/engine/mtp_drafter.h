// Speculative decoding's drafter: DeepSeek's MTP layer guesses the next tokens of every running request after each
// step, and the next step verifies them (engine/scheduler.h, engine/model_runner.h).
//
// The MTP layer at position p reads the main model's final hidden state h_p and the token t_{p+1}, and predicts
// t_{p+2} (model/weights.h MtpWeights). After a step, every position p a request computed (a prefill chunk's, or a
// verified decode's accepted ones) has both: h_p from the step, t_{p+1} from the prompt or the tokens just accepted.
// So the layer runs over exactly those positions, which also fills its own latent cache (the cache's last layer) in
// step with the main layers'. At the request's last computed position N - 1 it reads the token just sampled and
// guesses t_{N+1}: the first draft. With k > 1 the layer is applied again at positions N, N + 1, ..., reading its
// own output (after its head's norm, the vector its head reads, as h_p is for the main model) and its previous
// guess; those latents are provisional and are written again once the positions are verified.
//
// Under tensor or expert parallelism the drafter runs on rank 0 and broadcasts each pass of the layer before running
// it (worker_ranks.h DraftPass); every other rank runs the same pass over its shard (run_mtp_layer), so the layer's
// collectives meet, and only rank 0 reads the logits.
//
// Drafts are greedy (the MTP layer's argmax): with a one-token proposal, rejection sampling reduces to sampling the
// target distribution at each position and accepting the draft when the sample equals it, so the verification
// samples each position as a step without drafts would, and greedy and seeded outputs match it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "engine/latent_cache.h"
#include "engine/scheduler.h"
#include "engine/step_batch.h"
#include "model/deepseek.h"
#include "parallel/communicator.h"

namespace deepinfer {

// The most draft tokens a step verifies per request.
inline constexpr int32_t kMaxSpeculativeTokens = 8;

// One chunk of the step that just ran, read before the scheduler's update (which may destroy its request).
struct DraftChunk {
  uint64_t request_id = 0;
  int32_t start = 0;      // the chunk's first position
  int32_t first_row = 0;  // its first token row in the step's batch: where its hidden states are
  bool samples = false;   // the chunk sampled a token: the request may get drafts
};

// One run of the MTP layer over `batch` (on every rank alike), its token row i reading row hidden_rows[i] of
// `hidden`: the logits of its sampling rows, and the device copy of its inputs they were computed from (its sampling
// rows' views stay valid with it). With `out_hidden`, the layer's output hidden states of every row go there.
// Queues device work; does not wait for it.
struct MtpLayerRun {
  Tensor inputs;
  StepInputs bound;
  Tensor logits;  // [sampling rows, vocab_size] float32
};
MtpLayerRun run_mtp_layer(DeepseekModel& model, const LatentCache& cache, const ForwardBatch& batch,
                          ConstTensorView hidden, std::span<const int32_t> hidden_rows, Tensor* out_hidden);

class MtpDrafter {
 public:
  // `model` was loaded with its MTP layer; `cache` holds the MTP layer's latents after the main layers'. Both
  // outlive the drafter. `workers`: rank 0's communicator when other ranks hold shards of the model (they run each
  // pass with it), else null. Throws unless 1 <= num_speculative_tokens <= kMaxSpeculativeTokens.
  MtpDrafter(DeepseekModel& model, const LatentCache& cache, int32_t num_speculative_tokens,
             Communicator* workers = nullptr);

  // After the scheduler's update of the step `chunks` ran: runs the MTP layer over the positions each request still
  // running computed (their hidden states are rows of `step_hidden`, StepRunner::last_hidden), and hands the drafts
  // of each that sampled to the scheduler: at most k, fewer near its max_tokens or max_model_len or where its pages
  // end. Waits for the device.
  void propose(std::span<const DraftChunk> chunks, ConstTensorView step_hidden, Scheduler& scheduler);

  int32_t num_speculative_tokens() const { return k_; }

 private:
  // Runs the MTP layer over `batch` (run_mtp_layer; the workers first get the pass: `hidden` is the step's hidden
  // states when `reads_step_hidden`, else the previous pass's output); returns the greedy token of each logits row.
  std::vector<int32_t> run_pass(const ForwardBatch& batch, ConstTensorView hidden, std::span<const int32_t> hidden_rows,
                                bool reads_step_hidden, Tensor* out_hidden);

  DeepseekModel& model_;
  const LatentCache& cache_;
  int32_t k_;
  Communicator* workers_;
};

}  // namespace deepinfer
