#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "engine/device_backend.h"
#include "engine/grammar/llguidance_compiler.h"
#include "engine/host_parallel.h"
#include "core/counter_rng.h"
#include "engine/model_runner.h"
#include "parallel/gloo_communicator.h"
#include "parallel/mpi_communicator.h"
#include "model/fp4_source.h"
#include "model/int4_source.h"
#include "model/sharded_source.h"

namespace deepinfer {

void EngineOptions::validate() const {
  DI_CHECK_ARG(!model_path.empty(), "model_path is empty");
  DI_CHECK_ARG(device == "cpu" || device == "cuda", "device must be 'cpu' or 'cuda', got '", device, "'");
  DI_CHECK_ARG(page_size > 0 && page_size <= 1024, "page_size must be in [1, 1024], got ", page_size);
  DI_CHECK_ARG(num_cache_pages >= 0, "num_cache_pages must be >= 0, got ", num_cache_pages);
  DI_CHECK_ARG(num_cache_pages > 0 || cache_memory_bytes > 0, "cache_memory_bytes must be > 0, got ",
               cache_memory_bytes);
  DI_CHECK_ARG(max_model_len >= 0, "max_model_len must be >= 0, got ", max_model_len);
  DI_CHECK_ARG(max_num_seqs > 0, "max_num_seqs must be > 0, got ", max_num_seqs);
  DI_CHECK_ARG(max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ", max_num_batched_tokens);
  DI_CHECK_ARG(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0,
               "gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization);
  DI_CHECK_ARG(tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1, got ", tensor_parallel_size);
  DI_CHECK_ARG(!(int4_weights && fp8_weights), "INT4 and FP8 weights at once: choose one quantization");
  DI_CHECK_ARG(!int4_weights || int4_group_size > 0 || int4_group_size == -1,
               "int4_group_size must be > 0 or -1 (one group per output channel), got ", int4_group_size);
  DI_CHECK_ARG(!enable_expert_parallel || tensor_parallel_size > 1,
               "enable_expert_parallel needs more than one rank (tensor_parallel_size ", tensor_parallel_size, ")");
  DI_CHECK_ARG(!enable_dp_attention || (tensor_parallel_size > 1 && enable_expert_parallel),
               "enable_dp_attention needs tensor_parallel_size > 1 ranks and enable_expert_parallel (the experts are "
               "what the data-parallel ranks share)");
  DI_CHECK_ARG(rank_launch != RankLaunch::kAddress || tensor_parallel_size == 1 || !dist_init_addr.empty(),
               "ranks meeting at an address need dist_init_addr (HOST:PORT of rank 0's machine)");
  DI_CHECK_ARG(rank >= 0 && rank < tensor_parallel_size, "rank ", rank, " is not a rank of tensor_parallel_size ",
               tensor_parallel_size);
  DI_CHECK_ARG(local_rank >= 0, "local_rank must be >= 0, got ", local_rank);
  DI_CHECK_ARG(collective_timeout_s > 0.0, "collective_timeout_s must be > 0, got ", collective_timeout_s);
  DI_CHECK_ARG(num_speculative_tokens >= 0 && num_speculative_tokens <= kMaxSpeculativeTokens,
               "num_speculative_tokens must be in [0, ", kMaxSpeculativeTokens, "], got ", num_speculative_tokens);
  DI_CHECK_ARG(speculative_disable_by_batch_size >= 0, "speculative disable_by_batch_size must be >= 1 (or 0: off), got ",
               speculative_disable_by_batch_size);
  DI_CHECK_ARG(speculative_disable_by_batch_size == 0 || num_speculative_tokens > 0,
               "speculative disable_by_batch_size is set without speculative decoding (num_speculative_tokens 0)");
  DI_CHECK_ARG(speculative_forced_acceptance < 0.0 || speculative_forced_acceptance <= 1.0,
               "speculative_forced_acceptance must be in [0, 1] or negative (off), got ", speculative_forced_acceptance);
}

namespace {

// The sink of the weights' format: FP8 weights on a device that computes with them, stored FP8 values in float32 on
// the CPU (exact), and a bf16 checkpoint's FP8 quantization emulated in float32 on the CPU.
std::unique_ptr<WeightSink> make_weight_sink(const EngineOptions& options, const ModelConfig& config,
                                             Backend& backend) {
  // 4-bit weights (INT4, FP4) stay packed on a GPU (its kernels unpack them in registers); the CPU computes with
  // their dequantized values in float32.
  if ((options.int4_weights || config.int4.enabled() || config.fp4.enabled()) && backend.device() != Device::kCpu) {
    return make_backend_sink(backend, {.int4 = true});
  }
  if (!options.fp8_weights) return make_backend_sink(backend);
  const std::string reason = backend.fp8_unsupported_reason();
  DI_CHECK_ARG(reason.empty(), "quantization fp8: ", reason);
  const Fp8ScaleFormat scales = config.fp8.scale_fmt == "ue8m0" ? Fp8ScaleFormat::kUe8m0 : Fp8ScaleFormat::kFloat;
  if (backend.device() == Device::kCpu) {
    return config.fp8.enabled ? make_backend_sink(backend) : make_fp8_emulating_host_sink(scales);
  }
  return make_backend_sink(backend, {.fp8 = true, .fp8_activations = options.fp8_activations, .scale_format = scales});
}

// INT4 weights, stored or rounded at load, before any weight is read: a group size that divides every layer's K, and
// nothing quantized twice.
void check_int4(const EngineOptions& options, const ModelConfig& config) {
  if (!options.int4_weights && !config.int4.enabled()) return;
  DI_CHECK_ARG(!options.fp8_weights, "quantization fp8 on a checkpoint of 4-bit weights: it is already quantized; ",
               "run it as stored");
  DI_CHECK_ARG(!options.int4_weights || !config.fp8.enabled, "quantization int4 on an FP8 checkpoint: it is already ",
               "quantized; run it as stored");
  if (options.int4_weights && !config.int4.enabled()) {
    check_int4_rounding(config, {.group_size = options.int4_group_size, .symmetric = options.int4_symmetric});
  }
}

// FP4 checkpoints (NVFP4, MXFP4), weight-only (16-bit activations): run as stored, nothing is requantized.
void check_fp4(const EngineOptions& options, const ModelConfig& config) {
  if (!config.fp4.enabled()) return;
  DI_CHECK_ARG(!options.fp8_weights && !options.int4_weights, "quantization ", options.fp8_weights ? "fp8" : "int4",
               " on a checkpoint of FP4 weights: it is already quantized; run it as stored");
}

}  // namespace

namespace {

// What every rank of a group must agree on, as "name=value" entries: the options that decide the shapes and the order
// of the collectives, and the model's dimensions (not its path: each machine mounts the model where it likes).
std::vector<std::string> group_terms(const EngineOptions& o, const ModelConfig& c) {
  const auto term = [](std::string_view name, const auto& value) { return str_cat(name, "=", value); };
  return {term("architecture", c.architecture), term("hidden_size", c.hidden_size),
          term("num_hidden_layers", c.num_hidden_layers), term("num_attention_heads", c.num_attention_heads),
          term("vocab_size", c.vocab_size), term("n_routed_experts", c.n_routed_experts),
          term("kv_lora_rank", c.kv_lora_rank), term("intermediate_size", c.intermediate_size),
          term("moe_intermediate_size", c.moe_intermediate_size), term("device", o.device),
          term("load_format", static_cast<int>(o.load_format)), term("seed", o.seed), term("page_size", o.page_size),
          term("tensor_parallel_size", o.tensor_parallel_size), term("enable_expert_parallel", o.enable_expert_parallel),
          term("enable_dp_attention", o.enable_dp_attention), term("max_num_seqs", o.max_num_seqs),
          term("max_num_batched_tokens", o.max_num_batched_tokens), term("enforce_eager", o.enforce_eager),
          term("fp8_weights", o.fp8_weights), term("fp8_activations", o.fp8_activations),
          term("int4_weights", o.int4_weights), term("int4_group_size", o.int4_group_size),
          term("int4_symmetric", o.int4_symmetric), term("kv_cache_dtype", static_cast<int>(o.kv_cache_dtype)),
          term("num_speculative_tokens", o.num_speculative_tokens)};
}

// Ranks that are processes each read their own options (one command a machine, mpirun's ranks): a machine started
// with another page size, split, quantization or model would run collectives of other shapes than the rest, which
// hangs or computes garbage. Rank 0 broadcasts its terms; a rank whose differ throws, naming each difference.
void check_same_terms(const EngineOptions& options, const ModelConfig& config, Communicator& comm) {
  const std::vector<std::string> mine = group_terms(options, config);
  std::string joined;
  for (const std::string& t : mine) joined += t + "\n";
  std::vector<int32_t> words((joined.size() + 3) / 4 + 1, 0);
  words[0] = static_cast<int32_t>(joined.size());
  std::memcpy(words.data() + 1, joined.data(), joined.size());
  comm.broadcast(words, 0);
  if (comm.rank() == 0) return;
  DI_CHECK(!words.empty() && words[0] >= 0 && static_cast<size_t>(words[0]) <= (words.size() - 1) * 4,
           "rank 0's configuration message is malformed");
  const std::string_view theirs(reinterpret_cast<const char*>(words.data() + 1), static_cast<size_t>(words[0]));
  std::string differences;
  size_t at = 0;
  for (const std::string& t : mine) {
    const size_t end = theirs.find('\n', at);
    const std::string_view other = theirs.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? theirs.size() : end + 1;
    if (other != t) differences += str_cat(differences.empty() ? "" : ", ", t, " (rank 0: ", other, ")");
  }
  DI_CHECK_ARG(differences.empty(), "rank ", comm.rank(), " was started with another configuration than rank 0: ",
               differences, "; start every machine with the same model and engine options");
}

}  // namespace

LoadedModel load_model(const EngineOptions& options, const LoadProgress& progress, Communicator* comm) {
  options.validate();
  ModelConfig config = load_model_config(options.model_path);
  // Threads of one process share their options; processes each have their own.
  if (comm != nullptr && options.rank_launch != RankLaunch::kInProcess) check_same_terms(options, config, *comm);
  const ModelParallel parallel{.shard = {.rank = comm ? comm->rank() : 0, .size = options.tensor_parallel_size,
                                         .expert_parallel = options.enable_expert_parallel,
                                         .dp_attention = options.enable_dp_attention},
                               .comm = comm};
  DI_CHECK_ARG(parallel.shard.whole() || (comm && comm->size() == parallel.shard.size), "tensor_parallel_size ",
               options.tensor_parallel_size, " needs a group of as many ranks");
  const ModelConfig local = local_config(config, parallel.shard);  // refuses a split the model does not divide into
  check_fp4(options, config);  // first: quantizing an FP4 checkpoint again is the error to name
  check_int4(options, config);
  std::unique_ptr<WeightSource> source = options.load_format == LoadFormat::kDummy
                                             ? make_dummy_source(options.seed)
                                             : open_checkpoint_source(options.model_path, config);
  // Rounded before the sharded source splits K across ranks, so a group covers the same inputs as on one rank.
  // Random weights for an FP4 checkpoint's config take its format, as a benchmark of it must.
  if (options.load_format == LoadFormat::kDummy && config.fp4.enabled()) {
    source = make_fp4_rounding_source(std::move(source), config.fp4, config.quantized_modules);
  }
  if (options.int4_weights && !config.int4.enabled()) {
    source = make_int4_rounding_source(std::move(source),
                                       {.group_size = options.int4_group_size, .symmetric = options.int4_symmetric});
  }
  const std::unique_ptr<WeightSource> shard_source = make_sharded_source(*source, parallel.shard);
  LoadedModel loaded{.backend = make_backend(options.device, local_device(options, parallel.shard.rank))};
  ModelParallel model_parallel = parallel;
  if (comm != nullptr) {
    loaded.device_comm = make_device_communicator(*loaded.backend, *comm, options.collective_timeout());
    if (loaded.device_comm) model_parallel.comm = loaded.device_comm.get();
  }
  // Each weight goes to the device as it is read: the host never holds the model.
  const std::unique_ptr<WeightSink> sink = make_weight_sink(options, config, *loaded.backend);
  ModelWeights weights = load_weights(local, *shard_source, *sink, progress, parallel.shard,
                                      /*with_mtp=*/options.num_speculative_tokens > 0);
  loaded.model = std::make_unique<DeepseekModel>(std::move(config), std::move(weights), *loaded.backend,
                                                 model_parallel);
  return loaded;
}

int local_device(const EngineOptions& options, int32_t rank) {
  // Ranks in one process take GPUs 0 .. n - 1; a process a rank takes the GPU of its rank on its machine.
  switch (options.rank_launch) {
    case RankLaunch::kInProcess: return rank;
    case RankLaunch::kAddress: return options.local_rank;
    case RankLaunch::kMpi: break;
  }
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return local_rank != nullptr ? std::atoi(local_rank) : rank;
}

std::unique_ptr<Communicator> make_process_communicator(const EngineOptions& options) {
  DI_CHECK_ARG(options.rank_launch != RankLaunch::kInProcess, "ranks in one process have no process communicator");
  const auto timeout = options.collective_timeout();
  std::unique_ptr<Communicator> comm =
      options.rank_launch == RankLaunch::kMpi
          ? make_mpi_communicator(timeout)
          : make_gloo_communicator(options.rank, options.tensor_parallel_size, options.dist_init_addr, timeout);
  DI_CHECK_ARG(comm->size() == options.tensor_parallel_size, comm->name(), ": ", comm->size(),
               " processes for tensor_parallel_size ", options.tensor_parallel_size, ": start one a rank");
  return comm;
}

LatentCacheShape engine_cache_shape(const EngineOptions& options, const ModelConfig& config) {
  // The MTP layer's latents are one more layer, in the same pages.
  return {.num_layers = config.num_hidden_layers + (options.num_speculative_tokens > 0 ? 1 : 0),
          .page_size = options.page_size,
          .latent_dim = config.latent_dim(),
          .kv_lora_rank = config.kv_lora_rank,
          .fp8 = options.kv_cache_dtype == KvCacheDtype::kFp8};
}

namespace {
// Decode graphs pad their batches with rows that read and write one page no request owns.
bool uses_graphs(const EngineOptions& options) { return options.device == "cuda" && !options.enforce_eager; }
}  // namespace

int64_t local_cache_pages(const EngineOptions& options, const LatentCacheShape& shape, DeepseekModel& model) {
  return latent_cache_pages({.num_cache_pages = options.num_cache_pages,
                             .cache_memory_bytes = options.cache_memory_bytes,
                             .gpu_memory_utilization = options.gpu_memory_utilization,
                             .max_num_batched_tokens = options.max_num_batched_tokens,
                             .max_num_seqs = options.max_num_seqs * (1 + options.num_speculative_tokens),
                             .graphs = uses_graphs(options)},
                            shape, model);
}

EngineCachePlan engine_cache_plan(const EngineOptions& options, LatentCacheShape shape, int64_t pages,
                                  int32_t max_model_len) {
  // Data-parallel steps run eagerly for now: a graph would need every rank's batch padded to one bucket.
  const bool graphs = uses_graphs(options) && !options.enable_dp_attention;
  const bool scratch = graphs || options.enable_dp_attention;  // the padding rows of graphs and of idle DP ranks
  shape.num_pages = static_cast<int32_t>(pages + (scratch ? 1 : 0));
  const int32_t scratch_page = scratch ? static_cast<int32_t>(pages) : -1;
  return {.shape = shape,
          .scratch_page = scratch_page,
          .runner = {.use_graphs = graphs,
                     // A verification step has a row per draft: k + 1 rows a sequence.
                     .max_graph_batch = options.max_num_seqs * (1 + options.num_speculative_tokens),
                     .max_graph_pages = (max_model_len + shape.page_size - 1) / shape.page_size,
                     .scratch_page = scratch_page,
                     .keep_hidden = options.num_speculative_tokens > 0}};
}

std::unique_ptr<Engine> Engine::create(const EngineOptions& options, const LoadProgress& progress) {
  options.validate();
  // A split the model does not divide into, or INT4 where it cannot run, is refused here, from config.json alone,
  // before any rank starts.
  const ModelConfig model_config = load_model_config(options.model_path);
  local_config(model_config, {.size = options.tensor_parallel_size, .expert_parallel = options.enable_expert_parallel,
                              .dp_attention = options.enable_dp_attention});
  check_fp4(options, model_config);
  check_int4(options, model_config);
  std::unique_ptr<Ranks> ranks;
  const auto timeout = options.collective_timeout();
  if (options.tensor_parallel_size > 1 && options.rank_launch != RankLaunch::kInProcess) {
    ranks = std::make_unique<Ranks>();
    ranks->comm = make_process_communicator(options);
    DI_CHECK_ARG(ranks->comm->rank() == 0, "rank ", ranks->comm->rank(), " runs run_worker_rank, not the engine");
  } else if (options.tensor_parallel_size > 1) {
    ranks = std::make_unique<Ranks>();
    ranks->group = std::make_unique<LocalGroup>(options.tensor_parallel_size, timeout);
    ranks->comm = ranks->group->communicator(0);
    ranks->workers = std::make_unique<WorkerRanks>(options, *ranks->group, *ranks->comm);  // they load meanwhile
  }
  Communicator* comm = ranks ? ranks->comm.get() : nullptr;
  LoadedModel loaded;
  try {
    loaded = load_model(options, progress, comm);
  } catch (...) {
    if (ranks) ranks->comm->abort("rank 0 failed to load");
    throw;
  }
  const ModelConfig& config = loaded.model->config();

  const LatentCacheShape shape = engine_cache_shape(options, config);
  const int64_t page_bytes = shape.bytes_per_page(loaded.backend->activation_dtype());
  // Every rank holds the whole latent cache (it is shared by all heads): the ranks take the fewest pages any holds.
  const auto decide_max_len = [&](int64_t pages) {
    DI_CHECK_ARG(pages >= 1 && pages < INT32_MAX, "the cache budget holds ", pages, " pages of ", page_bytes,
                 " bytes; raise it");
    const int64_t capacity_tokens = pages * options.page_size;
    int64_t max_len = options.max_model_len;
    if (max_len == 0) max_len = std::min<int64_t>(config.max_position_embeddings, capacity_tokens);
    DI_CHECK_ARG(max_len <= capacity_tokens, "max_model_len ", max_len, " exceeds what the latent cache holds (",
                 capacity_tokens, " tokens in ", pages, " pages of ", options.page_size,
                 "); raise the cache size or lower max_model_len");
    DI_CHECK_ARG(max_len >= 2, "max_model_len must be >= 2, got ", max_len);
    return static_cast<int32_t>(max_len);
  };
  const int64_t local_pages = local_cache_pages(options, shape, *loaded.model);
  const auto [pages, max_len] = comm ? WorkerRanks::agree_cache(*comm, local_pages, decide_max_len)
                                     : std::pair{local_pages, decide_max_len(local_pages)};
  SchedulerConfig sched{.max_num_seqs = options.max_num_seqs,
                        .max_num_batched_tokens = options.max_num_batched_tokens,
                        .max_model_len = max_len,
                        .num_lookahead_tokens = std::max(0, options.num_speculative_tokens - 1)};
  sched.validate();
  return std::unique_ptr<Engine>(new Engine(options, std::move(ranks), std::move(loaded),
                                            engine_cache_plan(options, shape, pages, max_len), sched));
}

std::vector<std::pair<std::string, int64_t>> Engine::weight_bytes() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [dtype, bytes] : weight_bytes_by_dtype(model_->weights())) {
    out.emplace_back(std::string(dtype_name(dtype)), bytes);
  }
  return out;
}

std::string Engine::cache_dtype() const {
  return std::string(dtype_name(cache_.shape().dtype(backend_->activation_dtype())));
}

int64_t Engine::cache_bytes_per_token() const {
  const LatentCacheShape& shape = cache_.shape();
  return shape.bytes_per_page(backend_->activation_dtype()) / shape.page_size;
}

Engine::Engine(EngineOptions options, std::unique_ptr<Ranks> ranks, LoadedModel loaded, const EngineCachePlan& plan,
               SchedulerConfig scheduler_config)
    : options_(std::move(options)),
      ranks_(std::move(ranks)),
      backend_(std::move(loaded.backend)),
      model_(std::move(loaded.model)),
      cache_(plan.shape, *backend_),
      scheduler_config_(scheduler_config),
      scratch_page_(plan.scratch_page),
      runner_(*model_, cache_, plan.runner),
      seed_rng_(options_.seed) {
  // The scratch page, when there is one, is the last: the cache managers hand out the pages before it.
  const int32_t pages = plan.scratch_page >= 0 ? plan.scratch_page : plan.shape.num_pages;
  const int32_t lanes = options_.enable_dp_attention ? options_.tensor_parallel_size : 1;
  for (int32_t r = 0; r < lanes; ++r) {
    lanes_.push_back(std::make_unique<Lane>(pages, plan.shape.page_size, options_.enable_prefix_caching,
                                            scheduler_config));
    lanes_.back()->scheduler.set_parallel_for(parallel_for_on_host_threads);
  }
  forced_acceptance_ = options_.speculative_forced_acceptance;
  if (options_.num_speculative_tokens > 0) {
    drafter_ = std::make_unique<MtpDrafter>(*model_, cache_, options_.num_speculative_tokens,
                                            ranks_ ? ranks_->comm.get() : nullptr, options_.enable_dp_attention,
                                            scratch_page_);
    stats_.spec_accepted_per_position.assign(static_cast<size_t>(options_.num_speculative_tokens), 0);
  }
  stats_.num_cache_pages = pages * lanes;
  stats_.num_free_cache_pages = pages * lanes;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (ranks_ && ranks_->workers) {
    ranks_->workers->stop();
    ranks_->workers.reset();  // joins them
  } else if (ranks_ && ranks_->comm) {
    broadcast_stop(*ranks_->comm);  // the processes of the other ranks
    ranks_->comm.reset();
  }
  output_cv_.notify_all();
}

Engine::PendingRequest Engine::checked_request(uint64_t id, std::vector<int32_t> prompt, SamplingParams params) {
  const ModelConfig& c = model_->config();
  DI_CHECK_ARG(!prompt.empty(), "request ", id, ": the prompt is empty");
  for (int32_t t : prompt) {
    DI_CHECK_ARG(t >= 0 && t < c.vocab_size, "request ", id, ": token id ", t, " is outside the vocabulary [0, ",
                 c.vocab_size, ")");
  }
  params.validate(static_cast<int32_t>(c.vocab_size));
  const auto len = static_cast<int64_t>(prompt.size());
  DI_CHECK_ARG(len < scheduler_config_.max_model_len, "request ", id, ": the prompt has ", len,
               " tokens; max_model_len is ", scheduler_config_.max_model_len,
               " (prompt + at least one generated token must fit)");
  std::unique_ptr<GrammarMatcher> grammar = params.grammar.empty() ? nullptr : compile_grammar(id, params.grammar);
  return {id, std::move(prompt), std::move(params), std::move(grammar)};
}

void Engine::add_request(uint64_t id, std::vector<int32_t> prompt, SamplingParams params) {
  std::vector<NewRequest> one;
  one.push_back({id, std::move(prompt), std::move(params)});
  add_requests(std::move(one));
}

void Engine::add_requests(std::vector<NewRequest> requests) {
  std::vector<PendingRequest> checked;
  checked.reserve(requests.size());
  for (NewRequest& r : requests) {
    checked.push_back(checked_request(r.id, std::move(r.prompt_token_ids), std::move(r.params)));
  }
  std::lock_guard lock(mutex_);
  DI_CHECK_ARG(!stopping_, "the engine is shut down");
  if (!broken_.empty()) throw Error(broken_);
  for (PendingRequest& p : checked) pending_.push_back(std::move(p));
  work_cv_.notify_one();
}

std::unique_ptr<GrammarMatcher> Engine::compile_grammar(uint64_t id, const GrammarSpec& spec) {
  DI_CHECK_ARG(!options_.grammar_library.empty(), "request ", id, ": structured outputs need the llguidance "
               "package (pip install llguidance), which this engine did not find");
  return grammar_compiler().compile(spec);
}

GrammarCompiler& Engine::grammar_compiler() {
  std::lock_guard lock(grammar_mutex_);
  if (!grammar_compiler_) {
    const ModelConfig& c = model_->config();
    grammar_compiler_ = make_llguidance_compiler(
        {.library_path = options_.grammar_library, .tokenizer_json = options_.tokenizer_json,
         .vocab_size = static_cast<int32_t>(c.vocab_size),
         .eos_token_id = c.eos_token_ids.empty() ? -1 : c.eos_token_ids.front()});
  }
  return *grammar_compiler_;  // made once, never replaced: the reference outlives the lock
}

void Engine::prepare_grammar() {
  DI_CHECK_ARG(!options_.grammar_library.empty(),
               "structured outputs need the llguidance package (pip install llguidance), which this engine did not find");
  grammar_compiler();
}

void Engine::set_speculative_forced_acceptance(double rate) {
  DI_CHECK_ARG(rate <= 1.0, "speculative_forced_acceptance must be in [0, 1] or negative (off), got ", rate);
  forced_acceptance_ = rate;
}

void Engine::abort(uint64_t id) {
  std::lock_guard lock(mutex_);
  pending_aborts_.push_back(id);
  work_cv_.notify_one();
}

std::vector<RequestOutputDelta> Engine::wait_outputs(double timeout_s) {
  std::unique_lock lock(mutex_);
  output_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return !outputs_.empty() || (stopping_ && !thread_.joinable()); });
  std::vector<RequestOutputDelta> out;
  out.swap(outputs_);
  return out;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s = stats_;
  s.num_waiting += static_cast<int32_t>(pending_.size());  // added, not yet seen by the step thread
  return s;
}

