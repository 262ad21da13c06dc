// Programmatic dependent launch (launch.h, ptx.cuh) on a chain of dependent ops shaped like one decode layer plus the
// sampling tail: each op reads what the op before it wrote, so a kernel that touched memory before its griddep_wait
// would read stale values, or race with its predecessor's writes. The chain runs three ways on the CUDA backend and
// must produce the same bytes every time:
//   - op by op, with the device synchronized after each op (no two kernels ever overlap): the reference;
//   - queued back to back (programmatic dependent launches on the stream);
//   - replayed from a captured graph (programmatic edges between the kernel nodes), several times.
// The ops' values themselves are checked against the CPU in cuda_backend_test.cpp. The test runs twice: on a backend
// whose tuning record launches with PDL, and on one that launches plainly (CudaTuning::pdl off, as
// DEEPINFER_DISABLE_PDL=1 makes it). Fails without a GPU.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/tuning.h"
#include "device_memory.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {
namespace {

Tensor device_floats(Backend& b, Shape shape, const std::vector<float>& values, DType dtype) {
  Tensor host = Tensor::empty(shape, DType::kF32);
  std::copy(values.begin(), values.end(), host.f32());
  return b.upload(std::move(host), dtype);
}

Tensor device_ints(Backend& b, Shape shape, const std::vector<int32_t>& values) {
  Tensor host = Tensor::empty(shape, DType::kI32);
  std::copy(values.begin(), values.end(), host.view().as<int32_t>());
  return b.upload(std::move(host), DType::kI32);
}

std::vector<uint8_t> bytes_of(Backend& b, ConstTensorView t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  b.copy_to_host(t, TensorView{out.data(), t.dtype, t.shape, Device::kCpu});
  return out;
}

using Results = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

// Two decode sequences over a paged latent cache (V2-Lite's 16 heads, contexts long enough for the attention to split
// and combine), bfloat16:
//   copy_strided (reset the residual) -> copy_strided, mla_cache_write (zeros over the latent and this step's cache
//   rows) -> embedding -> add_rms_norm (lets gather_rows start early) -> gather_rows (the queries, from a table)
//   -> mla_prepare (the latent normalized, rotated and written into the cache; q_pe rotated into q_abs)
//   -> head_linear W_UK (q_nope into q_abs's latent columns; the launch ledger lets it compute beside mla_prepare and
//      lets mla_decode start with it) -> mla_decode (attention, fresh_rows 1: each sequence's newest row is
//      mla_prepare's; split combine; its value projection W_UV)
//   -> silu_mul -> add -> rms_norm
//   -> linear (cuBLAS, float32 logits; when the build has cuBLAS) -> sample (8-CTA clusters for two rows)
// Every run rewrites the same values: the residual is reset from a copy and the cache rows written are the same.
// The zeros written first make a kernel that reads the latent or the new cache rows too early see zeros, not the
// previous run's equal values.
class DecodeChain {
 public:
  static constexpr int64_t kSeqs = 2, kHeads = 16, kRank = 512, kDim = 576, kRope = 64, kPageSize = 16;
  static constexpr int64_t kProj = 256;  // W_UV's outputs a head: 16 heads x 256 rows take one wave of its kernel
  static constexpr int64_t kEmbedRows = 1000, kInter = kProj / 2, kVocab = 5003, kNope = 128, kQk = kNope + kRope;
  static constexpr int32_t kQueryRows = 300;

