// The engine: a model, its latent cache, the scheduler and the sampler, stepped by a C++ thread. Callers add
// requests and collect outputs from any thread; nothing here needs Python's GIL.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/cache_manager.h"
#include "engine/latent_cache.h"
#include "engine/mtp_drafter.h"
#include "engine/sample_result.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "engine/worker_ranks.h"
#include "parallel/local_group.h"
#include "model/deepseek.h"

namespace deepinfer {

enum class LoadFormat : uint8_t { kSafetensors, kDummy };
// Who starts the ranks of a parallel model: this process (ranks 1.. as threads, one a GPU), or one process a rank
// started by mpirun (kMpi) or by anything else, the processes meeting at EngineOptions::dist_init_addr (kAddress: one
// command a machine, torchrun, a LeaderWorkerSet). Rank 0's process runs the engine, the others run_worker_rank.
enum class RankLaunch : uint8_t { kInProcess, kMpi, kAddress };

enum class KvCacheDtype : uint8_t { kAuto, kFp8 };

struct EngineOptions {
  std::string model_path;                    // Hugging Face directory (config.json; safetensors unless dummy)
  LoadFormat load_format = LoadFormat::kSafetensors;
  std::string device = "cpu";                // "cpu" or "cuda"
  uint64_t seed = 0;                         // seeds dummy weights and requests without a seed
  int32_t page_size = 64;
  int64_t cache_memory_bytes = int64_t{1} << 30;  // CPU: latent cache budget when num_cache_pages == 0
  double gpu_memory_utilization = 0.9;       // CUDA: fraction of the GPU for weights + working memory + cache
  int32_t num_cache_pages = 0;
  int32_t max_model_len = 0;                 // 0: min(max_position_embeddings, what the cache holds)
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  bool enforce_eager = false;                // CUDA: no decode graphs
  bool enable_prefix_caching = true;         // requests share the latent pages of their common prefixes
  // Linear layers' weights in block-scaled FP8: an FP8 checkpoint's as stored, a bf16 checkpoint's quantized at load.
  // The CPU computes with their dequantized values (exactly the FP8 weights, in float32).
  bool fp8_weights = false;
  bool fp8_activations = true;               // W8A8 (prefill GEMMs quantize activations); false: weight-only FP8
  // A bf16/fp32 checkpoint's linear layers rounded to INT4 at load (model/int4.h round_int4: groups of
  // int4_group_size inputs, -1 per output channel; zero points unless int4_symmetric). A checkpoint that stores
  // 4-bit weights (compressed-tensors, AWQ) is read as stored without it. On a GPU the weights stay packed (W4A16
  // kernels); the CPU computes with the dequantized values in float32.
  bool int4_weights = false;
  int64_t int4_group_size = 128;
  bool int4_symmetric = false;
  // The latent cache in the model's activation dtype, or in FP8 (backend/ops/latent_fp8.h: 656 bytes a token a layer
  // at DeepSeek's dims instead of 1,152 in bf16).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // Tensor parallelism (model_shard.h): the model split across this many ranks, one a GPU (devices 0 .. n - 1) or,
  // on the CPU, a thread; one scheduler steps them all. With enable_expert_parallel the routed experts are
  // partitioned across the ranks instead of split.
  int32_t tensor_parallel_size = 1;
  bool enable_expert_parallel = false;
  // Data-parallel attention over the tensor_parallel_size ranks (with enable_expert_parallel, model_shard.h): each
  // rank serves its own requests with its own latent cache; one scheduler plans them all, a lane a rank.
  bool enable_dp_attention = false;
  double collective_timeout_s = 600.0;       // a rank that does not reach a collective this long fails the engine
  // MTP speculative decoding (engine/mtp_drafter.h): the checkpoint's MTP layer drafts this many tokens a request
  // after every step and the next step verifies them; 0 = off. One rank only.
  int32_t num_speculative_tokens = 0;
  // Requests admitted while the engine holds more than this many (running and waiting, the new one included) do not
  // speculate, for their whole life (vLLM's disable_by_batch_size): at large batches a speculative step's extra
  // bytes (the MTP layer, the experts its drafts route to) outweigh its accepted tokens. 0 = every request drafts.
  int32_t speculative_disable_by_batch_size = 0;
  // Benchmarks only: each draft is accepted with this probability instead of by verification (>= 0), so a speed
  // can be measured at a chosen acceptance rate on random weights. The output is not the model's. -1 = off.
  double speculative_forced_acceptance = -1.0;
  RankLaunch rank_launch = RankLaunch::kInProcess;
  // kAddress: where the ranks meet ("HOST:PORT", served by rank 0, so HOST is rank 0's machine), this process's rank
  // in [0, tensor_parallel_size), and the GPU it takes on its machine.
  std::string dist_init_addr;
  int32_t rank = 0;
  int32_t local_rank = 0;
  // Structured outputs (engine/grammar): the llguidance wheel's shared library and the text of the checkpoint's
  // tokenizer.json, taken at the first constrained request. No library: constrained requests are refused, saying why.
  std::string grammar_library;
  std::string tokenizer_json;

