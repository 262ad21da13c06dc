// Achieved bandwidth and TFLOP/s of the CUDA backend's ops at model sizes, beside a device-to-device copy measured in
// the same run: DeepSeek-V3-sized elementwise ops, norms and GEMMs, and the MLA prefill paths. Disabled in normal
// runs (the GPU script passes --gtest_also_run_disabled_tests); they fail without a GPU.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/mla/mla_prefill.cuh"
#include "core/error.h"
#include "device_memory.h"

namespace deepinfer::op_test {
namespace {

// Achieved bandwidth (and GEMM TFLOP/s) of each op at DeepSeek-V3 sizes, beside a device-to-device copy measured in
// the same run. Disabled in normal runs: the GPU script passes --gtest_also_run_disabled_tests. The backend's stream
// is its own, so each figure is host time over `kIters` queued launches after a full synchronization: launch cost is
// hidden as long as one kernel outlasts one launch (tens of microseconds here).

class PerfRunner {
 public:
  static constexpr int kWarmup = 3;
  static constexpr int kIters = 20;

  // Device memory filled with 0x3c bytes (bf16 and fp32 values near 0.0115).
  TensorView tensor(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    void* data = memory_.allocate(bytes);
    CUDA_TRY(cudaMemset(data, 0x3c, bytes));
    return {data, dtype, shape, Device::kCuda};
  }

  // Seconds per call of `op`.
  template <typename F>
  double time(F&& op) {
    for (int i = 0; i < kWarmup; ++i) op();
    CUDA_TRY(cudaDeviceSynchronize());
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) op();
    CUDA_TRY(cudaDeviceSynchronize());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kIters;
  }

  void report(const std::string& what, double seconds, double bytes, double flops = 0.0) {
    std::string line = str_cat(what, ": ", seconds * 1e6, " us, ", bytes / seconds / 1e9, " GB/s");
    if (copy_gbs_ > 0) line += str_cat(" (", 100.0 * bytes / seconds / 1e9 / copy_gbs_, "% of copy)");
    if (flops > 0) line += str_cat(", ", flops / seconds / 1e12, " TFLOP/s");
    std::printf("[ perf     ] %s\n", line.c_str());
  }

  void set_copy_gbs(double gbs) { copy_gbs_ = gbs; }