void Engine::emit(RequestOutputDelta delta) {
  std::lock_guard lock(mutex_);
  outputs_.push_back(std::move(delta));
}

void Engine::loop() {
  while (true) {
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] {
        return stopping_ || !pending_.empty() || !pending_aborts_.empty() || has_unfinished();
      });
      if (stopping_) break;
    }
    admit_pending();
    if (has_unfinished()) step_once();
    output_cv_.notify_all();
  }
  // Shutdown: everything still queued or running ends as aborted, and its pages return to the pool.
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& p : pending_) ids.push_back(p.id);
    pending_.clear();
    pending_aborts_.clear();
  }
  int32_t free_pages = 0;
  for (auto& lane : lanes_) {
    for (uint64_t id : lane->scheduler.unfinished_ids()) {
      lane->scheduler.abort(id);
      ids.push_back(id);
    }
    free_pages += lane->cache_manager.num_free_pages();
  }
  for (uint64_t id : ids) emit({.id = id, .finished = true, .finish_reason = FinishReason::kAbort});
  {
    std::lock_guard lock(mutex_);
    stats_.num_running = 0;
    stats_.num_waiting = 0;
    stats_.num_free_cache_pages = free_pages;
  }
  output_cv_.notify_all();
}

void Engine::admit_pending() {
  std::deque<PendingRequest> pending;
  std::vector<uint64_t> aborts;
  {
    std::lock_guard lock(mutex_);
    pending.swap(pending_);
    aborts.swap(pending_aborts_);
  }
  // Requests in the engine now, as each admission counts them for speculative_disable_by_batch_size.
  const int32_t limit = options_.speculative_disable_by_batch_size;
  int64_t in_engine = 0;
  for (const auto& lane : lanes_) in_engine += lane->scheduler.num_running() + lane->scheduler.num_waiting();
  for (auto& p : pending) {
    auto request = std::make_unique<Request>();
    ++in_engine;  // this request among them
    request->speculates = limit <= 0 || in_engine <= limit;
    if (!request->speculates) {
      std::lock_guard lock(mutex_);
      ++stats_.spec_num_requests_not_speculating;
    }
    request->id = p.id;
    request->prompt_token_ids = std::move(p.prompt);
    request->params = std::move(p.params);
    request->grammar = std::move(p.grammar);
    request->eos_token_ids = model_->config().eos_token_ids;
    request->seed = request->params.seed ? *request->params.seed : seed_rng_();
    Lane* lane = choose_lane(request->prompt_token_ids, request->prefix_root());
    try {
      lane->scheduler.add(std::move(request));
    } catch (const std::exception& e) {
      emit({.id = p.id, .finished = true, .finish_reason = FinishReason::kError, .error = e.what()});
    }
  }
  for (uint64_t id : aborts) {
    for (auto& lane : lanes_) {
      if (lane->scheduler.abort(id)) emit({.id = id, .finished = true, .finish_reason = FinishReason::kAbort});
    }
  }
  std::lock_guard lock(mutex_);
  update_lane_stats();
}

