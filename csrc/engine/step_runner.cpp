#include "engine/step_runner.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "engine/host_parallel.h"

namespace deepinfer {

std::vector<int32_t> graph_batch_buckets(int32_t max_batch) {
  // Fine steps where a padded row costs the most (small batches), coarser ones above.
  std::vector<int32_t> buckets;
  for (int32_t b = 1; b <= max_batch;) {
    buckets.push_back(b);
    b = b < 8 ? b * 2 : b < 64 ? b + 8 : b < 128 ? b + 16 : b + 32;
  }
  if (buckets.empty() || buckets.back() != max_batch) buckets.push_back(max_batch);
  return buckets;
}

ForwardBatch pad_decode_batch(const ForwardBatch& batch, std::span<const int32_t> buckets, int32_t max_pages,
                              int32_t scratch_page, int32_t page_size) {
  const int32_t seqs = batch.num_seqs();
  DI_CHECK(batch.is_pure_decode(), "pad_decode_batch: not a pure decode batch (", seqs, " sequences, ",
           batch.num_decode_seqs, " decoding, ", batch.num_tokens(), " tokens)");
  const auto bucket = std::lower_bound(buckets.begin(), buckets.end(), seqs);
  DI_CHECK(bucket != buckets.end(), "pad_decode_batch: ", seqs, " sequences exceed the largest bucket");
  const int32_t padded = *bucket;
  const int32_t longest = batch.max_context_len(0, seqs);
  const auto needed = static_cast<uint32_t>((longest + page_size - 1) / page_size);
  const int32_t width = std::min(static_cast<int32_t>(std::bit_ceil(std::max(needed, 8u))), max_pages);
  DI_CHECK(static_cast<int32_t>(needed) <= width, "pad_decode_batch: a context of ", longest, " tokens needs ", needed,
           " pages; graphs hold ", max_pages);

  // The real rows again, in a table of the new width, then the padding rows: one token each at position 0 of the
  // scratch page, whose logits rows follow the real ones.
  ForwardBatchBuilder builder(page_size, width);
  const std::span<const int32_t> table(batch.page_table);
  auto next_logits = batch.logits_indices.begin();
  for (int32_t s = 0; s < seqs; ++s) {
    const auto i = static_cast<size_t>(s);
    DI_CHECK(batch.context_lens[i] == batch.positions[i] + 1, "pad_decode_batch: sequence ", s, " decodes position ",
             batch.positions[i], " with a context of ", batch.context_lens[i]);
    const bool samples = next_logits != batch.logits_indices.end() && *next_logits == s;
    if (samples) ++next_logits;
    builder.add(std::span(batch.token_ids).subspan(i, 1), batch.positions[i],
                table.subspan(i * static_cast<size_t>(batch.max_pages_per_seq),
                              static_cast<size_t>(std::min(width, batch.max_pages_per_seq))),
                samples);
  }
  DI_CHECK(next_logits == batch.logits_indices.end(), "pad_decode_batch: logits rows out of sequence order");
  const int32_t padding_token[] = {0}, padding_pages[] = {scratch_page};
  for (int32_t s = seqs; s < padded; ++s) builder.add(padding_token, 0, padding_pages, /*samples=*/true);
  ForwardBatch out = std::move(builder).take();
  out.sampling = batch.sampling;
  out.decode_context_bound = width * page_size;
  out.dp_max_tokens = batch.dp_max_tokens;
  return out;
}

Tensor run_forward(DeepseekModel& model, const LatentCache& cache, const ForwardBatch& batch) {
  const LatentCacheShape& shape = cache.shape();
  batch.validate(static_cast<int32_t>(model.config().vocab_size), shape.num_pages, shape.page_size);
  std::vector<int32_t> packed;
  const StepLayout layout = pack_step(batch, packed);
  Tensor host = Tensor::empty({layout.total()}, DType::kI32);
  std::copy(packed.begin(), packed.end(), host.view().as<int32_t>());
  Backend& backend = model.backend();
  const Tensor device = backend.upload(std::move(host), DType::kI32);  // the CPU hands the host tensor back
  Tensor logits = model.run(bind_step(device.cview(), layout, batch).model, cache.layers());
  if (logits.device() == Device::kCpu) return logits;
  Tensor host_logits = Tensor::empty(logits.shape(), DType::kF32);
  backend.copy_to_host(logits.cview(), host_logits.view());  // waits for the step
  return host_logits;
}

StepRunner::StepRunner(DeepseekModel& model, const LatentCache& cache, StepRunnerOptions options)
    : model_(model), backend_(model.backend()), cache_(cache), options_(options) {
  if (options_.use_graphs) {
    DI_CHECK(options_.scratch_page >= 0 && options_.scratch_page < cache.shape().num_pages &&
                 options_.max_graph_pages > 0 && options_.max_graph_batch > 0,
             "step runner: graphs need a scratch page inside the cache (", options_.scratch_page, " of ",
             cache.shape().num_pages, "), a page-table width (", options_.max_graph_pages, ") and a batch (",
             options_.max_graph_batch, ")");
    buckets_ = graph_batch_buckets(options_.max_graph_batch);
    // The arrays of the largest graph's steps: 4 index arrays per token, query starts, context lengths, the page
    // table, a sampling row per token, room for penalty and mask lists, and each array's alignment padding.
    const int64_t b = buckets_.back();
    graph_inputs_ = backend_.empty({b * (6 + kSamplingRowWords) + b * options_.max_graph_pages + (int64_t{1} << 16)},
                                   DType::kI32);
    graph_logits_ = backend_.empty({b, model.config().vocab_size}, DType::kF32);
    if (options_.keep_hidden) graph_hidden_ = backend_.empty({b, model.config().hidden_size}, backend_.activation_dtype());
  }
}

TensorView StepRunner::hidden_rows(int64_t tokens, bool graph) {
  if (!options_.keep_hidden) return {};
  const int64_t d = model_.config().hidden_size;
  if (graph) return graph_hidden_.view().rows(0, tokens);
  if (eager_hidden_.numel() < tokens * d) {
    eager_hidden_ = backend_.empty({std::max<int64_t>(tokens, 2 * eager_hidden_.numel() / d), d},
                                   backend_.activation_dtype());
  }
  return eager_hidden_.view().rows(0, tokens);
}

StepRunner::~StepRunner() = default;

bool StepRunner::graph_eligible(const ForwardBatch& batch) const {
  const int32_t seqs = batch.num_seqs();
  return options_.use_graphs && batch.is_pure_decode() && seqs <= options_.max_graph_batch &&
         static_cast<int32_t>(batch.logits_indices.size()) == seqs;
}

void StepRunner::upload(const std::vector<int32_t>& packed, TensorView dst) {
  const auto n = static_cast<int64_t>(packed.size());
  DI_CHECK(dst.numel() >= n, "step runner: ", n, " packed elements for a buffer of ", dst.numel());
  if (staging_.numel() < n) staging_ = backend_.staging({std::max<int64_t>(n, 2 * staging_.numel())}, DType::kI32);
  std::copy(packed.begin(), packed.end(), staging_.view().as<int32_t>());
  backend_.copy_to_device(staging_.cview().rows(0, n), dst.rows(0, n));
}

void fill_grammar_masks(std::span<const SamplingBatch::GrammarRow> rows, int64_t words, uint32_t* out) {
  // One task a request (its rows come together): row j's mask after its first j drafts, consumed one by one and
  // taken back at the end, so the matcher is where the scheduler left it.
  std::vector<size_t> first_rows;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (g == 0 || rows[g].matcher != rows[g - 1].matcher) first_rows.push_back(g);
  }
  parallel_for_on_host_threads(first_rows.size(), [&](size_t task) {
    const size_t end = task + 1 < first_rows.size() ? first_rows[task + 1] : rows.size();
    GrammarMatcher& matcher = *rows[first_rows[task]].matcher;
    int32_t consumed = 0;
    for (size_t g = first_rows[task]; g < end; ++g) {
      const std::span<const int32_t> after = rows[g].after;
      while (consumed < static_cast<int32_t>(after.size()) && matcher.consume(after[static_cast<size_t>(consumed)])) {
        ++consumed;
      }
      matcher.fill_allowed({out + static_cast<int64_t>(g) * words, static_cast<size_t>(words)});
    }
    matcher.rollback(consumed);
  });
}

