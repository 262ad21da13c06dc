// Microbenchmark of the sampling kernel (ops/sample.h, csrc/backend/cuda/sample/sample.cu) at DeepSeek-V3's vocabulary
// (129280): rows N in {1, 32, 256} x {greedy, top_p 0.9 + top_k 50, top_p 0.95 at temperature 0.6, temperature
// only, greedy + 20 logprobs}. Prints microseconds per call and GB/s of logits read (N x V x 4 bytes) beside the
// device-to-device copy bandwidth measured in the same run (bytes read + written). Each timed call follows an
// untimed L2 flush; the median of 30 is reported. Before timing, the tokens of every configuration are checked
// against the CPU reference, and one call is captured in a CUDA graph and replayed (the op allocates nothing).
// usage: sample_bench [--json PATH] [--only CONFIG] [--rows N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/sample/sample.cuh"
#include "bench_util.cuh"

namespace deepinfer {
namespace {

using bench::read_flush;
using bench::time_ms;
using cuda::CudaStream;
using cuda::DeviceBuffer;

constexpr int64_t kVocab = 129280;


struct Config {
  const char* name;
  SamplingRow row;
};

const Config kConfigs[] = {
    {"greedy", {.temperature = 0.0f}},
    {"top_p0.9_top_k50", {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f}},
    {"top_p0.95_t0.6", {.temperature = 0.6f, .top_p = 0.95f}},
    {"temperature1", {.temperature = 1.0f}},
    {"greedy_logprobs20", {.temperature = 0.0f, .num_logprobs = 20}},
};

// Logits shaped like a model's: a bell of standard deviation ~2.3 and a few tokens far above it.
std::vector<float> model_like_logits(int64_t rows, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::uniform_int_distribution<int64_t> token(0, kVocab - 1);
  std::vector<float> l(static_cast<size_t>(rows * kVocab));
  for (float& v : l) v = u(rng) + u(rng) + u(rng) + u(rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < 12; ++j) l[static_cast<size_t>(r * kVocab + token(rng))] += 8.0f + 0.5f * j;
  }
  return l;
}

struct Result {
  std::string config;
  int64_t rows = 0;
  double us = 0.0, gbps = 0.0, copy_fraction = 0.0;
};

int run(int argc, char** argv) {
  std::string json_path, only;
  int64_t only_rows = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--only" && i + 1 < argc) only = argv[++i];  // one configuration (for a profiler)
    if (a == "--rows" && i + 1 < argc) only_rows = std::stoll(argv[++i]);
  }
  int device = 0, num_sms = 0;
  CUDA_TRY(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, num_sms, prop.l2CacheSize >> 20);
  CudaStream stream;
  std::mt19937_64 rng(20261129);

  constexpr int64_t kMaxRows = 256;
  const std::vector<float> logits = model_like_logits(kMaxRows, rng);
  DeviceBuffer d_logits(logits.size() * sizeof(float), stream.get());
  DeviceBuffer d_rows(kMaxRows * sizeof(SamplingRow), stream.get());
  DeviceBuffer d_out(kMaxRows * sizeof(SampledToken), stream.get());
  DeviceBuffer flush(size_t{256} << 20, stream.get());
  CUDA_TRY(cudaMemsetAsync(flush.data(), 0, flush.bytes(), stream.get()));
  CUDA_TRY(cudaMemcpyAsync(d_logits.data(), logits.data(), d_logits.bytes(), cudaMemcpyHostToDevice, stream.get()));

  const auto args_for = [&](int64_t rows, Device device_kind, const void* logits_ptr, const void* rows_ptr,
                            void* out_ptr) {
    return SampleArgs{.logits = {logits_ptr, DType::kF32, {rows, kVocab}, device_kind},
                      .rows = {rows_ptr, DType::kI32, {rows, kSamplingRowWords}, device_kind},
                      .out = {out_ptr, DType::kI32, {rows, kSampledTokenWords}, device_kind}};
  };
  const auto upload_rows = [&](const Config& c, int64_t rows) {
    std::vector<SamplingRow> host(static_cast<size_t>(rows), c.row);
    for (int64_t r = 0; r < rows; ++r) {
      host[r].seed = 1000 + static_cast<uint64_t>(r);
      host[r].step = static_cast<int32_t>(r);
    }
    CUDA_TRY(cudaMemcpyAsync(d_rows.data(), static_cast<const void*>(host.data()), rows * sizeof(SamplingRow),
                             cudaMemcpyHostToDevice, stream.get()));
    return host;
  };

