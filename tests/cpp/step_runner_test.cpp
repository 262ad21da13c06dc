// The step runner's host side: graph batch buckets, and padded decode batches (what a decode graph runs) giving the
// real rows the same logits as the batch unpadded, on the CPU reference backend.
#include "engine/step_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/weights.h"
#include "safetensors_writer.h"

namespace deepinfer {
namespace {

using test::TempDir;

TEST(GraphBatchBuckets, CoverEveryBatchUpToTheMaximum) {
  for (int32_t max_batch : {1, 7, 8, 9, 64, 100, 256, 1000}) {
    const std::vector<int32_t> b = graph_batch_buckets(max_batch);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.front(), 1);
    EXPECT_EQ(b.back(), max_batch);
    EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
    EXPECT_EQ(std::adjacent_find(b.begin(), b.end()), b.end()) << "duplicate bucket";
    // Padding wastes at most a quarter of a bucket above 8 sequences.
    for (size_t i = 1; i < b.size(); ++i) {
      if (b[i - 1] >= 8) {
        EXPECT_LE(b[i] - b[i - 1], std::max(8, b[i - 1] / 4 + 1)) << b[i - 1] << " -> " << b[i];
      }
    }
  }
  EXPECT_EQ(graph_batch_buckets(12), (std::vector<int32_t>{1, 2, 4, 8, 12}));
}

// A small DeepSeek-V3 layout (MLA with q_lora, one dense layer, one MoE layer) with random weights.
class PaddedDecodeTest : public ::testing::Test {
 protected:
  static constexpr int32_t kPageSize = 4;
  static constexpr int32_t kPages = 40;

  void SetUp() override {
    const nlohmann::json config = {
        {"architectures", {"DeepseekV3ForCausalLM"}}, {"vocab_size", 96}, {"hidden_size", 64},
        {"intermediate_size", 96}, {"moe_intermediate_size", 32}, {"num_hidden_layers", 2},
        {"num_attention_heads", 4}, {"q_lora_rank", 32}, {"kv_lora_rank", 32}, {"qk_nope_head_dim", 16},
        {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"n_routed_experts", 8}, {"n_shared_experts", 1},
        {"num_experts_per_tok", 2}, {"n_group", 2}, {"topk_group", 1}, {"first_k_dense_replace", 1},
        {"norm_topk_prob", true}, {"routed_scaling_factor", 2.0}, {"max_position_embeddings", 256},
        {"eos_token_id", 1}};
    std::ofstream(dir_.path() / "config.json") << config.dump();
    EngineOptions options;
    options.model_path = dir_.path().string();
    options.load_format = LoadFormat::kDummy;
    options.seed = 5;
    loaded_ = load_model(options);
    cache_ = std::make_unique<LatentCache>(
        LatentCacheShape{.num_layers = 2, .num_pages = kPages, .page_size = kPageSize,
                         .latent_dim = loaded_.model->config().latent_dim()},
        *loaded_.backend);
  }

  // Prefills sequence s (pages 4s .. 4s+3, 16 tokens of room) with `len` tokens.
  void prefill(int32_t s, int32_t len) {
    std::vector<int32_t> tokens;
    for (int32_t pos = 0; pos < len; ++pos) tokens.push_back((7 * s + 3 * pos + 2) % 96);
    ForwardBatchBuilder builder(kPageSize, 4);
    builder.add(tokens, 0, pages_of(s), /*samples=*/true);
    run_forward(*loaded_.model, *cache_, std::move(builder).take());
  }
  static std::vector<int32_t> pages_of(int32_t s) { return {4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3}; }

  // One decode step of sequences 0..n-1 with contexts ctx[s] (the new token at position ctx[s] - 1).
  static ForwardBatch decode_batch(const std::vector<int32_t>& ctx) {
    ForwardBatchBuilder builder(kPageSize, 4);
    for (int32_t s = 0; s < static_cast<int32_t>(ctx.size()); ++s) {
      const int32_t token[] = {(11 * s + 5) % 96};
      builder.add(token, ctx[static_cast<size_t>(s)] - 1, pages_of(s), /*samples=*/true);
    }
    return std::move(builder).take();
  }