  explicit DecodeChain(Backend& b) : with_logits_(b.supports(OpKind::kLinear)) {
    Rng rng(2024);
    const std::vector<int32_t> context_lens = {300, 1500};
    int64_t used_pages = 0, max_needed = 0;
    for (int32_t ctx : context_lens) {
      used_pages += (ctx + kPageSize - 1) / kPageSize;
      max_needed = std::max<int64_t>(max_needed, (ctx + kPageSize - 1) / kPageSize);
    }
    const int64_t num_pages = used_pages + 3;
    const auto max_pages = static_cast<int32_t>(max_needed + 2);
    std::vector<int32_t> pool(static_cast<size_t>(num_pages));
    std::iota(pool.begin(), pool.end(), 0);
    rng.shuffle(pool);
    std::vector<int32_t> page_table(static_cast<size_t>(kSeqs * max_pages)), new_slots, positions;
    size_t next_page = 0;
    for (int64_t s = 0; s < kSeqs; ++s) {
      const int32_t ctx = context_lens[static_cast<size_t>(s)];
      const int64_t pages = (ctx + kPageSize - 1) / kPageSize;
      for (int64_t p = 0; p < max_pages; ++p) {
        page_table[static_cast<size_t>(s * max_pages + p)] =
            p < pages ? pool[next_page++] : (p % 2 == 0 ? -1 : static_cast<int32_t>(num_pages + 7));
      }
      const auto slot_of = [&](int32_t j) {
        return static_cast<int32_t>(page_table[static_cast<size_t>(s * max_pages + j / kPageSize)] * kPageSize +
                                    j % kPageSize);
      };
      new_slots.push_back(slot_of(ctx - 1));  // this step's token
      positions.push_back(ctx - 1);
    }
    // Queries: rows of a table, gathered anew every run (mla_prepare rotates their rope columns in place).
    std::vector<int32_t> query_rows;
    for (int64_t i = 0; i < kSeqs * kHeads; ++i) query_rows.push_back(rng.integer(0, kQueryRows - 1));
    std::vector<int32_t> token_ids(static_cast<size_t>(kSeqs));
    for (int32_t& id : token_ids) id = rng.integer(0, static_cast<int32_t>(kEmbedRows) - 1);
    const int32_t max_context = *std::max_element(context_lens.begin(), context_lens.end());

    const DType bf16 = DType::kBF16;
    cache_ = device_floats(b, {num_pages, kPageSize, kDim}, rng.uniform(num_pages * kPageSize * kDim), bf16);
    table_ = device_floats(b, {kEmbedRows, kDim}, rng.uniform(kEmbedRows * kDim), bf16);
    residual_start_ = device_floats(b, {kSeqs, kDim}, rng.uniform(kSeqs * kDim, -2.0f, 2.0f), bf16);
    norm_weight_ = device_floats(b, {kDim}, rng.uniform(kDim, 0.5f, 1.5f), DType::kF32);
    inv_freq_ = device_floats(b, {kRope / 2}, rope_inv_freq(kRope), DType::kF32);
    bias_ = device_floats(b, {kSeqs * kHeads, kInter}, rng.uniform(kSeqs * kHeads * kInter), bf16);
    out_norm_weight_ = device_floats(b, {kInter}, rng.uniform(kInter, 0.5f, 1.5f), DType::kF32);
    token_ids_ = device_ints(b, {kSeqs}, token_ids);
    positions_ = device_ints(b, {kSeqs}, positions);
    slots_ = device_ints(b, {kSeqs}, new_slots);
    query_rows_ = device_ints(b, {kSeqs * kHeads}, query_rows);
    query_start_ = device_ints(b, {kSeqs + 1}, {0, 1, 2});
    context_lens_ = device_ints(b, {kSeqs}, context_lens);
    page_table_ = device_ints(b, {kSeqs, max_pages}, page_table);
    meta_ = {.query_start = query_start_.cview(), .context_lens = context_lens_.cview(),
             .page_table = page_table_.cview(), .num_seqs = static_cast<int32_t>(kSeqs),
             .max_pages_per_seq = max_pages, .max_context_len = max_context,
             .total_context_len = std::accumulate(context_lens.begin(), context_lens.end(), int64_t{0})};

    zeros_ = device_floats(b, {kSeqs, kDim}, std::vector<float>(static_cast<size_t>(kSeqs * kDim), 0.0f), bf16);
    query_table_ = device_floats(b, {kQueryRows, kQk}, rng.uniform(kQueryRows * kQk), bf16);
    kv_a_norm_ = device_floats(b, {kRank}, rng.uniform(kRank, 0.5f, 1.5f), DType::kF32);
    const float uk_range = std::sqrt(3.0f / static_cast<float>(kNope));
    w_uk_ = device_floats(b, {kHeads, kRank, kNope}, rng.uniform(kHeads * kRank * kNope, -uk_range, uk_range), bf16);
    q_nope_rope_ = b.empty({kSeqs * kHeads, kQk}, bf16);
    const float uv_range = std::sqrt(3.0f / static_cast<float>(kRank));
    w_uv_ = device_floats(b, {kHeads, kProj, kRank}, rng.uniform(kHeads * kProj * kRank, -uv_range, uv_range), bf16);
    attention_latent_ = b.empty({kSeqs, kHeads, kRank}, bf16);
    residual_ = b.empty({kSeqs, kDim}, bf16);
    hidden_ = b.empty({kSeqs, kDim}, bf16);
    latent_ = b.empty({kSeqs, kDim}, bf16);
    q_ = b.empty({kSeqs * kHeads, kDim}, bf16);
    attention_ = b.empty({kSeqs, kHeads, kProj}, bf16);
    act_ = b.empty({kSeqs * kHeads, kInter}, bf16);
    normed_ = b.empty({kSeqs * kHeads, kInter}, bf16);
    if (with_logits_) {
      const float w_range = 1.0f / 64.0f;
      lm_head_ = device_floats(b, {kVocab, kHeads * kInter}, rng.uniform(kVocab * kHeads * kInter, -w_range, w_range),
                               bf16);
      logits_ = b.empty({kSeqs, kVocab}, DType::kF32);
      SamplingRow greedy{.temperature = 0.0f, .num_logprobs = 5};
      SamplingRow nucleus{.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = 7, .step = 3, .num_logprobs = 3};
      std::vector<int32_t> row_words(static_cast<size_t>(kSeqs * kSamplingRowWords));
      std::memcpy(row_words.data(), &greedy, sizeof greedy);
      std::memcpy(row_words.data() + kSamplingRowWords, &nucleus, sizeof nucleus);
      sampling_rows_ = device_ints(b, {kSeqs, kSamplingRowWords}, row_words);
      sampled_ = b.empty({kSeqs, kSampledTokenWords}, DType::kI32);
    }
  }