  // 1. Correctness: every configuration at 256 rows against the CPU reference (tokens exact).
  bool all_pass = true;
  for (const Config& c : kConfigs) {
    const std::vector<SamplingRow> host_rows = upload_rows(c, kMaxRows);
    const SampleArgs device_args = args_for(kMaxRows, Device::kCuda, d_logits.data(), d_rows.data(), d_out.data());
    device_args.validate();
    cuda::sample(device_args, {stream.get()});
    std::vector<SampledToken> got(kMaxRows), want(kMaxRows);
    CUDA_TRY(cudaMemcpyAsync(static_cast<void*>(got.data()), d_out.data(), d_out.bytes(), cudaMemcpyDeviceToHost,
                             stream.get()));
    stream.synchronize();
    cpu::sample(args_for(kMaxRows, Device::kCpu, logits.data(), host_rows.data(), want.data()));
    int mismatches = 0;
    for (int64_t r = 0; r < kMaxRows; ++r) mismatches += got[r].token != want[r].token;
    std::printf("check %-20s %3d of %lld tokens differ from the CPU reference\n", c.name, mismatches,
                static_cast<long long>(kMaxRows));
    all_pass = all_pass && mismatches == 0;
  }
  // The op inside a CUDA graph: captured once, replayed, the same tokens.
  {
    const std::vector<SamplingRow> host_rows = upload_rows(kConfigs[1], 32);
    const SampleArgs a = args_for(32, Device::kCuda, d_logits.data(), d_rows.data(), d_out.data());
    cuda::sample(a, {stream.get()});
    std::vector<SampledToken> eager(32), replayed(32);
    CUDA_TRY(cudaMemcpyAsync(static_cast<void*>(eager.data()), d_out.data(), 32 * sizeof(SampledToken),
                             cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_TRY(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
    cuda::sample(a, {stream.get()});
    CUDA_TRY(cudaStreamEndCapture(stream.get(), &graph));
    CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_TRY(cudaMemsetAsync(d_out.data(), 0, d_out.bytes(), stream.get()));
    CUDA_TRY(cudaGraphLaunch(exec, stream.get()));
    CUDA_TRY(cudaMemcpyAsync(static_cast<void*>(replayed.data()), d_out.data(), 32 * sizeof(SampledToken),
                             cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    CUDA_TRY(cudaGraphExecDestroy(exec));
    CUDA_TRY(cudaGraphDestroy(graph));
    const bool same = std::memcmp(eager.data(), replayed.data(), 32 * sizeof(SampledToken)) == 0;
    std::printf("graph capture and replay: %s\n", same ? "same tokens" : "DIFFERENT tokens");
    all_pass = all_pass && same;
  }
  std::printf("correctness: %s\n", all_pass ? "all pass" : "FAILURES");

  // 2. Ceiling: device-to-device copy bandwidth (bytes read + written).
  double copy_gbps = 0.0;
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer src(bytes, stream.get()), dst(bytes, stream.get());
    CUDA_TRY(cudaMemsetAsync(src.data(), 1, bytes, stream.get()));
    const double ms = time_ms(stream.get(), 2, 10, [&] {
      CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
    }, [] {});
    copy_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
    std::printf("copy bandwidth: %.0f GB/s (2 GiB device-to-device, %.3f ms)\n", copy_gbps, ms);
  }

  // 3. Timings.
  const auto flush_l2 = [&] {
    read_flush<<<4 * num_sms, 512, 0, stream.get()>>>(flush.as<int4>(), static_cast<int64_t>(flush.bytes() / 16),
                                                      flush.as<int>());
  };
  std::vector<Result> results;
  for (const Config& c : kConfigs) {
    for (const int64_t rows : {int64_t{1}, int64_t{32}, int64_t{256}}) {
      if ((!only.empty() && only != c.name) || (only_rows != 0 && only_rows != rows)) continue;
      upload_rows(c, rows);
      const SampleArgs a = args_for(rows, Device::kCuda, d_logits.data(), d_rows.data(), d_out.data());
      const double ms = time_ms(stream.get(), 3, 30, [&] { cuda::sample(a, {stream.get()}); }, flush_l2);
      const double gbps = static_cast<double>(rows) * kVocab * sizeof(float) / (ms * 1e-3) / 1e9;
      results.push_back({.config = c.name, .rows = rows, .us = ms * 1e3, .gbps = gbps,
                         .copy_fraction = gbps / copy_gbps});
      std::printf("perf %-20s N %4lld V %lld %9.1f us  %7.0f GB/s  %5.1f%% of copy\n", c.name,
                  static_cast<long long>(rows), static_cast<long long>(kVocab), ms * 1e3, gbps, 100.0 * gbps / copy_gbps);
      std::fflush(stdout);
    }
  }

  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "{\n  \"benchmark\": \"sample\",\n  \"gpu\": \"%s\",\n  \"num_sms\": %d,\n",
                   bench::json_escape(prop.name).c_str(), num_sms);
      std::fprintf(f, "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"command\": \"%s\",\n",
                   bench::json_escape(bench::env_or("BENCH_COMMIT", "unknown")).c_str(),
                   bench::json_escape(bench::env_or("BENCH_DATE", "unknown")).c_str(),
                   bench::json_escape(bench::env_or("BENCH_COMMAND", "sample_bench")).c_str());
      std::fprintf(f, "  \"vocab\": %lld,\n  \"copy_bandwidth_gbps\": %.1f,\n  \"correctness_pass\": %s,\n",
                   static_cast<long long>(kVocab), copy_gbps, all_pass ? "true" : "false");
      std::fprintf(f, "  \"perf\": [\n");
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        std::fprintf(f, "    {\"config\": \"%s\", \"rows\": %lld, \"us\": %.2f, \"gbps\": %.1f, \"copy_fraction\": %.4f}%s\n",
                     r.config.c_str(), static_cast<long long>(r.rows), r.us, r.gbps, r.copy_fraction,
                     i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
      std::printf("wrote %s\n", json_path.c_str());
    }
  }
  return all_pass ? 0 : 1;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  try {
    return deepinfer::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
