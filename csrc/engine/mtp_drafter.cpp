#include "engine/mtp_drafter.h"

#include <algorithm>

#include "backend/ops/sample.h"
#include "core/error.h"

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
                       Communicator* workers, bool data_parallel, int32_t scratch_page)
    : model_(model),
      cache_(cache),
      k_(num_speculative_tokens),
      workers_(workers),
      data_parallel_(data_parallel),
      scratch_page_(scratch_page) {
  DI_CHECK_ARG(k_ >= 1 && k_ <= kMaxSpeculativeTokens, "num_speculative_tokens must be in [1, ",
               kMaxSpeculativeTokens, "], got ", k_);
  DI_CHECK(model_.has_mtp(), "drafter: the model was loaded without its MTP layer");
  DI_CHECK(cache_.shape().num_layers == model_.config().num_hidden_layers + 1,
           "drafter: a latent cache of ", cache_.shape().num_layers, " layers has no MTP layer");
  DI_CHECK(!data_parallel_ || (workers_ != nullptr && scratch_page_ >= 0),
           "drafter: data-parallel lanes need the other ranks and a scratch page");
}

// What the drafter tracks of one lane between its passes.
struct MtpDrafter::Lane {
  Scheduler* scheduler = nullptr;
  std::vector<DraftSequence> seqs;
  std::vector<DraftSequence*> sampling;  // the sequences of the lane's latest pass that sample, in logits-row order
};

void MtpDrafter::propose(std::span<const DraftLane> lanes, ConstTensorView step_hidden) {
  DI_CHECK(!lanes.empty() && (data_parallel_ || lanes.size() == 1), "drafter: ", lanes.size(), " lanes");
  const int32_t page_size = cache_.shape().page_size;
  std::vector<Lane> state(lanes.size());
  std::vector<DraftPass> passes(lanes.size());
  bool any = false;
  bool chains = false;
  for (size_t l = 0; l < lanes.size(); ++l) {
    Lane& lane = state[l];
    lane.scheduler = lanes[l].scheduler;
    const int32_t max_len = lane.scheduler->config().max_model_len;
    for (const DraftChunk& c : lanes[l].chunks) {
      const Request* r = lane.scheduler->find(c.request_id);
      if (r == nullptr || r->status != RequestStatus::kRunning) continue;  // finished, aborted or preempted
      if (!r->speculates) continue;  // past disable_by_batch_size: no drafts, no MTP latents
      const int32_t count = r->num_computed_tokens - c.start;
      if (count <= 0) continue;
      int32_t allowed = 0;
      if (c.samples && r->num_uncomputed_tokens() == 1) {
        allowed = std::max(0, std::min({k_, r->params.max_tokens - r->num_output_tokens() - 1,
                                        max_len - r->num_tokens() - 1}));
      }
      lane.seqs.push_back({.request = r, .start = c.start, .count = count, .first_row = c.first_row,
                           .allowed = allowed});
      chains = chains || allowed > 1;
    }
    if (lane.seqs.empty()) continue;
    any = true;
    // The positions the step computed: short runs as one-token rows first (the decode range), then prompt chunks.
    int32_t max_pages = 0;
    for (const DraftSequence& q : lane.seqs) {
      max_pages = std::max(max_pages, static_cast<int32_t>(q.request->page_ids.size()));
    }
    ForwardBatchBuilder builder(page_size, max_pages);
    DraftPass& pass = passes[l];
    std::vector<int32_t> tokens;
    int32_t rows = 0;
    const auto add = [&](DraftSequence& q, bool split) {
      const Request& r = *q.request;
      tokens.clear();
      r.append_tokens(q.start + 1, q.count, tokens);  // t_{p+1} for each position p
      const bool samples = q.allowed > 0;
      if (split) {
        for (int32_t j = 0; j < q.count; ++j) {
          builder.add(std::span(tokens).subspan(static_cast<size_t>(j), 1), q.start + j, r.page_ids,
                      samples && j + 1 == q.count);
        }
      } else {
        builder.add(tokens, q.start, r.page_ids, samples);
      }
      for (int32_t j = 0; j < q.count; ++j) pass.hidden_rows.push_back(q.first_row + j);
      rows += q.count;
      q.last_row = rows - 1;
      if (samples) lane.sampling.push_back(&q);
    };
    for (DraftSequence& q : lane.seqs) {
      if (q.count <= kMaxRowSplitPositions) add(q, true);
    }
    for (DraftSequence& q : lane.seqs) {
      if (q.count > kMaxRowSplitPositions) add(q, false);
    }
    pass.batch = std::move(builder).take();
    for (size_t i = 0; i < lane.sampling.size(); ++i) add_greedy_row(pass.batch.sampling);
  }
  if (!any) return;
  for (DraftPass& pass : passes) pass.keeps_hidden = k_ > 1 && chains;
  Tensor previous;
  std::vector<std::vector<int32_t>> drafted = run_passes(passes, step_hidden, previous);
  for (size_t l = 0; l < state.size(); ++l) {
    for (size_t i = 0; i < state[l].sampling.size(); ++i) state[l].sampling[i]->drafts.push_back(drafted[l][i]);
  }

  // Drafts 2..k: the layer again at positions N, N + 1, ... of each request that may take them, where its pages
  // (the scheduler's lookahead) hold the provisional latents.
  for (int32_t j = 2; j <= k_ && chains; ++j) {
    bool more = false;
    for (size_t l = 0; l < state.size(); ++l) {
      Lane& lane = state[l];
      std::vector<DraftSequence*> next;
      int32_t pages = 0;
      for (DraftSequence* q : lane.sampling) {
        const Request& r = *q->request;
        const int32_t position = r.num_computed_tokens + j - 2;
        if (q->allowed >= j && position < static_cast<int32_t>(r.page_ids.size()) * page_size) {
          next.push_back(q);
          pages = std::max(pages, static_cast<int32_t>(r.page_ids.size()));
        }
      }
      passes[l] = DraftPass{.reads_step_hidden = false, .keeps_hidden = j < k_};
      lane.sampling = std::move(next);
      if (lane.sampling.empty()) continue;
      more = true;
      ForwardBatchBuilder chain(page_size, pages);
      for (size_t i = 0; i < lane.sampling.size(); ++i) {
        DraftSequence& q = *lane.sampling[i];
        const int32_t token[] = {q.drafts.back()};
        chain.add(token, q.request->num_computed_tokens + j - 2, q.request->page_ids, /*samples=*/true);
        passes[l].hidden_rows.push_back(q.last_row);
        q.last_row = static_cast<int32_t>(i);
      }
      passes[l].batch = std::move(chain).take();
      for (size_t i = 0; i < lane.sampling.size(); ++i) add_greedy_row(passes[l].batch.sampling);
    }
    if (!more) break;
    drafted = run_passes(passes, step_hidden, previous);
    for (size_t l = 0; l < state.size(); ++l) {
      for (size_t i = 0; i < state[l].sampling.size(); ++i) state[l].sampling[i]->drafts.push_back(drafted[l][i]);
    }
  }
  for (Lane& lane : state) {
    for (DraftSequence& q : lane.seqs) {
      if (!q.drafts.empty()) lane.scheduler->set_drafts(q.request->id, std::move(q.drafts));
    }
  }
}