Engine::Lane* Engine::choose_lane(std::span<const int32_t> prompt, uint64_t prefix_root) {
  // Data-parallel ranks each hold their own cache: a new request goes where the most of its prompt is cached (a
  // shared system prompt, an earlier turn of its conversation), unless that rank has more than twice the requests
  // of the least loaded one (plus one); otherwise, and without a cached prefix, to the least loaded. One lane
  // without DP.
  const auto load = [](const Lane& x) { return x.scheduler.num_running() + x.scheduler.num_waiting(); };
  Lane* least = lanes_.front().get();
  for (auto& l : lanes_) {
    if (load(*l) < load(*least)) least = l.get();
  }
  if (lanes_.size() == 1 || !options_.enable_prefix_caching) return least;
  Lane* best = least;
  int32_t best_pages = least->cache_manager.num_cached_prefix_pages(prompt, prefix_root);
  for (auto& l : lanes_) {
    const int32_t pages = l->cache_manager.num_cached_prefix_pages(prompt, prefix_root);
    if (pages > best_pages && load(*l) <= 2 * load(*least) + 1) {
      best = l.get();
      best_pages = pages;
    }
  }
  return best;
}

void Engine::update_lane_stats() {
  stats_.num_preemptions = 0;
  stats_.prefix_cache_queries = 0;
  stats_.prefix_cache_hits = 0;
  stats_.num_running = 0;
  stats_.num_waiting = 0;
  stats_.num_free_cache_pages = 0;
  for (const auto& lane : lanes_) {
    stats_.num_preemptions += lane->scheduler.total_preemptions();
    stats_.prefix_cache_queries += lane->scheduler.prefix_cache_queries();
    stats_.prefix_cache_hits += lane->scheduler.prefix_cache_hits();
    stats_.num_running += lane->scheduler.num_running();
    stats_.num_waiting += lane->scheduler.num_waiting();
    stats_.num_free_cache_pages += lane->cache_manager.num_free_pages();
  }
}