  TempDir dir_{"step_runner_test"};
  LoadedModel loaded_;
  std::unique_ptr<LatentCache> cache_;
};

TEST_F(PaddedDecodeTest, PaddedRowsLeaveTheRealRowsLogitsUnchanged) {
  const std::vector<int32_t> prompt = {5, 9, 3};
  for (int32_t s = 0; s < 3; ++s) prefill(s, prompt[static_cast<size_t>(s)]);
  const std::vector<int32_t> ctx = {6, 10, 4};  // after the decode token's write
  const ForwardBatch plain = decode_batch(ctx);
  const std::vector<int32_t> buckets = graph_batch_buckets(16);
  const int32_t scratch = kPages - 1;
  const ForwardBatch padded = pad_decode_batch(plain, buckets, /*max_pages=*/16, scratch, kPageSize);

  ASSERT_EQ(padded.num_seqs(), 4);  // bucket of 3
  EXPECT_EQ(padded.max_pages_per_seq, 8);  // at least 8 pages wide
  EXPECT_EQ(padded.decode_context_bound, 8 * kPageSize);
  EXPECT_EQ(padded.slot_mapping.back(), scratch * kPageSize);
  EXPECT_EQ(padded.page_table[3 * 8], scratch);
  EXPECT_EQ(padded.logits_indices, (std::vector<int32_t>{0, 1, 2, 3}));

  // The plain step first (it writes the decode tokens' latents), then the padded one over the same cache: the same
  // writes again, so both see identical caches.
  const Tensor a = run_forward(*loaded_.model, *cache_, plain);
  const Tensor b = run_forward(*loaded_.model, *cache_, padded);
  ASSERT_EQ(b.shape()[0], 4);
  const int64_t vocab = a.shape()[1];
  for (int64_t r = 0; r < 3; ++r) {
    double max_ref = 0.0, max_diff = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      const float x = a.f32()[r * vocab + v], y = b.f32()[r * vocab + v];
      max_ref = std::max(max_ref, std::abs(static_cast<double>(x)));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(x) - y));
    }
    EXPECT_LE(max_diff, 1e-5 * max_ref) << "row " << r;
  }
}

TEST_F(PaddedDecodeTest, RejectsBatchesNoGraphServes) {
  const std::vector<int32_t> buckets = graph_batch_buckets(2);
  EXPECT_THROW(pad_decode_batch(decode_batch({3, 3, 3}), buckets, 16, kPages - 1, kPageSize), Error);  // 3 > 2
  EXPECT_THROW(pad_decode_batch(decode_batch({16}), buckets, 2, kPages - 1, kPageSize), Error);  // 4 pages > 2
  ForwardBatch prefill_batch = decode_batch({3});
  prefill_batch.num_decode_seqs = 0;
  EXPECT_THROW(pad_decode_batch(prefill_batch, buckets, 16, kPages - 1, kPageSize), Error);
}

// The eager runner samples greedily what the logits say, through the backend's sample op.
TEST_F(PaddedDecodeTest, RunnerSamplesTheGreedyTokenOfEachRow) {
  for (int32_t s = 0; s < 2; ++s) prefill(s, 4);
  ForwardBatch batch = decode_batch({5, 5});
  const Tensor logits = run_forward(*loaded_.model, *cache_, batch);
  for (int32_t s = 0; s < 2; ++s) {
    SamplingRow row;  // greedy
    const auto* words = reinterpret_cast<const int32_t*>(&row);
    batch.sampling.rows.insert(batch.sampling.rows.end(), words, words + kSamplingRowWords);
  }
  StepRunner runner(*loaded_.model, *cache_, {});
  const std::vector<SampledToken> tokens = runner.execute(batch);
  ASSERT_EQ(tokens.size(), 2u);
  const int64_t vocab = logits.shape()[1];
  for (int64_t r = 0; r < 2; ++r) {
    const float* row = logits.f32() + r * vocab;
    EXPECT_EQ(tokens[static_cast<size_t>(r)].token, std::max_element(row, row + vocab) - row);
  }
  EXPECT_EQ(runner.num_graphs(), 0);
  // A plan's step comes back in the plan's order: here its second logits row first.
  const std::vector<SampledToken> in_plan_order =
      runner.execute(StepBatch{.forward = batch, .logits_row_of_sample = {1, 0}}).sampled;
  ASSERT_EQ(in_plan_order.size(), 2u);
  ASSERT_NE(tokens[0].token, tokens[1].token);  // so that the order shows
  EXPECT_EQ(in_plan_order[0].token, tokens[1].token);
  EXPECT_EQ(in_plan_order[1].token, tokens[0].token);
}