std::vector<std::vector<int32_t>> MtpDrafter::run_passes(std::vector<DraftPass>& passes, ConstTensorView step_hidden,
                                                          Tensor& previous) {
  const int32_t page_size = cache_.shape().page_size;
  if (data_parallel_) {
    // A lane without a pass runs one token of no request on the scratch page, reading row 0 of its step's hidden
    // states (every rank ran a step, an idle one at least): its MoE layer meets the others'.
    int32_t most_tokens = 0;
    for (DraftPass& pass : passes) {
      if (pass.batch.num_tokens() == 0) {
        ForwardBatchBuilder padding(page_size, 1);
        const int32_t token[] = {0}, pages[] = {scratch_page_};
        padding.add(token, 0, pages, /*samples=*/false);
        pass = DraftPass{.batch = std::move(padding).take(), .hidden_rows = {0}, .reads_step_hidden = true,
                         .keeps_hidden = false};
      }
      most_tokens = std::max(most_tokens, pass.batch.num_tokens());
    }
    for (DraftPass& pass : passes) pass.batch.dp_max_tokens = most_tokens;
    std::vector<int32_t> words = encode_lane_draft_passes(passes);
    workers_->broadcast(words, 0);
  } else if (workers_ != nullptr) {
    std::vector<int32_t> words = encode_draft_pass(passes[0]);
    workers_->broadcast(words, 0);
  }
  std::vector<std::vector<int32_t>> drafted(passes.size());
  const DraftPass& own = passes[0];
  Tensor kept;
  const MtpLayerRun run = run_mtp_layer(model_, cache_, own.batch, own.reads_step_hidden ? step_hidden : previous.cview(),
                                        own.hidden_rows, own.keeps_hidden ? &kept : nullptr);
  drafted[0] = sample_drafts(model_.backend(), run);
  if (own.keeps_hidden) previous = std::move(kept);
  if (data_parallel_) {
    std::vector<std::vector<int32_t>> lanes = send_lanes_to_rank0(*workers_, {});
    for (size_t r = 1; r < passes.size(); ++r) drafted[r] = std::move(lanes[r]);
  }
  return drafted;
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

std::vector<int32_t> sample_drafts(Backend& backend, const MtpLayerRun& run) {
  const int64_t n = run.logits.shape()[0];
  if (n == 0) return {};  // the layer's latents only (prompt chunks that do not sample yet)
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