  void validate() const;
  std::chrono::milliseconds collective_timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(collective_timeout_s * 1000.0));
  }
};

struct RequestOutputDelta {
  uint64_t id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<SampleResult> logprobs;  // one per new token when the request asked for logprobs
  // With prompt_logprobs: the logprobs of the next prompt tokens (prompt token 1 first; token 0 has none), in order.
  std::vector<SampleResult> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                   // set with finish_reason kError
  int32_t num_preemptions = 0;
  int32_t num_cached_tokens = 0;       // prompt tokens the request's admission found in the prefix cache
};

struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_cache_pages = 0;
  int32_t num_free_cache_pages = 0;
  uint64_t num_preemptions = 0;
  uint64_t num_steps = 0;
  uint64_t num_prompt_tokens_computed = 0;
  uint64_t num_generated_tokens = 0;
  uint64_t prefix_cache_queries = 0;         // prompt + output tokens looked up in the prefix cache at admissions
  uint64_t prefix_cache_hits = 0;            // of them, found cached
  double step_seconds = 0.0;                 // wall time inside steps (host work, device work, the token copy)
  uint64_t num_decode_steps = 0;             // steps whose every sequence decoded one token
  double decode_step_seconds = 0.0;          // their share of step_seconds
  uint64_t num_graph_replays = 0;            // decode steps that replayed a recorded graph
  uint64_t num_grammar_masks = 0;            // structured outputs: token masks computed (one a constrained row)
  double grammar_mask_seconds = 0.0;         // host time computing them, while the device runs the forward pass
  // Speculative decoding: verifications (a request's step with drafts), the drafts they checked, those accepted,
  // and the acceptances by draft position (index 0: the first draft).
  uint64_t spec_num_drafts = 0;
  uint64_t spec_num_draft_tokens = 0;
  uint64_t spec_num_requests_not_speculating = 0;  // admitted past speculative_disable_by_batch_size
  uint64_t spec_num_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_position;
  std::string spec_drafter_failure;          // why drafting stopped (the engine goes on without it), or ""
  int64_t num_graphs = 0;                    // graphs recorded so far
  bool alive = true;
  std::string failure;                       // why the engine stopped stepping (a failed rank), when !alive
};

// A model ready to run, on the backend of the options' device: the whole model, or under tensor parallelism the shard
// of `comm`'s rank (on GPU `comm->rank()`), which reads only its slices of the checkpoint.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  // The device collectives of a GPU rank (NCCL, its host collectives through the group's communicator); a CPU rank
  // computes in host memory and uses the group's communicator itself.
  std::unique_ptr<Communicator> device_comm;
  std::unique_ptr<DeepseekModel> model;
};
LoadedModel load_model(const EngineOptions& options, const LoadProgress& progress = {}, Communicator* comm = nullptr);

// The latent cache of every rank: its shape (num_pages unset), the pages this rank's memory holds, and, once the
// ranks agree on the pages and max_model_len, the cache with its graph scratch page and the step runner's options.
LatentCacheShape engine_cache_shape(const EngineOptions& options, const ModelConfig& config);
// The GPU of `rank` on its machine.
int local_device(const EngineOptions& options, int32_t rank);

