// The ranks of a tensor/expert-parallel model that one process runs besides rank 0 (the engine's step thread): each
// in a thread of its own, with its own backend (GPU r on CUDA), shard of the weights, latent cache and step runner.
//
// Every step rank 0 broadcasts the step's batch (without its sampling inputs) and runs it; each worker runs the same
// forward pass, so the collectives inside it meet, and only rank 0 samples. With MTP speculative decoding rank 0
// also broadcasts each pass of its drafter's MTP layer, which every worker runs with it. A worker that fails aborts
// the group with its error, so rank 0's next collective throws CollectiveError naming it instead of waiting for it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/step_batch.h"
#include "parallel/local_group.h"

namespace deepinfer {

struct EngineOptions;

class WorkerRanks {
 public:
  // Starts ranks 1 .. group.size() - 1 of `group`; each loads its shard of the model at once, then waits for
  // rank 0's cache plan (agree_cache below). `group` and `rank0` (rank 0's communicator) must outlive the workers.
  WorkerRanks(const EngineOptions& options, LocalGroup& group, Communicator& rank0);
  // Ends the workers: a normal stop once they run steps, an abort of the group before (a failed start).
  ~WorkerRanks();
  WorkerRanks(const WorkerRanks&) = delete;
  WorkerRanks& operator=(const WorkerRanks&) = delete;

  // Rank 0's part of the start, after its own load: the group's cache (the fewest pages any rank can hold) and
  // max_model_len. `decide` turns the agreed page count into max_model_len (it may throw: the start fails).
  // Returns {pages, max_model_len}.
  static std::pair<int64_t, int32_t> agree_cache(Communicator& comm, int64_t pages,
                                                 const std::function<int32_t(int64_t)>& decide);
  // Rank 0's stop message, once the workers run steps; the destructor then joins them.
  void stop();

 private:
  std::unique_ptr<const EngineOptions> options_;  // a copy: the workers read it after the constructor returns
  Communicator& rank0_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // one per worker
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

// A worker rank's whole life, in a thread of its own (WorkerRanks) or as the process of a rank that mpirun started:
// loads its shard, takes rank 0's cache plan, then runs every step rank 0 broadcasts until it broadcasts the stop.
// Throws what failed (a CollectiveError when another rank did); the caller then aborts the group with it.
void run_worker_rank(const EngineOptions& options, Communicator& comm);

// What a message from rank 0 asks of the workers: its first word (an empty message is the stop).
enum class RankMessage : int32_t { kStep = 1, kDraftPass = 2, kLaneDraftPasses = 3 };

// Rank 0's side of a step: the workers get its batch before it runs it.
void broadcast_step(Communicator& rank0, const ForwardBatch& batch);
void broadcast_step_words(Communicator& rank0, std::vector<int32_t>& words);

// Data-parallel attention: every lane's (rank's) batch in one message, a lane with nothing to do marked idle (its
// rank runs the batch, a padding step, without sampling); and a rank's sampled rows, which it sends rank 0.
std::vector<int32_t> encode_lanes(const std::vector<StepBatch>& steps, const std::vector<bool>& idle);
std::pair<ForwardBatch, bool> decode_lane(std::span<const int32_t> words, int32_t lane);
std::vector<int32_t> encode_sampled_rows(const std::vector<SampledToken>& rows);
// Data-parallel attention: what each rank r >= 1 made for its lane (`mine`: sampled rows, drafts) goes to rank 0,
// each rank in turn; every rank calls it. On rank 0 element r holds rank r's words (element 0 is empty); elsewhere
// the result is empty.
std::vector<std::vector<int32_t>> send_lanes_to_rank0(Communicator& comm, const std::vector<int32_t>& mine);
std::vector<SampledToken> decode_sampled_rows(std::span<const int32_t> words);
// One pass of the MTP layer (engine/mtp_drafter.h run_mtp_layer): its batch, the rows of the hidden states its
// tokens read, whether those are the last step's (or the previous pass's output), and whether the pass keeps its
// output for the next.
struct DraftPass {
  ForwardBatch batch;
  std::vector<int32_t> hidden_rows;
  bool reads_step_hidden = true;
  bool keeps_hidden = false;
};
std::vector<int32_t> encode_draft_pass(const DraftPass& pass);
DraftPass decode_draft_pass(std::span<const int32_t> words);  // the words after the message's kind
// Data-parallel attention: one pass a lane (rank) in one message; each rank decodes its own.
std::vector<int32_t> encode_lane_draft_passes(std::span<const DraftPass> passes);
DraftPass decode_lane_draft_pass(std::span<const int32_t> words, int32_t lane);  // the words after the kind

// Rank 0's stop: the workers' loops end. A group that already failed is left as it is.
void broadcast_stop(Communicator& rank0);

}  // namespace deepinfer