  // Queues the chain; `after_each_op` runs after every op is queued.
  void run(Backend& b, const std::function<void()>& after_each_op) const {
    const TensorView cache = cache_.view();
    const TensorView latent = latent_.view();
    b.copy_strided({.src = residual_start_.cview(), .dst = residual_.view()});
    after_each_op();
    b.copy_strided({.src = zeros_.cview(), .dst = latent});
    after_each_op();
    b.mla_cache_write({.latent = zeros_.cview(), .cache = cache, .slot_mapping = slots_.cview()});
    after_each_op();
    b.embedding({.token_ids = token_ids_.cview(), .table = table_.cview(), .out = hidden_.view()});
    after_each_op();
    b.add_rms_norm({.residual = residual_.view(), .x = hidden_.cview(), .weight = norm_weight_.cview(),
                    .out = latent, .eps = 1e-6f});
    after_each_op();
    b.gather_rows({.src = query_table_.cview(), .indices = query_rows_.cview(), .out = q_nope_rope_.view()});
    after_each_op();
    const TensorView q_heads = q_nope_rope_.view().reshaped({kSeqs, kHeads, kQk});
    const TensorView q_abs = q_.view().reshaped({kSeqs, kHeads, kDim});
    b.mla_prepare({.latent = latent, .q = q_heads, .q_abs = q_abs, .cache = cache, .slot_mapping = slots_.cview(),
                   .positions = positions_.cview(), .kv_a_norm = kv_a_norm_.cview(), .inv_freq = inv_freq_.cview(),
                   .kv_lora_rank = kRank});
    after_each_op();
    // The model's W_UK: it reads q_nope and writes q_abs's latent columns, neither of which mla_prepare touches.
    b.head_linear({.x = q_heads.columns(0, kNope), .w = w_uk_.cview(), .out = q_abs.columns(0, kRank),
                   .x_head_stride = kQk, .out_head_stride = kDim});
    after_each_op();
    b.mla_decode({.q = q_abs, .cache = cache, .out_latent = attention_latent_.view(), .meta = meta_,
                  .kv_lora_rank = kRank, .softmax_scale = 1.0f / std::sqrt(192.0f), .w_uv = w_uv_.cview(),
                  .out = attention_.view()});
    after_each_op();
    b.silu_mul({.gate_up = attention_.view().reshaped({kSeqs * kHeads, kProj}), .out = act_.view()});
    after_each_op();
    b.add({.x = act_.view(), .y = bias_.cview()});
    after_each_op();
    b.rms_norm({.x = act_.cview(), .weight = out_norm_weight_.cview(), .out = normed_.view(), .eps = 1e-6f});
    after_each_op();
    if (!with_logits_) return;
    b.linear({.x = normed_.view().reshaped({kSeqs, kHeads * kInter}), .w = lm_head_.cview(), .out = logits_.view()});
    after_each_op();
    b.sample({.logits = logits_.cview(), .rows = sampling_rows_.cview(), .out = sampled_.view()});
    after_each_op();
  }