bool Engine::has_unfinished() const {
  return std::any_of(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->scheduler.has_unfinished(); });
}

void Engine::fail_all(const std::string& message) {
  for (auto& lane : lanes_) {
    for (uint64_t id : lane->scheduler.unfinished_ids()) {
      if (lane->scheduler.abort(id)) {
        emit({.id = id, .finished = true, .finish_reason = FinishReason::kError, .error = message});
      }
    }
  }
  std::lock_guard lock(mutex_);
  broken_ = message;
  stats_.alive = false;
  stats_.failure = message;
  for (const auto& p : pending_) {
    outputs_.push_back({.id = p.id, .finished = true, .finish_reason = FinishReason::kError, .error = message});
  }
  pending_.clear();
}

bool Engine::ended_group(const std::exception& e, std::string_view what) {
  if (dynamic_cast<const CollectiveError*>(&e) != nullptr) {
    // A rank failed or stopped answering: the group cannot step again. Everything ends with the error.
    fail_all(str_cat("the engine stopped: ", e.what()));
    return true;
  }
  if (!ranks_) return false;
  // The other ranks may be inside collectives rank 0 will not reach now: the group cannot go on.
  ranks_->comm->abort(str_cat(what, " failed: ", e.what()));
  fail_all(str_cat("the engine stopped: ", what, " failed: ", e.what()));
  return true;
}