// The CPU backend with "graphs": capture() runs the work twice as the CUDA backend does, and a replay runs it
// again (it holds while the test leaves the generation alone). It lets the runner's graph path — buckets, padding
// rows on the scratch page, inputs laid out per key, renewal of graphs that stopped holding — run in CI.
class FakeGraphBackend final : public Backend {
 public:
  FakeGraphBackend() : cpu_(make_cpu_backend()) {}
  Device device() const override { return cpu_->device(); }
  std::string_view name() const override { return "fake-graphs"; }
  bool supports(OpKind op) const override { return cpu_->supports(op); }
  DType activation_dtype() const override { return cpu_->activation_dtype(); }
  Tensor empty(Shape shape, DType dtype) override { return cpu_->empty(shape, dtype); }
  Tensor zeros(Shape shape, DType dtype) override { return cpu_->zeros(shape, dtype); }
  void copy_to_device(ConstTensorView host, TensorView dst) override { cpu_->copy_to_device(host, dst); }
  void copy_to_host(ConstTensorView src, TensorView host) override { cpu_->copy_to_host(src, host); }
  Tensor upload(Tensor host, DType dtype) override { return cpu_->upload(std::move(host), dtype); }
  void linear(const LinearArgs& a) override { cpu_->linear(a); }
  void head_linear(const HeadLinearArgs& a) override { cpu_->head_linear(a); }
  void embedding(const EmbeddingArgs& a) override { cpu_->embedding(a); }
  void gather_rows(const GatherRowsArgs& a) override { cpu_->gather_rows(a); }
  void copy_strided(const CopyStridedArgs& a) override { cpu_->copy_strided(a); }
  void rms_norm(const RmsNormArgs& a) override { cpu_->rms_norm(a); }
  void add_rms_norm(const AddRmsNormArgs& a) override { cpu_->add_rms_norm(a); }
  void silu_mul(const SiluMulArgs& a) override { cpu_->silu_mul(a); }
  void add(const AddArgs& a) override { cpu_->add(a); }
  void rope(const RopeArgs& a) override { cpu_->rope(a); }
  void mla_cache_write(const MlaCacheWriteArgs& a) override { cpu_->mla_cache_write(a); }
  void mla_decode(const MlaDecodeArgs& a) override { cpu_->mla_decode(a); }
  void mla_prefill(const MlaPrefillArgs& a) override { cpu_->mla_prefill(a); }
  void moe_route(const MoeRouteArgs& a) override { cpu_->moe_route(a); }
  void moe_experts(const MoeExpertsArgs& a) override { cpu_->moe_experts(a); }
  void sample(const SampleArgs& a) override { cpu_->sample(a); }

  std::unique_ptr<StepGraph> capture(const std::function<void()>& work) override {
    work();  // the warm-up run
    work();  // the "recorded" one
    ++captures;
    return std::make_unique<Graph>(work, generation);
  }

  int captures = 0;
  uint64_t generation = 0;  // bumping it makes every graph stop holding

 private:
  class Graph final : public StepGraph {
   public:
    Graph(std::function<void()> work, const uint64_t& generation)
        : work_(std::move(work)), generation_(generation), recorded_in_(generation) {}
    bool replay() override {
      if (generation_ != recorded_in_) return false;
      work_();
      return true;
    }

   private:
    std::function<void()> work_;
    const uint64_t& generation_;
    uint64_t recorded_in_;
  };
  std::unique_ptr<Backend> cpu_;
};

class GraphPathTest : public PaddedDecodeTest {
 protected:
  void SetUp() override {
    PaddedDecodeTest::SetUp();  // the eager model and cache on the CPU backend
    EngineOptions options;
    options.model_path = dir_.path().string();
    const ModelConfig config = load_model_config(options.model_path);
    graph_model_ = std::make_unique<DeepseekModel>(config, load_weights(config, *make_dummy_source(5)), fake_);
    graph_cache_ = std::make_unique<LatentCache>(cache_->shape(), fake_);
  }

  // Prefills sequence s with the same tokens into both caches.
  void prefill_both(int32_t s, int32_t len) {
    prefill(s, len);
    std::swap(loaded_.model, graph_model_owner());
    std::swap(cache_, graph_cache_);
    prefill(s, len);
    std::swap(loaded_.model, graph_model_owner());
    std::swap(cache_, graph_cache_);
  }
  std::unique_ptr<DeepseekModel>& graph_model_owner() { return graph_model_; }

