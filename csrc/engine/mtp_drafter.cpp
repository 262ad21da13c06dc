#include "engine/mtp_drafter.h"

#include <algorithm>

#include "backend/ops/sample.h"
#include "core/error.h"
#include "engine/worker_ranks.h"

namespace deepinfer {
namespace {

// A chunk of at most this many positions runs as one-token rows on the absorbed decode path (each over the request's
// pages, its context ending at its position); a longer one (a prompt chunk) as one sequence on the prefill path.
constexpr int32_t kMaxRowSplitPositions = 16;

// A request the drafter runs the MTP layer for.
struct DraftSequence {
  const Request* request = nullptr;
  int32_t start = 0;      // first position of the step's chunk
  int32_t count = 0;      // positions it computed
  int32_t first_row = 0;  // of its hidden states in the step's batch
  int32_t allowed = 0;    // drafts it may take
  std::vector<int32_t> drafts;
  int32_t last_row = -1;  // its last token row in the latest pass (whose output hidden state the next pass reads)
};

void add_greedy_row(SamplingBatch& sampling) {
  const SamplingRow row{};  // temperature 0: the argmax, no penalties, no logprobs
  const auto* words = reinterpret_cast<const int32_t*>(&row);
  sampling.rows.insert(sampling.rows.end(), words, words + kSamplingRowWords);
}

}  // namespace

MtpDrafter::MtpDrafter(DeepseekModel& model, const LatentCache& cache, int32_t num_speculative_tokens,
                       Communicator* workers)
    : model_(model), cache_(cache), k_(num_speculative_tokens), workers_(workers) {
  DI_CHECK_ARG(k_ >= 1 && k_ <= kMaxSpeculativeTokens, "num_speculative_tokens must be in [1, ",
               kMaxSpeculativeTokens, "], got ", k_);
  DI_CHECK(model_.has_mtp(), "drafter: the model was loaded without its MTP layer");
  DI_CHECK(cache_.shape().num_layers == model_.config().num_hidden_layers + 1,
           "drafter: a latent cache of ", cache_.shape().num_layers, " layers has no MTP layer");
}

void MtpDrafter::propose(std::span<const DraftChunk> chunks, ConstTensorView step_hidden, Scheduler& scheduler) {
  const int32_t page_size = cache_.shape().page_size;
  const int32_t max_len = scheduler.config().max_model_len;
  std::vector<DraftSequence> seqs;
  for (const DraftChunk& c : chunks) {
    const Request* r = scheduler.find(c.request_id);
    if (r == nullptr || r->status != RequestStatus::kRunning) continue;  // finished, aborted or preempted
    const int32_t count = r->num_computed_tokens - c.start;
    if (count <= 0) continue;
    int32_t allowed = 0;
    if (c.samples && r->num_uncomputed_tokens() == 1) {
      allowed = std::max(0, std::min({k_, r->params.max_tokens - r->num_output_tokens() - 1,
                                      max_len - r->num_tokens() - 1}));
    }
    seqs.push_back({.request = r, .start = c.start, .count = count, .first_row = c.first_row, .allowed = allowed});
  }
  if (seqs.empty()) return;

  // The positions the step computed: short runs as one-token rows first (the decode range), then prompt chunks.
  int32_t max_pages = 0;
  for (const DraftSequence& s : seqs) max_pages = std::max(max_pages, static_cast<int32_t>(s.request->page_ids.size()));
  ForwardBatchBuilder builder(page_size, max_pages);
  std::vector<int32_t> hidden_rows;
  std::vector<DraftSequence*> sampling;  // in logits-row order
  std::vector<int32_t> tokens;
  int32_t rows = 0;
  const auto add = [&](DraftSequence& s, bool split) {
    const Request& r = *s.request;
    tokens.clear();
    r.append_tokens(s.start + 1, s.count, tokens);  // t_{p+1} for each position p
    const bool samples = s.allowed > 0;
    if (split) {
      for (int32_t j = 0; j < s.count; ++j) {
        builder.add(std::span(tokens).subspan(static_cast<size_t>(j), 1), s.start + j, r.page_ids,
                    samples && j + 1 == s.count);
      }
    } else {
      builder.add(tokens, s.start, r.page_ids, samples);
    }
    for (int32_t j = 0; j < s.count; ++j) hidden_rows.push_back(s.first_row + j);
    rows += s.count;
    s.last_row = rows - 1;
    if (samples) sampling.push_back(&s);
  };
  for (DraftSequence& s : seqs) {
    if (s.count <= kMaxRowSplitPositions) add(s, true);
  }
  for (DraftSequence& s : seqs) {
    if (s.count > kMaxRowSplitPositions) add(s, false);
  }
  ForwardBatch batch = std::move(builder).take();
  for (size_t i = 0; i < sampling.size(); ++i) add_greedy_row(batch.sampling);
  Tensor out_hidden;
  const bool chains = k_ > 1 && std::any_of(seqs.begin(), seqs.end(), [](const auto& s) { return s.allowed > 1; });
  std::vector<int32_t> drafted =
      run_pass(batch, step_hidden, hidden_rows, /*reads_step_hidden=*/true, chains ? &out_hidden : nullptr);
  for (size_t i = 0; i < sampling.size(); ++i) sampling[i]->drafts.push_back(drafted[i]);

  // Drafts 2..k: the layer again at positions N, N + 1, ... of each request that may take them, where its pages
  // (the scheduler's lookahead) hold the provisional latents.
  for (int32_t j = 2; j <= k_ && chains; ++j) {
    std::vector<DraftSequence*> next;
    int32_t pages = 0;
    for (DraftSequence* s : sampling) {
      const Request& r = *s->request;
      const int32_t position = r.num_computed_tokens + j - 2;
      if (s->allowed >= j && position < static_cast<int32_t>(r.page_ids.size()) * page_size) {
        next.push_back(s);
        pages = std::max(pages, static_cast<int32_t>(r.page_ids.size()));
      }
    }
    if (next.empty()) break;
    ForwardBatchBuilder chain(page_size, pages);
    hidden_rows.clear();
    for (size_t i = 0; i < next.size(); ++i) {
      DraftSequence& s = *next[i];
      const int32_t token[] = {s.drafts.back()};
      chain.add(token, s.request->num_computed_tokens + j - 2, s.request->page_ids, /*samples=*/true);
      hidden_rows.push_back(s.last_row);
      s.last_row = static_cast<int32_t>(i);
    }
    ForwardBatch chain_batch = std::move(chain).take();
    for (size_t i = 0; i < next.size(); ++i) add_greedy_row(chain_batch.sampling);
    const Tensor previous = std::move(out_hidden);
    drafted = run_pass(chain_batch, previous.cview(), hidden_rows, /*reads_step_hidden=*/false,
                       j < k_ ? &out_hidden : nullptr);
    for (size_t i = 0; i < next.size(); ++i) next[i]->drafts.push_back(drafted[i]);
    sampling = std::move(next);
  }
  for (DraftSequence& s : seqs) {
    if (!s.drafts.empty()) scheduler.set_drafts(s.request->id, std::move(s.drafts));
  }
}

MtpLayerRun run_mtp_layer(DeepseekModel& model, const LatentCache& cache, const ForwardBatch& batch,
                          ConstTensorView hidden, std::span<const int32_t> hidden_rows, Tensor* out_hidden) {
  const ModelConfig& c = model.config();
  const LatentCacheShape& shape = cache.shape();
  batch.validate(static_cast<int32_t>(c.vocab_size), shape.num_pages, shape.page_size);
  const int64_t t = batch.num_tokens(), n = static_cast<int64_t>(batch.logits_indices.size()), d = c.hidden_size;
  DI_CHECK(static_cast<int64_t>(hidden_rows.size()) == t, "drafter: ", hidden_rows.size(), " hidden rows for ", t,
           " tokens");
  for (int32_t row : hidden_rows) {
    DI_CHECK(row >= 0 && row < hidden.shape[0], "drafter: hidden row ", row, " of ", hidden.shape[0]);
  }

  // The step's arrays and the hidden rows' indices in one upload.
  std::vector<int32_t> packed;
  const StepLayout layout = pack_step(batch, packed);
  const int64_t rows_at = (layout.total() + StepLayout::kAlignment - 1) / StepLayout::kAlignment * StepLayout::kAlignment;
  Tensor host = Tensor::zeros({rows_at + t}, DType::kI32);
  std::copy(packed.begin(), packed.end(), host.view().as<int32_t>());
  std::copy(hidden_rows.begin(), hidden_rows.end(), host.view().as<int32_t>() + rows_at);
  Backend& backend = model.backend();
  MtpLayerRun run{.inputs = backend.upload(std::move(host), DType::kI32)};
  run.bound = bind_step(run.inputs.cview(), layout, batch);

  Tensor previous = backend.empty({t, d}, backend.activation_dtype());
  backend.gather_rows({.src = hidden, .indices = run.inputs.cview().rows(rows_at, t), .out = previous.view()});
  run.logits = backend.empty({n, c.vocab_size}, DType::kF32);
  if (out_hidden != nullptr) *out_hidden = backend.empty({t, d}, backend.activation_dtype());
  model.run_mtp_into(run.bound.model, cache.layers(), previous.cview(), run.logits.view(),
                     out_hidden != nullptr ? out_hidden->view() : TensorView{});
  return run;
}

std::vector<int32_t> MtpDrafter::run_pass(const ForwardBatch& batch, ConstTensorView hidden,
                                          std::span<const int32_t> hidden_rows, bool reads_step_hidden,
                                          Tensor* out_hidden) {
  if (workers_ != nullptr) {
    std::vector<int32_t> words = encode_draft_pass({.batch = batch,
                                                    .hidden_rows = {hidden_rows.begin(), hidden_rows.end()},
                                                    .reads_step_hidden = reads_step_hidden,
                                                    .keeps_hidden = out_hidden != nullptr});
    workers_->broadcast(words, 0);
  }
  const MtpLayerRun run = run_mtp_layer(model_, cache_, batch, hidden, hidden_rows, out_hidden);
  const int64_t n = run.logits.shape()[0];
  if (n == 0) return {};  // the layer's latents only (prompt chunks that do not sample yet)
  Backend& backend = model_.backend();
  const StepInputs& in = run.bound;
  Tensor sampled = backend.empty({n, kSampledTokenWords}, DType::kI32);
  backend.sample({.logits = run.logits.cview(), .rows = in.sampling_rows, .penalty_tokens = in.penalty_tokens,
                  .penalty_counts = in.penalty_counts, .masked_tokens = in.masked_tokens, .out = sampled.view()});
  std::vector<SampledToken> rows(static_cast<size_t>(n));
  backend.copy_to_host(sampled.cview(), TensorView{rows.data(), DType::kI32, Shape{n, kSampledTokenWords}, Device::kCpu});
  std::vector<int32_t> tokens;
  tokens.reserve(rows.size());
  for (const SampledToken& row : rows) tokens.push_back(row.token);
  return tokens;
}

}  // namespace deepinfer