void Engine::fail_plan(Lane& lane, const SchedulePlan& plan, const std::string& message) {
  lane.scheduler.cancel(plan);
  for (const auto& chunk : plan.chunks) {
    const uint64_t id = chunk.request->id;
    if (lane.scheduler.abort(id)) {
      emit({.id = id, .finished = true, .finish_reason = FinishReason::kError, .error = message});
    }
  }
}

void Engine::step_once() {
  const auto started = std::chrono::steady_clock::now();
  const size_t n = lanes_.size();
  std::vector<SchedulePlan> plans(n);
  std::vector<bool> idle(n);
  bool any = false;
  for (size_t r = 0; r < n; ++r) {
    plans[r] = lanes_[r]->scheduler.schedule();
    idle[r] = plans[r].empty();
    any = any || !idle[r];
  }
  if (!any) {
    // Nothing fits this step (should not happen with validated requests); wait briefly for aborts or shutdown.
    std::unique_lock lock(mutex_);
    work_cv_.wait_for(lock, std::chrono::milliseconds(5));
    return;
  }
  std::vector<StepResult> results;
  std::vector<StepBatch> steps(n);
  bool pure_decode = true;
  try {
    const auto vocab = static_cast<int32_t>(model_->config().vocab_size);
    int32_t most_tokens = 0;
    for (size_t r = 0; r < n; ++r) {
      steps[r] = idle[r] ? idle_step() : build_step_batch(plans[r], options_.page_size, vocab);
      if (!idle[r]) pure_decode = pure_decode && steps[r].forward.is_pure_decode();
      most_tokens = std::max(most_tokens, steps[r].forward.num_tokens());
    }
    if (options_.enable_dp_attention) {
      for (StepBatch& step : steps) step.forward.dp_max_tokens = most_tokens;
    }
    results = execute_lanes(steps, idle);
  } catch (const std::exception& e) {
    if (ended_group(e, "rank 0's step")) return;
    for (size_t r = 0; r < n; ++r) {
      if (!idle[r]) fail_plan(*lanes_[r], plans[r], std::string("the step failed: ") + e.what());
    }
    return;
  }
  uint64_t prompt_tokens = 0, generated = 0;
  std::vector<std::vector<DraftChunk>> drafted(n);  // each lane's chunks, read before update() may destroy them
  for (size_t r = 0; r < n; ++r) {
    if (idle[r]) continue;
    prompt_tokens += num_prompt_tokens(plans[r]);  // before update() destroys the requests that finish
    if (drafter_) {
      for (size_t i = 0; i < plans[r].chunks.size(); ++i) {
        const ScheduledChunk& chunk = plans[r].chunks[i];
        drafted[r].push_back({.request_id = chunk.request->id, .start = chunk.start,
                              .first_row = steps[r].first_token_row[i], .samples = chunk.samples});
      }
    }
    emit_prompt_logprobs(plans[r], steps[r].scored, results[r].scored);
    generated += emit_updates(*lanes_[r], plans[r], steps[r], results[r].sampled);
  }
  if (drafter_) {
    std::vector<DraftLane> draft_lanes;
    for (size_t r = 0; r < n; ++r) draft_lanes.push_back({.chunks = drafted[r], .scheduler = &lanes_[r]->scheduler});
    try {
      drafter_->propose(draft_lanes, runner_.last_hidden());
    } catch (const std::exception& e) {
      if (ended_group(e, "rank 0's MTP drafter")) return;
      // The step's tokens are out; the requests go on without drafts, as without speculation.
      for (size_t r = 0; r < n; ++r) {
        for (const DraftChunk& c : drafted[r]) lanes_[r]->scheduler.set_drafts(c.request_id, {});
      }
      std::lock_guard lock(mutex_);
      stats_.spec_drafter_failure = std::string("the MTP drafter stopped: ") + e.what();
      drafter_.reset();
    }
  }
  record_step(std::chrono::steady_clock::now() - started, pure_decode, prompt_tokens, generated);
}

