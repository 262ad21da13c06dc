#include "engine/worker_ranks.h"

#include <cstring>
#include <exception>

#include "engine/engine.h"
#include "engine/mtp_drafter.h"

namespace deepinfer {
namespace {

// Waits for the device work that produced `logits` (one value copied back), so that a failure shows in the pass
// that caused it and the rank keeps pace with rank 0.
void wait_for(Backend& backend, ConstTensorView logits) {
  if (logits.numel() == 0) return;
  float first = 0.0f;
  backend.copy_to_host(logits.rows(0, 1).columns(0, 1), TensorView{&first, DType::kF32, Shape{1, 1}, Device::kCpu});
}

}  // namespace

void run_worker_rank(const EngineOptions& options, Communicator& comm) {
  LoadedModel loaded = load_model(options, {}, &comm);
  const LatentCacheShape shape = engine_cache_shape(options, loaded.model->config());
  const auto [pages, max_len] = WorkerRanks::agree_cache(comm, local_cache_pages(options, shape, *loaded.model), {});
  if (pages < 0) return;  // rank 0 could not start; it reports why
  const EngineCachePlan plan = engine_cache_plan(options, shape, pages, max_len);
  LatentCache cache(plan.shape, *loaded.backend);
  StepRunner runner(*loaded.model, cache, plan.runner);
  Tensor draft_hidden;  // the output of the drafter's last pass that kept it
  std::vector<int32_t> words;
  while (true) {
    comm.broadcast(words, 0);
    if (words.empty()) return;
    const auto kind = static_cast<RankMessage>(words[0]);
    const std::span<const int32_t> body = std::span<const int32_t>(words).subspan(1);
    if (kind == RankMessage::kDraftPass || kind == RankMessage::kLaneDraftPasses) {
      // A pass of rank 0's drafter: this rank runs the layer with it (its collectives, its cache); under data-parallel
      // attention over its own lane, whose drafts it samples and sends to rank 0.
      const bool own_lane = kind == RankMessage::kLaneDraftPasses;
      const DraftPass pass = own_lane ? decode_lane_draft_pass(body, comm.rank()) : decode_draft_pass(body);
      Tensor kept;
      const MtpLayerRun run = run_mtp_layer(*loaded.model, cache, pass.batch,
                                            pass.reads_step_hidden ? runner.last_hidden() : draft_hidden.cview(),
                                            pass.hidden_rows, pass.keeps_hidden ? &kept : nullptr);
      std::vector<int32_t> drafts;
      if (own_lane) {
        drafts = sample_drafts(*loaded.backend, run);
      } else {
        wait_for(*loaded.backend, run.logits.cview());
      }
      if (pass.keeps_hidden) draft_hidden = std::move(kept);
      if (own_lane) send_lanes_to_rank0(comm, drafts);
      continue;
    }
    DI_CHECK(kind == RankMessage::kStep, "rank ", comm.rank(), ": a message of unknown kind ", words[0]);
    if (!options.enable_dp_attention) {
      runner.execute_forward(decode_forward_batch(body));  // rank 0 samples
      continue;
    }
    // Data-parallel attention: this rank's own lane, sampled here; the rows go to rank 0, each rank in turn.
    const auto [batch, idle] = decode_lane(body, comm.rank());
    std::vector<int32_t> rows;
    if (idle) {
      runner.execute_forward(batch);
    } else {
      rows = encode_sampled_rows(runner.execute(batch));
    }
    send_lanes_to_rank0(comm, rows);
  }
}

WorkerRanks::WorkerRanks(const EngineOptions& options, LocalGroup& group, Communicator& rank0)
    : options_(std::make_unique<EngineOptions>(options)), rank0_(rank0) {
  for (int32_t rank = 1; rank < group.size(); ++rank) {
    comms_.push_back(group.communicator(rank));
    Communicator& comm = *comms_.back();
    threads_.emplace_back([this, &comm] {
      try {
        run_worker_rank(*options_, comm);
      } catch (const CollectiveError&) {
        // The group failed elsewhere (another rank's error, or rank 0 ending a failed start); rank 0 reports it.
      } catch (const std::exception& e) {
        comm.abort(e.what());
      }
    });
  }
}

WorkerRanks::~WorkerRanks() {
  if (!stopped_) rank0_.abort("the engine stopped before its ranks started");
  for (std::thread& t : threads_) t.join();
}

std::pair<int64_t, int32_t> WorkerRanks::agree_cache(Communicator& comm, int64_t pages,
                                                     const std::function<int32_t(int64_t)>& decide) {
  int64_t fewest = pages;
  comm.all_reduce_host({&fewest, 1}, HostReduce::kMin);
  std::vector<int32_t> plan;
  if (comm.rank() == 0) {
    int32_t max_len = -1;
    try {
      max_len = decide(fewest);
    } catch (...) {
      plan = {-1, -1};
      comm.broadcast(plan, 0);
      throw;
    }
    plan = {static_cast<int32_t>(fewest), max_len};
  }
  comm.broadcast(plan, 0);
  return {plan[0], plan[1]};
}

void WorkerRanks::stop() {
  if (stopped_) return;
  stopped_ = true;
  broadcast_stop(rank0_);
}

void broadcast_step(Communicator& rank0, const ForwardBatch& batch) {
  std::vector<int32_t> words{static_cast<int32_t>(RankMessage::kStep)};
  const std::vector<int32_t> forward = encode_forward_batch(batch);
  words.insert(words.end(), forward.begin(), forward.end());
  rank0.broadcast(words, 0);
}

void broadcast_step_words(Communicator& rank0, std::vector<int32_t>& words) { rank0.broadcast(words, 0); }

std::vector<int32_t> encode_lanes(const std::vector<StepBatch>& steps, const std::vector<bool>& idle) {
  std::vector<int32_t> words{static_cast<int32_t>(RankMessage::kStep), static_cast<int32_t>(steps.size())};
  for (size_t r = 0; r < steps.size(); ++r) {
    const std::vector<int32_t> lane = encode_forward_batch(steps[r].forward);
    words.push_back(idle[r] ? 1 : 0);
    words.push_back(static_cast<int32_t>(lane.size()));
    words.insert(words.end(), lane.begin(), lane.end());
  }
  return words;
}

std::pair<ForwardBatch, bool> decode_lane(std::span<const int32_t> words, int32_t lane) {
  DI_CHECK(!words.empty() && lane >= 0 && lane < words[0], "lane ", lane, " of a step of ",
           words.empty() ? 0 : words[0], " lanes");
  size_t at = 1;
  for (int32_t r = 0;; ++r) {
    DI_CHECK(at + 2 <= words.size() && words[at + 1] >= 0 &&
                 static_cast<size_t>(words[at + 1]) <= words.size() - at - 2,
             "a step's lanes cut short at lane ", r);
    const bool idle = words[at] != 0;
    const auto n = static_cast<size_t>(words[at + 1]);
    if (r == lane) return {decode_forward_batch(words.subspan(at + 2, n)), idle};
    at += 2 + n;
  }
}

std::vector<int32_t> encode_sampled_rows(const std::vector<SampledToken>& rows) {
  static_assert(sizeof(SampledToken) == kSampledTokenWords * sizeof(int32_t));
  std::vector<int32_t> words(rows.size() * kSampledTokenWords);
  std::memcpy(words.data(), rows.data(), words.size() * sizeof(int32_t));
  return words;
}

std::vector<std::vector<int32_t>> send_lanes_to_rank0(Communicator& comm, const std::vector<int32_t>& mine) {
  std::vector<std::vector<int32_t>> lanes(comm.rank() == 0 ? static_cast<size_t>(comm.size()) : 0);
  for (int32_t r = 1; r < comm.size(); ++r) {
    std::vector<int32_t> sent = r == comm.rank() ? mine : std::vector<int32_t>{};
    comm.broadcast(sent, r);
    if (comm.rank() == 0) lanes[static_cast<size_t>(r)] = std::move(sent);
  }
  return lanes;
}

std::vector<SampledToken> decode_sampled_rows(std::span<const int32_t> words) {
  DI_CHECK(words.size() % kSampledTokenWords == 0, "sampled rows of ", words.size(), " words");
  std::vector<SampledToken> rows(words.size() / kSampledTokenWords);
  std::memcpy(rows.data(), words.data(), words.size() * sizeof(int32_t));
  return rows;
}

std::vector<int32_t> encode_draft_pass(const DraftPass& pass) {
  std::vector<int32_t> words{static_cast<int32_t>(RankMessage::kDraftPass), pass.reads_step_hidden ? 1 : 0,
                             pass.keeps_hidden ? 1 : 0, static_cast<int32_t>(pass.hidden_rows.size())};
  words.insert(words.end(), pass.hidden_rows.begin(), pass.hidden_rows.end());
  const std::vector<int32_t> forward = encode_forward_batch(pass.batch);
  words.insert(words.end(), forward.begin(), forward.end());
  return words;
}

DraftPass decode_draft_pass(std::span<const int32_t> words) {
  DI_CHECK(words.size() >= 3 && words[2] >= 0 && static_cast<size_t>(words[2]) <= words.size() - 3,
           "a draft pass message of ", words.size(), " words is cut short");
  const auto rows = static_cast<size_t>(words[2]);
  return {.batch = decode_forward_batch(words.subspan(3 + rows)),
          .hidden_rows = std::vector<int32_t>(words.begin() + 3, words.begin() + 3 + static_cast<std::ptrdiff_t>(rows)),
          .reads_step_hidden = words[0] != 0,
          .keeps_hidden = words[1] != 0};
}

std::vector<int32_t> encode_lane_draft_passes(std::span<const DraftPass> passes) {
  std::vector<int32_t> words{static_cast<int32_t>(RankMessage::kLaneDraftPasses), static_cast<int32_t>(passes.size())};
  for (const DraftPass& pass : passes) {
    const std::vector<int32_t> one = encode_draft_pass(pass);  // its kind word first, left out here
    words.push_back(static_cast<int32_t>(one.size() - 1));
    words.insert(words.end(), one.begin() + 1, one.end());
  }
  return words;
}

DraftPass decode_lane_draft_pass(std::span<const int32_t> words, int32_t lane) {
  DI_CHECK(!words.empty() && lane >= 0 && lane < words[0], "lane ", lane, " of draft passes of ",
           words.empty() ? 0 : words[0], " lanes");
  size_t at = 1;
  for (int32_t r = 0;; ++r) {
    DI_CHECK(at < words.size() && words[at] >= 0 && static_cast<size_t>(words[at]) <= words.size() - at - 1,
             "draft passes cut short at lane ", r);
    const auto n = static_cast<size_t>(words[at]);
    if (r == lane) return decode_draft_pass(words.subspan(at + 1, n));
    at += 1 + n;
  }
}

void broadcast_stop(Communicator& rank0) {
  std::vector<int32_t> none;
  try {
    rank0.broadcast(none, 0);
  } catch (const CollectiveError&) {
    // A worker already failed: the others have stopped on that error.
  }
}

}  // namespace deepinfer