ConstTensorView StepRunner::grammar_masks(const SamplingBatch& sb) {
  const int64_t words = allowed_token_words(model_.config().vocab_size);
  const auto rows = sb.grammars.empty() ? static_cast<int64_t>(sb.given_masks.size()) / words
                                        : static_cast<int64_t>(sb.grammars.size());
  if (mask_staging_.numel() < rows * words) {
    mask_staging_ = backend_.staging({std::max(rows * words, 2 * mask_staging_.numel())}, DType::kI32);
    masks_ = backend_.empty({mask_staging_.numel()}, DType::kI32);
  }
  auto* host = reinterpret_cast<uint32_t*>(mask_staging_.view().as<int32_t>());
  const auto started = std::chrono::steady_clock::now();
  if (sb.grammars.empty()) {
    std::copy(sb.given_masks.begin(), sb.given_masks.end(), mask_staging_.view().as<int32_t>());
  } else {
    fill_grammar_masks(sb.grammars, words, host);
  }
  num_grammar_masks_ += rows;
  grammar_mask_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const TensorView device = masks_.view().rows(0, rows * words);
  backend_.copy_to_device(mask_staging_.cview().rows(0, rows * words), device);
  return ConstTensorView(device).reshaped({rows, words});
}

ConstTensorView StepRunner::replay_graph(const ForwardBatch& padded, const StepLayout& layout) {
  const GraphKey key{padded.num_seqs(), padded.max_pages_per_seq};
  const TensorView logits = graph_logits_.view().rows(0, padded.num_seqs());
  const TensorView hidden = hidden_rows(padded.num_tokens(), /*graph=*/true);
  Graph& g = graphs_[key];
  if (g.graph == nullptr || !g.graph->replay()) {
    // The recorded work reads only what outlives this call: the graph's entry (its inputs are views of
    // graph_inputs_, at offsets that depend on the key alone), the model and the shared logits (and hidden states)
    // buffers. Graphs replay one at a time and the sampler reads the logits right after, so every graph writes them
    // to the same place.
    g.inputs = bind_step(graph_inputs_.cview(), layout, padded);
    g.graph = backend_.capture(
        [this, &g, logits, hidden] { model_.run_into(g.inputs.model, cache_.layers(), logits, hidden); });
    if (g.graph == nullptr) {  // this backend has no graphs (nothing ran): the caller runs the step eagerly
      graphs_.erase(key);
      options_.use_graphs = false;
      return {};
    }
    ++num_captures_;
    DI_CHECK(g.graph->replay(), "step runner: a graph stopped holding right after its capture");
  }
  ++num_replays_;
  return logits;
}