StepBatch Engine::idle_step() const {
  // One token of no request, written to the scratch page: the padding step of a data-parallel rank with nothing to
  // do, which still joins the MoE layers' collectives.
  ForwardBatchBuilder builder(options_.page_size, 1);
  const int32_t token[] = {0}, pages[] = {scratch_page_};
  builder.add(token, 0, pages, /*samples=*/true);
  return {.forward = std::move(builder).take(), .logits_row_of_sample = {}, .scored = {}};
}

std::vector<StepResult> Engine::execute_lanes(std::vector<StepBatch>& steps, const std::vector<bool>& idle) {
  std::vector<StepResult> results(steps.size());
  if (!options_.enable_dp_attention) {
    // One lane: the other ranks (TP) run its forward pass; rank 0 samples.
    if (ranks_) broadcast_step(*ranks_->comm, steps[0].forward);
    results[0] = runner_.execute(steps[0]);  // the step's one device-to-host copy
    return results;
  }
  // Data-parallel attention: every rank gets every lane's batch and runs its own; then each other rank sends its
  // sampled rows to rank 0 in turn. The grammars live here, with the schedulers: the other lanes' constrained rows
  // get their masks with the batch.
  const int64_t mask_words = allowed_token_words(model_->config().vocab_size);
  for (size_t r = 1; r < steps.size(); ++r) {
    SamplingBatch& sb = steps[r].forward.sampling;
    if (idle[r] || sb.grammars.empty()) continue;
    sb.given_masks.assign(sb.grammars.size() * static_cast<size_t>(mask_words), 0);
    fill_grammar_masks(sb.grammars, mask_words, reinterpret_cast<uint32_t*>(sb.given_masks.data()));
  }
  std::vector<int32_t> words = encode_lanes(steps, idle);
  broadcast_step_words(*ranks_->comm, words);
  if (idle[0]) {
    runner_.execute_forward(steps[0].forward);
  } else {
    results[0] = runner_.execute(steps[0]);
  }
  const std::vector<std::vector<int32_t>> rows = send_lanes_to_rank0(*ranks_->comm, {});
  for (size_t r = 1; r < steps.size(); ++r) {
    if (!idle[r]) results[r] = collect_step_result(steps[r], decode_sampled_rows(rows[r]));
  }
  return results;
}