 private:
  DeviceMemory memory_;
  double copy_gbs_ = 0.0;
};

TEST(CudaBackendPerf, DISABLED_OpsAtModelSizes) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  PerfRunner perf;
  constexpr DType kBf16 = DType::kBF16;
  const int64_t tokens = 4096, hidden = 7168;
  {
    const size_t bytes = size_t{1} << 30;
    const TensorView a = perf.tensor({static_cast<int64_t>(bytes)}, DType::kF8E4M3);
    const TensorView b = perf.tensor({static_cast<int64_t>(bytes)}, DType::kF8E4M3);
    const double s = perf.time([&] { CUDA_TRY(cudaMemcpyAsync(b.data, a.data, bytes, cudaMemcpyDeviceToDevice)); });
    perf.report("device-to-device copy 1 GiB (read + write)", s, 2.0 * bytes);
    perf.set_copy_gbs(2.0 * bytes / s / 1e9);
  }
  {
    const TensorView x = perf.tensor({tokens, hidden}, kBf16), y = perf.tensor({tokens, hidden}, kBf16);
    perf.report("add bf16 [4096, 7168]", perf.time([&] { cuda->add({.x = x, .y = y}); }), 3.0 * x.bytes());
  }
  {
    const int64_t inter = 18432;
    const TensorView gate_up = perf.tensor({tokens, 2 * inter}, kBf16), out = perf.tensor({tokens, inter}, kBf16);
    perf.report("silu_mul bf16 [4096, 2 x 18432]", perf.time([&] { cuda->silu_mul({.gate_up = gate_up, .out = out}); }),
                double(gate_up.bytes() + out.bytes()));
  }
  {
    const TensorView res = perf.tensor({tokens, hidden}, kBf16), x = perf.tensor({tokens, hidden}, kBf16);
    const TensorView out = perf.tensor({tokens, hidden}, kBf16), w = perf.tensor({hidden}, DType::kF32);
    perf.report("add_rms_norm bf16 [4096, 7168]", perf.time([&] {
      cuda->add_rms_norm({.residual = res, .x = x, .weight = w, .out = out});
    }), 4.0 * x.bytes());
    perf.report("rms_norm bf16 [4096, 7168]", perf.time([&] { cuda->rms_norm({.x = x, .weight = w, .out = out}); }),
                2.0 * x.bytes());
    for (const int64_t rows : {int64_t{1}, int64_t{64}}) {
      const TensorView r1 = res.rows(0, rows), x1 = x.rows(0, rows), o1 = out.rows(0, rows);
      perf.report(str_cat("add_rms_norm bf16 [", rows, ", 7168] (launch-bound)"), perf.time([&] {
        cuda->add_rms_norm({.residual = r1, .x = x1, .weight = w, .out = o1});
      }), 4.0 * x1.bytes());
    }
  }
  {
    const int64_t vocab = 32768;
    const TensorView table = perf.tensor({vocab, hidden}, kBf16), out = perf.tensor({tokens, hidden}, kBf16);
    std::vector<int32_t> host_ids(static_cast<size_t>(tokens));
    for (size_t i = 0; i < host_ids.size(); ++i) host_ids[i] = static_cast<int32_t>((i * 7919) % vocab);
    const TensorView ids = perf.tensor({tokens}, DType::kI32);
    CUDA_TRY(cudaMemcpy(ids.data, host_ids.data(), tokens * 4, cudaMemcpyHostToDevice));
    perf.report("embedding bf16 4096 tokens x 7168",
                perf.time([&] { cuda->embedding({.token_ids = ids, .table = table, .out = out}); }),
                2.0 * out.bytes());
  }
  {
    const int64_t cached = 16384, page_size = 64, pages = 2 * cached / page_size;
    const TensorView latent = perf.tensor({cached, 576}, kBf16), cache = perf.tensor({pages, page_size, 576}, kBf16);
    std::vector<int32_t> host_slots(static_cast<size_t>(cached));
    for (size_t i = 0; i < host_slots.size(); ++i) host_slots[i] = static_cast<int32_t>(2 * i);
    const TensorView slots = perf.tensor({cached}, DType::kI32);
    CUDA_TRY(cudaMemcpy(slots.data, host_slots.data(), cached * 4, cudaMemcpyHostToDevice));
    perf.report("mla_cache_write bf16 16384 rows x 576",
                perf.time([&] { cuda->mla_cache_write({.latent = latent, .cache = cache, .slot_mapping = slots}); }),
                2.0 * latent.bytes());
  }
  {
    // q of V3 prefill: [4096, 128 heads, 192], the last 64 of each head rotated.
    const int64_t heads = 128;
    const TensorView q = perf.tensor({tokens, heads, 192}, kBf16);
    std::vector<int32_t> host_positions(static_cast<size_t>(tokens));
    std::iota(host_positions.begin(), host_positions.end(), 0);
    const TensorView positions = perf.tensor({tokens}, DType::kI32);
    CUDA_TRY(cudaMemcpy(positions.data, host_positions.data(), tokens * 4, cudaMemcpyHostToDevice));
    const TensorView inv_freq = perf.tensor({32}, DType::kF32);
    perf.report("rope bf16 q [4096, 128, 192] rot 64", perf.time([&] {
      cuda->rope({.x = q.reshaped({tokens, heads * 192}).columns(128, 64).data, .dtype = kBf16,
                  .device = Device::kCuda, .num_heads = heads, .rot_dim = 64, .token_stride = heads * 192,
                  .head_stride = 192, .positions = positions, .inv_freq = inv_freq});
    }), 2.0 * tokens * heads * 64 * 2);
  }
  // mla_prepare at V3 dims: a decode step of 64 tokens (all into q_abs) and a 4096-token prefill. Bytes: the latent
  // row read, written back and written to the cache; q_pe read and written; q_abs's rope columns written.
  using TokenCounts = std::pair<int64_t, int64_t>;
  for (const auto& [num_tokens, num_decode] : {TokenCounts{64, 64}, TokenCounts{4096, 0}}) {
    const int64_t heads = 128, pages = num_tokens / 64 + 1;
    const TensorView latent = perf.tensor({num_tokens, 576}, kBf16);
    const TensorView q = perf.tensor({num_tokens, heads, 192}, kBf16);
    const TensorView q_abs = num_decode > 0 ? perf.tensor({num_decode, heads, 576}, kBf16) : TensorView{};
    const TensorView cache = perf.tensor({pages, 64, 576}, kBf16);
    std::vector<int32_t> host_index(static_cast<size_t>(num_tokens));
    std::iota(host_index.begin(), host_index.end(), 0);
    const TensorView index = perf.tensor({num_tokens}, DType::kI32);  // positions and slots alike
    CUDA_TRY(cudaMemcpy(index.data, host_index.data(), num_tokens * 4, cudaMemcpyHostToDevice));
    const TensorView norm = perf.tensor({512}, DType::kF32), inv_freq = perf.tensor({32}, DType::kF32);
    const double bytes = 2.0 * (3.0 * num_tokens * 576 + 2.0 * num_tokens * heads * 64 + num_decode * heads * 64);
    perf.report(str_cat("mla_prepare bf16 V3 ", num_tokens, " tokens (", num_decode, " decode)"), perf.time([&] {
      cuda->mla_prepare({.latent = latent, .q = q, .q_abs = q_abs, .cache = cache, .slot_mapping = index,
                         .positions = index, .kv_a_norm = norm, .inv_freq = inv_freq, .kv_lora_rank = 512});
    }), bytes);
  }
#ifdef DEEPINFER_HAVE_CUBLAS
  for (const int64_t m : {int64_t{1}, int64_t{64}, int64_t{4096}}) {
    const TensorView x = perf.tensor({m, hidden}, kBf16), w = perf.tensor({hidden, hidden}, kBf16);
    const TensorView out = perf.tensor({m, hidden}, kBf16);
    perf.report(str_cat("linear bf16 ", m, " x 7168 x 7168"), perf.time([&] { cuda->linear({.x = x, .w = w, .out = out}); }),
                double(x.bytes() + w.bytes() + out.bytes()), 2.0 * m * hidden * hidden);
  }
  {
    const int64_t heads = 128, t = 64;  // q_nope [64, 128, 128] · W_UK [128, 512, 128]^T
    const TensorView x = perf.tensor({t, heads, 128}, kBf16), w = perf.tensor({heads, 512, 128}, kBf16);
    const TensorView out = perf.tensor({t, heads, 512}, kBf16);
    perf.report("head_linear bf16 64 tokens x 128 heads x 128 -> 512",
                perf.time([&] { cuda->head_linear({.x = x, .w = w, .out = out}); }),
                double(x.bytes() + w.bytes() + out.bytes()), 2.0 * t * heads * 128 * 512);
  }
#endif
}