std::vector<SampledToken> StepRunner::execute(const ForwardBatch& batch) {
  const ModelConfig& c = model_.config();
  const LatentCacheShape& shape = cache_.shape();
  batch.validate(static_cast<int32_t>(c.vocab_size), shape.num_pages, shape.page_size);
  const auto n = static_cast<int64_t>(batch.logits_indices.size());
  const SamplingBatch& sb = batch.sampling;
  const auto host_view = [](const std::vector<int32_t>& v) {
    return ConstTensorView(v.data(), DType::kI32, {static_cast<int64_t>(v.size())}, Device::kCpu);
  };
  const int64_t mask_words = allowed_token_words(c.vocab_size);
  DI_CHECK(sb.grammars.empty() || sb.given_masks.empty(), "step: grammars and given masks at once");
  DI_CHECK(sb.given_masks.size() % static_cast<size_t>(mask_words) == 0, "step: given masks of ",
           sb.given_masks.size(), " words are not rows of ", mask_words);
  const auto num_mask_rows = sb.grammars.empty() ? static_cast<int64_t>(sb.given_masks.size()) / mask_words
                                                 : static_cast<int64_t>(sb.grammars.size());
  // The sampling inputs are checked here, on the host: the device op trusts them.
  SampleArgs{.logits = ConstTensorView(nullptr, DType::kF32, Shape{n, c.vocab_size}, Device::kCpu),
             .rows = host_view(sb.rows).reshaped({static_cast<int64_t>(sb.rows.size()) / kSamplingRowWords,
                                                  kSamplingRowWords}),
             .penalty_tokens = host_view(sb.penalty_tokens),
             .penalty_counts = host_view(sb.penalty_counts),
             .masked_tokens = host_view(sb.masked_tokens),
             .allowed_tokens = ConstTensorView(nullptr, DType::kI32, Shape{num_mask_rows, mask_words}, Device::kCpu),
             .out = TensorView{nullptr, DType::kI32, Shape{n, kSampledTokenWords}, Device::kCpu}}
      .validate();

  Forward f = forward(batch);
  const ConstTensorView allowed = num_mask_rows == 0 ? ConstTensorView{} : grammar_masks(sb);
  Tensor out = backend_.empty({n, kSampledTokenWords}, DType::kI32);
  backend_.sample({.logits = f.logits.rows(0, n), .rows = f.in.sampling_rows, .penalty_tokens = f.in.penalty_tokens,
                   .penalty_counts = f.in.penalty_counts, .masked_tokens = f.in.masked_tokens,
                   .allowed_tokens = allowed, .out = out.view()});
  std::vector<SampledToken> tokens(static_cast<size_t>(n));
  backend_.copy_to_host(out.cview(),
                        TensorView{tokens.data(), DType::kI32, Shape{n, kSampledTokenWords}, Device::kCpu});
  return tokens;
}

