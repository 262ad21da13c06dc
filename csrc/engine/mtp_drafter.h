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
// collectives meet, and only rank 0 reads the logits. Under data-parallel attention each rank holds its own lane's
// requests and hidden states: rank 0 plans every lane's pass and broadcasts them together, each rank runs its own
// lane's (a one-token padding pass where its lane has none, so that the MoE layer's collectives meet), samples its
// drafts and sends them to rank 0.
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
#include "engine/worker_ranks.h"
#include "model/deepseek.h"
#include "parallel/communicator.h"

namespace deepinfer {

// The most draft tokens a step verifies per request.
inline constexpr int32_t kMaxSpeculativeTokens = 8;

// One chunk of the step that just ran, read before the scheduler's update (which may destroy its request).
// first_row refers to the step batch of the chunk's lane.
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

// One lane's step for the drafter: its chunks (DraftChunk) and its scheduler, which gets the lane's drafts.
struct DraftLane {
  std::span<const DraftChunk> chunks;
  Scheduler* scheduler = nullptr;
};

// The greedy token of each logits row of a pass (its sampling rows are greedy): waits for the device.
std::vector<int32_t> sample_drafts(Backend& backend, const MtpLayerRun& run);

class MtpDrafter {
 public:
  // `model` was loaded with its MTP layer; `cache` holds the MTP layer's latents after the main layers'. Both
  // outlive the drafter. `workers`: rank 0's communicator when other ranks hold shards of the model (they run each
  // pass with it), else null. `data_parallel`: the ranks are lanes of data-parallel attention (workers set), whose
  // padding passes write `scratch_page`. Throws unless 1 <= num_speculative_tokens <= kMaxSpeculativeTokens.
  MtpDrafter(DeepseekModel& model, const LatentCache& cache, int32_t num_speculative_tokens,
             Communicator* workers = nullptr, bool data_parallel = false, int32_t scratch_page = -1);

  // After the schedulers' update of the step that ran: runs the MTP layer over the positions each request still
  // running computed (their hidden states are rows of the step's hidden states on their lane's rank; lane 0's are
  // `step_hidden`, StepRunner::last_hidden), and hands the drafts of each that sampled to its scheduler: at most k,
  // fewer near its max_tokens or max_model_len or where its pages end. One lane a rank under data-parallel
  // attention, else one. Waits for the device.
  void propose(std::span<const DraftLane> lanes, ConstTensorView step_hidden);

  int32_t num_speculative_tokens() const { return k_; }

 private:
  struct Lane;
  // Runs one pass for every lane (a padding pass for a lane without one under data-parallel attention), the workers
  // first getting them; returns each lane's greedy tokens (lane 0's run here, the others' from their ranks).
  // `hidden` is lane 0's input: the step's hidden states, or the previous pass's output (`previous`).
  std::vector<std::vector<int32_t>> run_passes(std::vector<DraftPass>& passes, ConstTensorView step_hidden,
                                               Tensor& previous);

  DeepseekModel& model_;
  const LatentCache& cache_;
  int32_t k_;
  Communicator* workers_;
  bool data_parallel_;
  int32_t scratch_page_;
};

}  // namespace deepinfer