uint64_t Engine::num_prompt_tokens(const SchedulePlan& plan) {
  uint64_t tokens = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const int32_t prompt_end = std::min(chunk.start + chunk.num_tokens, chunk.request->num_prompt_tokens());
    if (chunk.start < prompt_end) tokens += static_cast<uint64_t>(prompt_end - chunk.start);
  }
  return tokens;
}

void Engine::emit_prompt_logprobs(const SchedulePlan& plan, std::span<const ScoredRows> scored,
                                  std::span<const std::vector<SampledToken>> tokens) {
  for (size_t k = 0; k < scored.size(); ++k) {
    Request& r = *plan.chunks[scored[k].chunk].request;  // valid until update(); nothing aborts within a step
    r.num_scored_positions = scored[k].first_position + scored[k].count;
    RequestOutputDelta delta{.id = r.id, .num_preemptions = r.num_preemptions};
    for (const SampledToken& t : tokens[k]) delta.prompt_logprobs.push_back(SampleResult::from(t));
    emit(std::move(delta));
  }
}

int32_t Engine::accepted_drafts(const ScheduledChunk& chunk, std::span<const SampledToken> rows) {
  const std::vector<int32_t>& drafts = chunk.request->draft_token_ids;
  int32_t accepted = 0;
  const double forced = forced_acceptance_.load(std::memory_order_relaxed);
  while (accepted < chunk.num_draft_tokens) {
    const bool accepts =
        forced >= 0.0 ? static_cast<double>(counter_rng::uniform01(
                              options_.seed, static_cast<int32_t>(forced_acceptance_draws_++ & 0x7fffffff), 0)) < forced
                      : rows[static_cast<size_t>(accepted)].token == drafts[static_cast<size_t>(accepted)];
    if (!accepts) break;
    ++accepted;
  }
  return accepted;
}