  Results results(Backend& b) const {
    Results r = {{"residual", bytes_of(b, residual_.cview())},   {"latent", bytes_of(b, latent_.cview())},
                 {"cache", bytes_of(b, cache_.cview())},         {"q", bytes_of(b, q_.cview())},
                 {"attention", bytes_of(b, attention_.cview())}, {"act", bytes_of(b, act_.cview())},
                 {"q_nope_rope", bytes_of(b, q_nope_rope_.cview())},
                 {"normed", bytes_of(b, normed_.cview())}};
    if (with_logits_) {
      r.emplace_back("logits", bytes_of(b, logits_.cview()));
      r.emplace_back("sampled", bytes_of(b, sampled_.cview()));
    }
    return r;
  }

 private:
  bool with_logits_ = false;
  Tensor cache_, table_, residual_start_, norm_weight_, inv_freq_, bias_, out_norm_weight_, lm_head_;
  Tensor token_ids_, positions_, slots_, query_rows_, query_start_, context_lens_, page_table_, sampling_rows_;
  Tensor residual_, hidden_, latent_, q_, attention_, act_, normed_, logits_, sampled_, zeros_, query_table_;
  Tensor kv_a_norm_, w_uk_, q_nope_rope_;
  Tensor w_uv_, attention_latent_;  // attention_latent_: mla_decode's scratch, not a result
  AttentionMetadata meta_;
};

void expect_same_bytes(const Results& got, const Results& want, const std::string& run) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [name, bytes] = got[i];
    ASSERT_EQ(bytes.size(), want[i].second.size()) << run << ": " << name;
    const auto diff = std::mismatch(bytes.begin(), bytes.end(), want[i].second.begin());
    EXPECT_TRUE(diff.first == bytes.end()) << run << ": " << name << " differs first at byte "
                                           << (diff.first - bytes.begin()) << " of " << bytes.size();
  }
}

// The chain op by op (the reference), back to back, and from a captured graph, on `cuda`.
void run_chain(Backend& cuda) {
  const DecodeChain chain(cuda);
  chain.run(cuda, [] { CUDA_TRY(cudaDeviceSynchronize()); });
  const Results reference = chain.results(cuda);

  for (int i = 0; i < 3; ++i) {
    chain.run(cuda, [] {});
    expect_same_bytes(chain.results(cuda), reference, str_cat("eager run ", i));
  }

  const std::unique_ptr<StepGraph> graph = cuda.capture([&] { chain.run(cuda, [] {}); });
  ASSERT_NE(graph, nullptr);
  expect_same_bytes(chain.results(cuda), reference, "capture's eager run");
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(graph->replay());
    expect_same_bytes(chain.results(cuda), reference, str_cat("graph replay ", i));
  }
}

TEST(CudaDependentLaunch, ChainedOpsMatchTheSerializedRunEagerlyAndInAGraph) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  for (const bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "programmatic dependent launches" : "plain launches (CudaTuning::pdl off)");
    cuda::CudaTuning tuning = cuda::CudaTuning::from_env();
    tuning.pdl = pdl;
    run_chain(*make_cuda_backend(0, tuning));
  }
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