void StepRunner::execute_forward(const ForwardBatch& batch) {
  const LatentCacheShape& shape = cache_.shape();
  batch.validate(static_cast<int32_t>(model_.config().vocab_size), shape.num_pages, shape.page_size);
  const Forward f = forward(batch);
  // Waits for the step, so that a failure shows here, in this step, and the rank keeps pace with rank 0.
  if (f.logits.numel() > 0) {
    float first = 0.0f;
    backend_.copy_to_host(f.logits.rows(0, 1).columns(0, 1),
                          TensorView{&first, DType::kF32, Shape{1, 1}, Device::kCpu});
  }
}

StepRunner::Forward StepRunner::forward(const ForwardBatch& batch) {
  const LatentCacheShape& shape = cache_.shape();
  Forward f;
  Tensor& eager_inputs = f.eager_inputs;
  Tensor& eager_logits = f.eager_logits;
  ConstTensorView& logits = f.logits;
  StepInputs& in = f.in;
  if (graph_eligible(batch)) {
    const ForwardBatch padded = pad_decode_batch(batch, buckets_, options_.max_graph_pages, options_.scratch_page,
                                                 shape.page_size);
    const StepLayout layout = pack_step(padded, packed_);
    if (layout.total() <= graph_inputs_.numel()) {
      upload(packed_, graph_inputs_.view());
      logits = replay_graph(padded, layout);
      in = bind_step(graph_inputs_.cview(), layout, padded);
      if (logits.data != nullptr && options_.keep_hidden) last_hidden_ = graph_hidden_.cview().rows(0, batch.num_tokens());
    }
  }
  if (logits.data == nullptr) {
    // A pure decode step run eagerly takes the context bucket a graph would (no padded rows): the attention splits
    // its work the same way, so eager and graph steps of one shape compute the same numbers.
    const int32_t seqs = batch.num_seqs();
    const int64_t longest_bucket = static_cast<int64_t>(options_.max_graph_pages) * shape.page_size;
    const bool decode =
        batch.is_pure_decode() && longest_bucket > 0 && batch.max_context_len(0, seqs) <= longest_bucket;
    const int32_t one_bucket[] = {seqs};
    const ForwardBatch bucketed =
        decode ? pad_decode_batch(batch, one_bucket, options_.max_graph_pages, -1, shape.page_size) : ForwardBatch{};
    const ForwardBatch& run_batch = decode ? bucketed : batch;
    const StepLayout layout = pack_step(run_batch, packed_);
    eager_inputs = backend_.empty({layout.total()}, DType::kI32);
    upload(packed_, eager_inputs.view());
    in = bind_step(eager_inputs.cview(), layout, run_batch);
    eager_logits = backend_.empty({in.model.num_logits, model_.config().vocab_size}, DType::kF32);
    const TensorView hidden = hidden_rows(run_batch.num_tokens(), /*graph=*/false);
    model_.run_into(in.model, cache_.layers(), eager_logits.view(), hidden);
    logits = eager_logits.cview();
    if (options_.keep_hidden) last_hidden_ = ConstTensorView(hidden).rows(0, batch.num_tokens());
  }
  return f;
}

StepResult collect_step_result(const StepBatch& step, std::span<const SampledToken> rows) {
  StepResult result;
  result.sampled.reserve(step.logits_row_of_sample.size());
  for (size_t i = 0; i < step.logits_row_of_sample.size(); ++i) {
    const int32_t row = step.logits_row_of_sample[i], count = step.num_rows_of_sample(i);
    DI_CHECK(row >= 0 && count >= 1 && static_cast<size_t>(row + count) <= rows.size(), "step runner: logits rows [",
             row, ", ", row + count, ") of ", rows.size());
    result.sampled.insert(result.sampled.end(), rows.begin() + row, rows.begin() + row + count);
  }
  for (const ScoredRows& s : step.scored) {
    DI_CHECK(s.first_row >= 0 && static_cast<size_t>(s.first_row + s.count) <= rows.size(), "step runner: scored rows [",
             s.first_row, ", ", s.first_row + s.count, ") of ", rows.size());
    result.scored.emplace_back(rows.begin() + s.first_row, rows.begin() + s.first_row + s.count);
  }
  return result;
}

StepResult StepRunner::execute(const StepBatch& step) {
  return collect_step_result(step, execute(step.forward));
}

}  // namespace deepinfer