uint64_t Engine::emit_updates(Lane& lane, const SchedulePlan& plan, const StepBatch& step,
                              std::span<const SampledToken> sampled) {
  // Each sampling chunk's rows: its real token's, then one after each draft. The chunk keeps the rows of the drafts
  // it accepts and the one after them (its correction, or the token after its last draft).
  std::vector<int32_t> tokens, counts;
  std::vector<SampledToken> kept;
  size_t row = 0, sample = 0;
  std::lock_guard lock(mutex_);  // the speculative decoding stats
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.samples) continue;
    const auto rows = sampled.subspan(row, static_cast<size_t>(step.num_rows_of_sample(sample++)));
    row += rows.size();
    const int32_t accepted = chunk.num_draft_tokens > 0 ? accepted_drafts(chunk, rows) : 0;
    for (int32_t j = 0; j <= accepted; ++j) {
      SampledToken t = rows[static_cast<size_t>(j)];
      if (j < accepted) t.token = chunk.request->draft_token_ids[static_cast<size_t>(j)];  // forced acceptance
      tokens.push_back(t.token);
      kept.push_back(t);
    }
    counts.push_back(accepted + 1);
    if (chunk.num_draft_tokens > 0) {
      stats_.spec_num_drafts += 1;
      stats_.spec_num_draft_tokens += static_cast<uint64_t>(chunk.num_draft_tokens);
      stats_.spec_num_accepted_tokens += static_cast<uint64_t>(accepted);
      for (int32_t j = 0; j < accepted; ++j) stats_.spec_accepted_per_position[static_cast<size_t>(j)] += 1;
    }
  }
  uint64_t generated = 0;
  std::vector<RequestOutputDelta> deltas;
  for (RequestUpdate& u : lane.scheduler.update(plan, tokens, counts)) {
    RequestOutputDelta delta{.id = u.id, .finished = u.finished, .finish_reason = u.reason,
                             .error = std::move(u.error), .num_preemptions = u.num_preemptions,
                             .num_cached_tokens = u.num_cached_tokens};
    for (size_t i = 0; i < u.new_tokens.size(); ++i) {
      delta.new_token_ids.push_back(u.new_tokens[i]);
      if (u.logprobs >= 0) delta.logprobs.push_back(SampleResult::from(kept[static_cast<size_t>(u.sampled_index) + i]));
    }
    generated += u.new_tokens.size();
    outputs_.push_back(std::move(delta));
  }
  return generated;
}


void Engine::record_step(std::chrono::steady_clock::duration elapsed, bool pure_decode, uint64_t prompt_tokens,
                         uint64_t generated_tokens) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  std::lock_guard lock(mutex_);
  stats_.num_steps += 1;
  stats_.step_seconds += seconds;
  if (pure_decode) {
    stats_.num_decode_steps += 1;
    stats_.decode_step_seconds += seconds;
  }
  stats_.num_prompt_tokens_computed += prompt_tokens;
  stats_.num_generated_tokens += generated_tokens;
  stats_.num_graph_replays = static_cast<uint64_t>(runner_.num_graph_replays());
  stats_.num_grammar_masks = static_cast<uint64_t>(runner_.num_grammar_masks());
  stats_.grammar_mask_seconds = runner_.grammar_mask_seconds();
  stats_.num_graphs = runner_.num_graphs();
  update_lane_stats();
}

}  // namespace deepinfer
