#include "engine/worker_ranks.h"

#include <cstdio>
#include <exception>

#include "engine/engine.h"

namespace deepinfer {
void run_worker_rank(const EngineOptions& options, Communicator& comm) {
  LoadedModel loaded = load_model(options, {}, &comm);
  const LatentCacheShape shape = engine_cache_shape(options, loaded.model->config());
  const auto [pages, max_len] = WorkerRanks::agree_cache(comm, local_cache_pages(options, shape, *loaded.model), {});
  if (pages < 0) return;  // rank 0 could not start; it reports why
  const EngineCachePlan plan = engine_cache_plan(options, shape, pages, max_len);
  LatentCache cache(plan.shape, *loaded.backend);
  StepRunner runner(*loaded.model, cache, plan.runner);
  std::vector<int32_t> words;
  while (true) {
    comm.broadcast(words, 0);
    if (words.empty()) return;
    runner.execute_forward(decode_forward_batch(words));
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
  std::vector<int32_t> words = encode_forward_batch(batch);
  rank0.broadcast(words, 0);
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