// The communicator of ranks that are processes (rank_launch kMpi or kAddress), every rank of the group calling it at
// once; throws when the launch started another number of processes than tensor_parallel_size.
std::unique_ptr<Communicator> make_process_communicator(const EngineOptions& options);
int64_t local_cache_pages(const EngineOptions& options, const LatentCacheShape& shape, DeepseekModel& model);
struct EngineCachePlan {
  LatentCacheShape shape;  // num_pages includes the scratch page
  int32_t scratch_page = -1;
  StepRunnerOptions runner;
};
EngineCachePlan engine_cache_plan(const EngineOptions& options, LatentCacheShape shape, int64_t pages,
                                  int32_t max_model_len);

class Engine {
 public:
  static std::unique_ptr<Engine> create(const EngineOptions& options, const LoadProgress& progress = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& model_config() const { return model_->config(); }
  // The resident weights' bytes by dtype name ("float8_e4m3fn", "bfloat16", ...; FP8 scales count as float32).
  std::vector<std::pair<std::string, int64_t>> weight_bytes() const;
  const EngineOptions& options() const { return options_; }
  int32_t max_model_len() const { return scheduler_config_.max_model_len; }
  // The latent cache's dtype name ("bfloat16", "float32", or "float8_e4m3fn" for the FP8 layout) and the bytes one
  // token takes in it, over all layers.
  std::string cache_dtype() const;
  int64_t cache_bytes_per_token() const;

  // Validates and queues a request; throws InvalidArgument (and changes nothing) when it cannot be served.
  // Structured outputs: opens the grammar engine and builds the tokenizer's token trie now (about a second), so the
  // first constrained request does not wait for it. Throws when the engine has no grammar library.
  void prepare_grammar();
  void add_request(uint64_t id, std::vector<int32_t> prompt_token_ids, SamplingParams params);
  struct NewRequest {
    uint64_t id;
    std::vector<int32_t> prompt_token_ids;
    SamplingParams params;
  };
  // Queues a batch of requests together: all are validated before any is queued, and the step thread sees them in
  // one admission, so an offline batch is scheduled the same way however the threads interleave.
  void add_requests(std::vector<NewRequest> requests);
  // Benchmarks only: sets EngineOptions::speculative_forced_acceptance for the steps that follow.
  void set_speculative_forced_acceptance(double rate);
  // Finishes a request with reason kAbort and frees its pages; unknown ids are ignored.
  void abort(uint64_t id);
  // Blocks until outputs are available or `timeout_s` passes; returns what has accumulated.
  std::vector<RequestOutputDelta> wait_outputs(double timeout_s);
  EngineStats stats() const;
  // Aborts everything and joins the step thread. Idempotent; the destructor calls it.
  void shutdown();

 private:
  struct Ranks;  // the other ranks of a parallel model
  Engine(EngineOptions options, std::unique_ptr<Ranks> ranks, LoadedModel loaded, const EngineCachePlan& plan,
         SchedulerConfig scheduler_config);
  void loop();
  void step_once();
  // Prompt tokens the plan computes (its chunks may also recompute output tokens after a preemption).
  static uint64_t num_prompt_tokens(const SchedulePlan& plan);
  // Applies the plan's sampled tokens (one per sampling chunk, in plan order) and emits each request's delta.
  void emit_prompt_logprobs(const SchedulePlan& plan, std::span<const ScoredRows> scored,
                            std::span<const std::vector<SampledToken>> tokens);
  struct Lane;
  // Returns the tokens generated.
  uint64_t emit_updates(Lane& lane, const SchedulePlan& plan, const StepBatch& step,
                        std::span<const SampledToken> sampled);
  // The verification of a chunk's drafts: how many leading drafts its sampled rows accept.
  int32_t accepted_drafts(const ScheduledChunk& chunk, std::span<const SampledToken> rows);
  // Runs each lane's step on its rank (an idle lane's rank a padding step): the lanes' results, rank 0 sampling
  // its own and the others sending theirs.
  std::vector<StepResult> execute_lanes(std::vector<StepBatch>& steps, const std::vector<bool>& idle);
  StepBatch idle_step() const;
  void record_step(std::chrono::steady_clock::duration elapsed, bool pure_decode, uint64_t prompt_tokens,
                   uint64_t generated_tokens);
  void admit_pending();
  void fail_plan(Lane& lane, const SchedulePlan& plan, const std::string& message);
  bool has_unfinished() const;
  void update_lane_stats();
  // A failure of rank 0's part of a step (`what`: "rank 0's step", ...): a collective's, or any while other ranks
  // may be inside the step's collectives, ends the group and every request (true); with one rank, the caller
  // recovers (false).
  bool ended_group(const std::exception& e, std::string_view what);  // the lanes' sums into stats_; the caller holds mutex_
  // Ends every request with `message` and refuses new ones: the ranks of a parallel model can no longer step.
  void fail_all(const std::string& message);
  void emit(RequestOutputDelta delta);

  EngineOptions options_;
  // Under tensor parallelism: rank 0's communicator and, when this process started the other ranks, their group and
  // threads (stopped after the step thread, before this rank's model goes).
  struct Ranks {
    std::unique_ptr<LocalGroup> group;    // ranks in this process
    std::unique_ptr<Communicator> comm;   // rank 0's
    std::unique_ptr<WorkerRanks> workers; // ranks in this process
  };
  std::unique_ptr<Ranks> ranks_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeepseekModel> model_;
  LatentCache cache_;
  SchedulerConfig scheduler_config_;
  // The requests of one data-parallel rank: its cache's pages and the scheduler that plans them. One lane without
  // data-parallel attention. Touched only by the step thread.
  struct Lane {
    Lane(int32_t pages, int32_t page_size, bool prefix_caching, const SchedulerConfig& config)
        : cache_manager(pages, page_size, prefix_caching), scheduler(config, cache_manager) {}
    CacheManager cache_manager;
    Scheduler scheduler;
  };
  std::vector<std::unique_ptr<Lane>> lanes_;
  // The lane (data-parallel rank) a new request with `prompt` joins.
  // `prefix_root`: the request's Request::prefix_root, under which its cached prefix is looked up.
  Lane* choose_lane(std::span<const int32_t> prompt, uint64_t prefix_root);
  int32_t scratch_page_ = -1;                        // a page no request owns (graphs' padding, idle DP steps)
  StepRunner runner_;                                // touched only by the step thread
  std::unique_ptr<MtpDrafter> drafter_;              // speculative decoding; touched only by the step thread
  std::atomic<double> forced_acceptance_{-1.0};     // speculative_forced_acceptance, settable while running
  uint64_t forced_acceptance_draws_ = 0;             // the counter of its draws
  std::mt19937_64 seed_rng_;                         // the seeds of requests without one of their own

  struct PendingRequest {
    uint64_t id;
    std::vector<int32_t> prompt;
    SamplingParams params;
    std::unique_ptr<GrammarMatcher> grammar;
  };
  // Validates a request and compiles its grammar (throws InvalidArgument, changing nothing, when it cannot be served).
  PendingRequest checked_request(uint64_t id, std::vector<int32_t> prompt, SamplingParams params);
  // Structured outputs: compiles the request's grammar (on the caller's thread), opening the grammar engine first.
  std::unique_ptr<GrammarMatcher> compile_grammar(uint64_t id, const GrammarSpec& spec);
  GrammarCompiler& grammar_compiler();
  std::mutex grammar_mutex_;
  std::unique_ptr<GrammarCompiler> grammar_compiler_;  // made at the first constrained request
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable output_cv_;
  std::deque<PendingRequest> pending_;
  std::vector<uint64_t> pending_aborts_;
  std::vector<RequestOutputDelta> outputs_;
  EngineStats stats_;
  bool stopping_ = false;
  std::string broken_;  // why the engine can no longer step (a failed rank), or ""
  std::thread thread_;
};

}  // namespace deepinfer
