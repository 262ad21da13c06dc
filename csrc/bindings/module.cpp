// The _deepinfer extension: converts types and forwards calls; no logic lives here.
#include <cstdlib>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/worker_ranks.h"
#include "parallel/mpi_communicator.h"
#include "parallel/tcp_store.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/runtime/device_info.h"
#endif
#include "engine/sequence_scorer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace deepinfer {
namespace {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return nullptr;
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return nullptr;
}

// Progress callbacks come from the loading thread, which holds no GIL while the model loads.
LoadProgress python_progress(nb::object callback) {
  if (callback.is_none()) return {};
  return [callback](int64_t done, int64_t total) {
    nb::gil_scoped_acquire gil;
    callback(done, total);
  };
}

int visible_cuda_devices() {
#ifdef DEEPINFER_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

// (free, total) bytes of CUDA device `index` now: what the engine checks a deployment against before loading.
std::pair<int64_t, int64_t> cuda_device_memory(int index) {
  const int visible = visible_cuda_devices();
  DI_CHECK_ARG(index >= 0 && index < visible, "CUDA device ", index, " is not visible (", visible,
               " visible; a build without the CUDA backend sees none)");
#ifdef DEEPINFER_HAVE_CUDA
  const cuda::DeviceMemory mem = cuda::device_memory(index);
  return {mem.free_bytes, mem.total_bytes};
#else
  return {0, 0};  // not reached: no device is visible
#endif
}

}  // namespace
}  // namespace deepinfer