// MLA prefill at V2-Lite (16 heads) and V3 (128 heads) dims, full prompts of 1 x 4096, 4 x 1024 and 1 x 8192 tokens in
// 64-token pages, through both attention kernels (CudaTuning::mla_prefill_kernel: wgmma, the default, and mma): the
// whole op (gather, decompression GEMM and causal attention) on a backend made with each, then the attention kernel
// alone (cuda::mla_prefill_attention on a filled workspace). FLOPs: the decompression GEMM (2 * rows * H * 256 * 512)
// plus the causal attention (2 * (192 + 128) per visible (query, key) pair and head).
TEST(CudaBackendPerf, DISABLED_MlaPrefill) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  struct Path {
    const char* name;
    cuda::MlaPrefillKernel kernel;
    std::unique_ptr<Backend> backend;
  };
  Path paths[2] = {{.name = "mma", .kernel = cuda::MlaPrefillKernel::kMma, .backend = nullptr},
                   {.name = "wgmma", .kernel = cuda::MlaPrefillKernel::kWgmma, .backend = nullptr}};
  for (Path& path : paths) {
    cuda::CudaTuning tuning = cuda::CudaTuning::from_env();
    tuning.mla_prefill_kernel = path.kernel;
    path.backend = make_cuda_backend(0, tuning);
  }
  if (!paths[0].backend->supports(OpKind::kMlaPrefill)) GTEST_SKIP() << "mla_prefill needs cuBLAS";
  PerfRunner perf;
  const cuda::CudaStream stream;
  constexpr DType kBf16 = DType::kBF16;
  constexpr int64_t kPage = 64;
  using Prompts = std::pair<int32_t, int32_t>;  // sequences, tokens each
  for (const int64_t heads : {int64_t{16}, int64_t{128}}) {
    for (const auto& [seqs, len] : {Prompts{1, 4096}, Prompts{4, 1024}, Prompts{1, 8192}}) {
      const int64_t tokens = int64_t{seqs} * len, pages_per_seq = len / kPage;
      const TensorView cache = perf.tensor({seqs * pages_per_seq, kPage, 576}, kBf16);
      const TensorView q = perf.tensor({tokens, heads, 192}, kBf16);
      const TensorView kv_b = perf.tensor({heads * 256, 512}, kBf16);
      const TensorView out = perf.tensor({tokens, heads, 128}, kBf16);
      const TensorView latents = perf.tensor({tokens, 576}, kBf16);     // the attention kernel's own inputs
      const TensorView kv = perf.tensor({tokens, heads * 256}, kBf16);
      std::vector<int32_t> starts(static_cast<size_t>(seqs) + 1), lens(static_cast<size_t>(seqs), len);
      std::vector<int32_t> table(static_cast<size_t>(seqs * pages_per_seq));
      for (int32_t s = 0; s <= seqs; ++s) starts[s] = s * len;
      std::iota(table.begin(), table.end(), 0);
      const TensorView d_starts = perf.tensor({seqs + 1}, DType::kI32), d_lens = perf.tensor({seqs}, DType::kI32);
      const TensorView d_table = perf.tensor({seqs, pages_per_seq}, DType::kI32);
      CUDA_TRY(cudaMemcpy(d_starts.data, starts.data(), d_starts.bytes(), cudaMemcpyHostToDevice));
      CUDA_TRY(cudaMemcpy(d_lens.data, lens.data(), d_lens.bytes(), cudaMemcpyHostToDevice));
      CUDA_TRY(cudaMemcpy(d_table.data, table.data(), d_table.bytes(), cudaMemcpyHostToDevice));
      const AttentionMetadata meta{.query_start = d_starts, .context_lens = d_lens, .page_table = d_table,
                                   .num_seqs = seqs, .max_pages_per_seq = static_cast<int32_t>(pages_per_seq),
                                   .max_context_len = len};
      const double attention_flops = double(heads) * seqs * (double(len) * (len + 1) / 2) * 2.0 * (192 + 128);
      const double gemm_flops = 2.0 * tokens * heads * 256 * 512;
      for (const Path& path : paths) {
        const double seconds = perf.time([&] {
          path.backend->mla_prefill({.q = q, .cache = cache, .kv_b = kv_b, .out = out, .meta = meta,
                                     .kv_lora_rank = 512, .qk_nope_head_dim = 128, .v_head_dim = 128,
                                     .softmax_scale = 0.07f});
        });
        perf.report(str_cat("mla_prefill bf16 [", path.name, "] ", heads, " heads, ", seqs, " x ", len,
                            " tokens (attention ", attention_flops / seconds / 1e12, " TFLOP/s of the total time)"),
                    seconds, double(q.bytes() + out.bytes() + cache.bytes()), attention_flops + gemm_flops);
        const double attention_seconds = perf.time([&] {
          cuda::mla_prefill_attention({.q = q.as<uint16_t>(), .latents = latents.as<uint16_t>(),
                                       .kv = kv.as<uint16_t>(), .context_lens = d_lens.as<int32_t>(),
                                       .query_start = d_starts.as<int32_t>(), .out = out.as<uint16_t>(),
                                       .num_seqs = seqs, .num_heads = static_cast<int32_t>(heads),
                                       .max_context_len = len, .max_queries = len, .softmax_scale = 0.07f,
                                       .kernel = path.kernel},
                                      {stream.get()});
        });
        perf.report(str_cat("  attention kernel alone [", path.name, "]"), attention_seconds,
                    double(q.bytes() + out.bytes() + kv.bytes() + latents.bytes()), attention_flops);
      }
    }
  }
}
}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