  // Greedy rows that also ask for the top 5 logprobs: those show any change of the logits, not only of the argmax.
  static void add_greedy_rows(ForwardBatch& b) {
    for (int32_t s = 0; s < b.num_seqs(); ++s) {
      SamplingRow row;
      row.num_logprobs = 5;
      const auto* words = reinterpret_cast<const int32_t*>(&row);
      b.sampling.rows.insert(b.sampling.rows.end(), words, words + kSamplingRowWords);
    }
  }

  static void expect_same(const SampledToken& got, const SampledToken& want, size_t step) {
    EXPECT_EQ(got.token, want.token) << "step " << step;
    ASSERT_EQ(got.num_top, 5);
    ASSERT_EQ(want.num_top, 5);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(got.top_ids[i], want.top_ids[i]) << "step " << step;
      EXPECT_NEAR(got.top_logprobs[i], want.top_logprobs[i], 1e-5) << "step " << step;
    }
  }

  FakeGraphBackend fake_;
  std::unique_ptr<DeepseekModel> graph_model_;
  std::unique_ptr<LatentCache> graph_cache_;
};

TEST_F(GraphPathTest, ReplaysGiveTheEagerTokensAndRenewStaleGraphs) {
  for (int32_t s = 0; s < 5; ++s) prefill_both(s, 3 + 2 * s);
  StepRunner eager(*loaded_.model, *cache_, {.max_graph_batch = 8, .max_graph_pages = 4});
  StepRunner graphs(*graph_model_, *graph_cache_,
                    {.use_graphs = true, .max_graph_batch = 8, .max_graph_pages = 4, .scratch_page = kPages - 1});
  // Batches of 3, 2, 5 and 3 sequences again (buckets 4, 2, 8, 4), contexts growing by one each step.
  std::vector<int32_t> ctx = {4, 6, 8, 10, 12};
  const std::vector<int32_t> sizes = {3, 2, 5, 3};
  for (size_t step = 0; step < sizes.size(); ++step) {
    ForwardBatch b = decode_batch(std::vector<int32_t>(ctx.begin(), ctx.begin() + sizes[step]));
    add_greedy_rows(b);
    const std::vector<SampledToken> want = eager.execute(b);
    const std::vector<SampledToken> got = graphs.execute(b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r) expect_same(got[r], want[r], step);
    for (int32_t s = 0; s < sizes[step]; ++s) ++ctx[static_cast<size_t>(s)];
  }
  EXPECT_EQ(graphs.num_graphs(), 3);  // (4, 8 pages), (2, 8), (8, 8): the 4th step replayed the first
  EXPECT_EQ(graphs.num_graph_replays(), 4);
  EXPECT_EQ(fake_.captures, 3);
  EXPECT_EQ(eager.num_graphs(), 0);

  // A graph that stopped holding (a workspace it recorded was replaced) is recorded again, under the same key.
  fake_.generation += 1;
  ForwardBatch b = decode_batch(std::vector<int32_t>(ctx.begin(), ctx.begin() + 2));
  add_greedy_rows(b);
  const std::vector<SampledToken> want = eager.execute(b);
  const std::vector<SampledToken> got = graphs.execute(b);
  expect_same(got[0], want[0], 4);
  expect_same(got[1], want[1], 4);
  EXPECT_EQ(graphs.num_graphs(), 3);
  EXPECT_EQ(graphs.num_graph_captures(), 4);
  EXPECT_EQ(graphs.num_graph_replays(), 5);

  // A backend without graphs (the CPU's capture() records nothing): the runner falls back to eager steps.
  StepRunner no_graphs(*loaded_.model, *cache_,
                       {.use_graphs = true, .max_graph_batch = 8, .max_graph_pages = 4, .scratch_page = kPages - 1});
  const std::vector<SampledToken> fallback = no_graphs.execute(b);
  expect_same(fallback[0], want[0], 5);
  expect_same(fallback[1], want[1], 5);
  EXPECT_EQ(no_graphs.num_graphs(), 0);
  EXPECT_EQ(no_graphs.num_graph_replays(), 0);

  // Mixed steps (a prefill chunk beside decodes) never take a graph.
  ForwardBatch mixed = decode_batch({ctx[0] + 1});
  mixed.num_decode_seqs = 0;  // its one chunk is a 1-token prefill: not a pure decode step
  add_greedy_rows(mixed);
  graphs.execute(mixed);
  EXPECT_EQ(graphs.num_graph_replays(), 5);
}

}  // namespace
}  // namespace deepinfer