NB_MODULE(_deepinfer, m) {
  using namespace deepinfer;
  m.doc() = "DeepInfer core: the C++ engine for DeepSeek V2/V3 models.";
  // Objects alive at interpreter exit (an engine the user never shut down) are reclaimed by the OS.
  nb::set_leak_warnings(false);

  // Translators run newest first: the specific InvalidArgument (a ValueError) must be registered after Error.
  nb::exception<Error>(m, "EngineError", PyExc_RuntimeError);
  nb::exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);

  nb::enum_<LoadFormat>(m, "LoadFormat")
      .value("safetensors", LoadFormat::kSafetensors)
      .value("dummy", LoadFormat::kDummy);
  nb::enum_<KvCacheDtype>(m, "KvCacheDtype")
      .value("auto", KvCacheDtype::kAuto)
      .value("fp8", KvCacheDtype::kFp8);
  nb::enum_<RankLaunch>(m, "RankLaunch")
      .value("in_process", RankLaunch::kInProcess)
      .value("mpi", RankLaunch::kMpi)
      .value("address", RankLaunch::kAddress);

  nb::enum_<GrammarKind>(m, "GrammarKind")
      .value("none", GrammarKind::kNone)
      .value("json_schema", GrammarKind::kJsonSchema)
      .value("regex", GrammarKind::kRegex)
      .value("lark", GrammarKind::kLark);
  nb::class_<GrammarSpec>(m, "GrammarSpec", "Structured outputs: the grammar a request's output follows.")
      .def(nb::init<>())
      .def_rw("kind", &GrammarSpec::kind)
      .def_rw("text", &GrammarSpec::text);

  nb::class_<SamplingParams>(m, "SamplingParams", "Per-request sampling and stopping parameters.")
      .def(nb::init<>())
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_rw("prompt_logprobs", &SamplingParams::prompt_logprobs)
      .def_rw("grammar", &SamplingParams::grammar)
      .def("validate", &SamplingParams::validate, "vocab_size"_a, "Raises ValueError naming the bad field.");

  nb::class_<EngineOptions>(m, "EngineOptions")
      .def(nb::init<>())
      .def_rw("model_path", &EngineOptions::model_path)
      .def_rw("load_format", &EngineOptions::load_format)
      .def_rw("device", &EngineOptions::device)
      .def_rw("seed", &EngineOptions::seed)
      .def_rw("page_size", &EngineOptions::page_size)
      .def_rw("cache_memory_bytes", &EngineOptions::cache_memory_bytes)
      .def_rw("gpu_memory_utilization", &EngineOptions::gpu_memory_utilization)
      .def_rw("num_cache_pages", &EngineOptions::num_cache_pages)
      .def_rw("max_model_len", &EngineOptions::max_model_len)
      .def_rw("max_num_seqs", &EngineOptions::max_num_seqs)
      .def_rw("max_num_batched_tokens", &EngineOptions::max_num_batched_tokens)
      .def_rw("enforce_eager", &EngineOptions::enforce_eager)
      .def_rw("fp8_weights", &EngineOptions::fp8_weights)
      .def_rw("fp8_activations", &EngineOptions::fp8_activations)
      .def_rw("int4_weights", &EngineOptions::int4_weights)
      .def_rw("int4_group_size", &EngineOptions::int4_group_size)
      .def_rw("int4_symmetric", &EngineOptions::int4_symmetric)
      .def_rw("kv_cache_dtype", &EngineOptions::kv_cache_dtype)
      .def_rw("enable_prefix_caching", &EngineOptions::enable_prefix_caching)
      .def_rw("tensor_parallel_size", &EngineOptions::tensor_parallel_size)
      .def_rw("enable_expert_parallel", &EngineOptions::enable_expert_parallel)
      .def_rw("enable_dp_attention", &EngineOptions::enable_dp_attention)
      .def_rw("collective_timeout_s", &EngineOptions::collective_timeout_s)
      .def_rw("num_speculative_tokens", &EngineOptions::num_speculative_tokens)
      .def_rw("speculative_disable_by_batch_size", &EngineOptions::speculative_disable_by_batch_size)
      .def_rw("speculative_forced_acceptance", &EngineOptions::speculative_forced_acceptance)
      .def_rw("rank_launch", &EngineOptions::rank_launch)
      .def_rw("dist_init_addr", &EngineOptions::dist_init_addr)
      .def_rw("rank", &EngineOptions::rank)
      .def_rw("local_rank", &EngineOptions::local_rank)
      .def_rw("grammar_library", &EngineOptions::grammar_library)
      .def_rw("tokenizer_json", &EngineOptions::tokenizer_json)
      .def("validate", &EngineOptions::validate);
  m.def("process_communicators", [] {
    std::vector<std::string> built;
#ifdef DEEPINFER_HAVE_MPI
    built.emplace_back("mpi");
#endif
#ifdef DEEPINFER_HAVE_GLOO
    built.emplace_back("gloo");
#endif
    return built;
  }, "The communicators this build has for ranks that are processes: 'mpi' (mpirun), 'gloo' (an address).");
  m.def("cancel_bootstrap_waits", &cancel_bootstrap_waits, "reason"_a,
        "Ends this process's waits for the other ranks to meet (a local rank's process died first) with the reason.");
  m.def("clear_bootstrap_cancel", &clear_bootstrap_cancel, "Lets the next launch's ranks wait for each other again.");
  m.def("mpi_launched", &mpi_launched, "Whether mpirun started this process (its rank variables are set).");
  m.def("mpi_rank", [] {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    return rank != nullptr ? std::atoi(rank) : 0;
  }, "This process's rank under mpirun (0 otherwise).");
  // A worker rank's process (mpirun's, or one meeting the others at an address): runs rank 0's steps until rank 0
  // stops, then returns. A failure aborts the group (under MPI the whole job ends; at an address the others'
  // collectives fail), after printing why with the rank.
  m.def("run_worker_rank", [](const EngineOptions& options) {
    const std::unique_ptr<Communicator> comm = make_process_communicator(options);
    try {
      run_worker_rank(options, *comm);
    } catch (const std::exception& e) {
      comm->abort(e.what());
      throw;
    }
  }, "options"_a, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<ModelConfig>(m, "ModelConfig", "The parsed config.json (read-only summary).")
      .def_ro("architecture", &ModelConfig::architecture)
      .def_ro("vocab_size", &ModelConfig::vocab_size)
      .def_ro("hidden_size", &ModelConfig::hidden_size)
      .def_ro("num_hidden_layers", &ModelConfig::num_hidden_layers)
      .def_ro("num_attention_heads", &ModelConfig::num_attention_heads)
      .def_ro("intermediate_size", &ModelConfig::intermediate_size)
      .def_ro("moe_intermediate_size", &ModelConfig::moe_intermediate_size)
      .def_ro("q_lora_rank", &ModelConfig::q_lora_rank)
      .def_ro("kv_lora_rank", &ModelConfig::kv_lora_rank)
      .def_ro("qk_nope_head_dim", &ModelConfig::qk_nope_head_dim)
      .def_ro("qk_rope_head_dim", &ModelConfig::qk_rope_head_dim)
      .def_ro("v_head_dim", &ModelConfig::v_head_dim)
      .def_ro("n_routed_experts", &ModelConfig::n_routed_experts)
      .def_ro("n_shared_experts", &ModelConfig::n_shared_experts)
      .def_ro("num_experts_per_tok", &ModelConfig::num_experts_per_tok)
      .def_ro("first_k_dense_replace", &ModelConfig::first_k_dense_replace)
      .def_ro("moe_layer_freq", &ModelConfig::moe_layer_freq)
      .def_ro("tie_word_embeddings", &ModelConfig::tie_word_embeddings)
      .def_prop_ro("version", [](const ModelConfig& c) { return c.version == ModelVersion::kV3 ? 3 : 2; })
      .def_ro("max_position_embeddings", &ModelConfig::max_position_embeddings)
      .def_ro("num_nextn_predict_layers", &ModelConfig::num_nextn_predict_layers)
      .def_ro("eos_token_ids", &ModelConfig::eos_token_ids)
      .def_ro("bos_token_id", &ModelConfig::bos_token_id)
      .def_prop_ro("latent_dim", &ModelConfig::latent_dim)
      .def_prop_ro("fp8", [](const ModelConfig& c) { return c.fp8.enabled; })
      .def_prop_ro("fp8_activations", [](const ModelConfig& c) { return c.fp8.activations; },
                   "Whether the FP8 checkpoint quantizes activations too (W8A8); false: weight-only FP8.")
      .def_prop_ro("int4_format",
                   [](const ModelConfig& c) -> std::string {
                     switch (c.int4.format) {
                       case Int4Format::kNone: return "";
                       case Int4Format::kCompressedTensors: return "compressed-tensors";
                       case Int4Format::kAwq: return "awq";
                     }
                     return "";
                   },
                   "The checkpoint's 4-bit weight format: '', 'compressed-tensors' or 'awq'.")
      .def_prop_ro("int4_group_size", [](const ModelConfig& c) { return c.int4.group_size; })
      .def_prop_ro("int4_symmetric", [](const ModelConfig& c) { return c.int4.symmetric; })
      .def_prop_ro("fp4_format",
                   [](const ModelConfig& c) -> std::string {
                     switch (c.fp4.format) {
                       case Fp4Format::kNone: return "";
                       case Fp4Format::kNvfp4CompressedTensors: return "nvfp4";
                       case Fp4Format::kMxfp4CompressedTensors: return "mxfp4";
                       case Fp4Format::kNvfp4ModelOpt: return "modelopt-nvfp4";
                     }
                     return "";
                   },
                   "The checkpoint's FP4 weight format: '', 'nvfp4' / 'mxfp4' (compressed-tensors) or "
                   "'modelopt-nvfp4'.")
      .def(
          "quantizes",
          [](const ModelConfig& c, const std::string& module) { return c.quantized_modules.quantizes(module); },
          "module"_a,
          "Whether the quantized checkpoint's config lists the linear module (e.g. "
          "'model.layers.3.self_attn.q_b_proj') as quantized: its targets, less its ignore / "
          "modules_to_not_convert / exclude_modules list. True for every module of an unquantized config.");
  m.def("cuda_device_count", &visible_cuda_devices,
        "CUDA devices this build can use: 0 without the CUDA backend or without a GPU.");
  m.def("cuda_device_memory", &cuda_device_memory, "index"_a,
        "(free, total) bytes of CUDA device `index` now; ValueError when it is not visible.");
  m.def("load_model_config", [](const std::string& path) { return load_model_config(path); }, "model_dir"_a);
  m.def(
      "latent_fp8_row_bytes",
      [](int64_t kv_lora_rank, int64_t rope_dim) {
        return LatentFp8Layout{.rank = kv_lora_rank, .rope_dim = rope_dim}.row_bytes();
      },
      "kv_lora_rank"_a, "rope_dim"_a, "Bytes of one token's row of one layer in the FP8 latent cache (latent_fp8.h).");
  m.def(
      "parse_model_config", [](const std::string& text) { return parse_model_config(nlohmann::json::parse(text)); },
      "config_json"_a, "A config.json's text parsed as the engine parses it (ValueError naming a bad field).");

  nb::class_<TokenLogprob>(m, "TokenLogprob")
      .def_ro("token", &TokenLogprob::token)
      .def_ro("logprob", &TokenLogprob::logprob);
  nb::class_<SampleResult>(m, "SampleResult")
      .def_ro("token", &SampleResult::token)
      .def_ro("logprob", &SampleResult::logprob)
      .def_ro("top_logprobs", &SampleResult::top_logprobs);

  nb::class_<RequestOutputDelta>(m, "RequestOutputDelta", "New tokens of one request since the last delta.")
      .def_ro("request_id", &RequestOutputDelta::id)
      .def_ro("new_token_ids", &RequestOutputDelta::new_token_ids)
      .def_ro("logprobs", &RequestOutputDelta::logprobs)
      .def_ro("prompt_logprobs", &RequestOutputDelta::prompt_logprobs)
      .def_ro("finished", &RequestOutputDelta::finished)
      .def_prop_ro("finish_reason", [](const RequestOutputDelta& d) -> std::optional<std::string> {
        const char* name = finish_reason_name(d.finish_reason);
        return name ? std::optional<std::string>(name) : std::nullopt;
      })
      .def_ro("error", &RequestOutputDelta::error)
      .def_ro("num_preemptions", &RequestOutputDelta::num_preemptions)
      .def_ro("num_cached_tokens", &RequestOutputDelta::num_cached_tokens);

  nb::class_<EngineStats>(m, "EngineStats")
      .def_ro("num_running", &EngineStats::num_running)
      .def_ro("num_waiting", &EngineStats::num_waiting)
      .def_ro("num_cache_pages", &EngineStats::num_cache_pages)
      .def_ro("num_free_cache_pages", &EngineStats::num_free_cache_pages)
      .def_ro("num_preemptions", &EngineStats::num_preemptions)
      .def_ro("num_steps", &EngineStats::num_steps)
      .def_ro("num_prompt_tokens_computed", &EngineStats::num_prompt_tokens_computed)
      .def_ro("num_generated_tokens", &EngineStats::num_generated_tokens)
      .def_ro("prefix_cache_queries", &EngineStats::prefix_cache_queries)
      .def_ro("prefix_cache_hits", &EngineStats::prefix_cache_hits)
      .def_ro("step_seconds", &EngineStats::step_seconds)
      .def_ro("num_decode_steps", &EngineStats::num_decode_steps)
      .def_ro("decode_step_seconds", &EngineStats::decode_step_seconds)
      .def_ro("num_graph_replays", &EngineStats::num_graph_replays)
      .def_ro("num_grammar_masks", &EngineStats::num_grammar_masks)
      .def_ro("grammar_mask_seconds", &EngineStats::grammar_mask_seconds)
      .def_ro("spec_num_drafts", &EngineStats::spec_num_drafts)
      .def_ro("spec_num_draft_tokens", &EngineStats::spec_num_draft_tokens)
      .def_ro("spec_num_requests_not_speculating", &EngineStats::spec_num_requests_not_speculating)
      .def_ro("spec_num_accepted_tokens", &EngineStats::spec_num_accepted_tokens)
      .def_ro("spec_accepted_per_position", &EngineStats::spec_accepted_per_position)
      .def_ro("spec_drafter_failure", &EngineStats::spec_drafter_failure)
      .def_ro("num_graphs", &EngineStats::num_graphs)
      .def_ro("alive", &EngineStats::alive)
      .def_ro("failure", &EngineStats::failure);

  nb::class_<Engine>(m, "Engine", "The engine; its step loop runs in a C++ thread.")
      .def_static(
          "create",
          [](const EngineOptions& options, nb::object progress) {
            LoadProgress callback = python_progress(std::move(progress));
            nb::gil_scoped_release release;
            return Engine::create(options, callback);
          },
          "options"_a, "progress"_a = nb::none(), "Loads the model and starts the step thread.")
      .def_prop_ro("model_config", &Engine::model_config, nb::rv_policy::reference_internal)
      .def_prop_ro("max_model_len", &Engine::max_model_len)
      .def_prop_ro("weight_bytes", &Engine::weight_bytes)
      .def_prop_ro("cache_dtype", &Engine::cache_dtype)
      .def_prop_ro("cache_bytes_per_token", &Engine::cache_bytes_per_token)
      .def("add_request", &Engine::add_request, "request_id"_a, "prompt_token_ids"_a, "params"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "Queues a request (compiling its grammar, if any, without the GIL); raises ValueError when it cannot be "
           "served.")
      .def(
          "add_requests",
          [](Engine& engine, std::vector<std::tuple<uint64_t, std::vector<int32_t>, SamplingParams>> batch) {
            std::vector<Engine::NewRequest> requests;
            requests.reserve(batch.size());
            for (auto& [id, prompt, params] : batch) requests.push_back({id, std::move(prompt), std::move(params)});
            nb::gil_scoped_release release;
            engine.add_requests(std::move(requests));
          },
          "requests"_a,
          "Queues (request_id, prompt_token_ids, params) tuples together: all are checked before any is queued, and "
          "the step thread admits them in one step.")
      .def("prepare_grammar", &Engine::prepare_grammar, nb::call_guard<nb::gil_scoped_release>(),
           "Opens the structured-outputs grammar engine now (a second for a large vocabulary).")
      .def("abort", &Engine::abort, "request_id"_a)
      .def("set_speculative_forced_acceptance", &Engine::set_speculative_forced_acceptance, "rate"_a,
           "benchmarks only: accept each draft with this probability instead of by verification (< 0: off)")
      .def("wait_outputs", &Engine::wait_outputs, "timeout_s"_a, nb::call_guard<nb::gil_scoped_release>(),
           "Blocks (without the GIL) until outputs arrive or the timeout passes.")
      .def("stats", &Engine::stats)
      .def("shutdown", &Engine::shutdown, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<SequenceScorer>(m, "SequenceScorer", "Last-position logits of one sequence (for parity tests).")
      .def(nb::init<const EngineOptions&>(), "options"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("model_config", &SequenceScorer::model_config, nb::rv_policy::reference_internal)
      .def(
          "last_logits",
          [](SequenceScorer& s, const std::vector<int32_t>& tokens, int32_t prefill_chunk, int32_t decode_tail) {
            std::vector<float> logits;
            {
              nb::gil_scoped_release release;
              logits = s.last_logits(tokens, prefill_chunk, decode_tail);
            }
            auto* data = new std::vector<float>(std::move(logits));  // owned by the capsule below
            nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(data->data(), {data->size()}, owner);
          },
          "tokens"_a, "prefill_chunk"_a = 0, "decode_tail"_a = 0);
}
