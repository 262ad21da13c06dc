// The FP8 skinny GEMM (csrc/backend/cuda/gemm/fp8_skinny_gemm.cu) alone, without the engine or its test binary: a
// check of its sums against a double-precision host reference, then its time at DeepSeek-V3's decode shapes beside
// the device-to-device copy. Built and run by benchmarks/gpu/run_fp8_skinny.sh (nvcc, no other dependency), so a
// kernel change is measured in a minute of GPU time.
//
// Timing as the backend's perf test (tests/cpp/cuda_gemm_perf_test.cpp): one CUDA graph of kCalls calls, each on its
// own copy of the weights (copies cycled past the 50-60 MB L2, so the weights stream from HBM as in a decode step),
// replayed kReplays times after a warm-up replay; host time around synchronized replays, per call. The calls are what
// the backend queues for one product: the activations' rescale and the GEMM.
//
// Bytes of a case: codes + scales + x (bf16) + out (bf16). Output: a line a case and a JSON file (--json PATH).
// --shape TEXT and --m M time only the shapes whose name holds TEXT and that token count (for a profiler). --int4
// times the INT4 skinny GEMM (int4_skinny_gemm.cu) at the same shapes instead, g128 with zero points as AWQ and GPTQ
// checkpoints of DeepSeek-V3 store them (no check: tests/cpp/cuda_int4_gemm_test.cpp holds its correctness).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "backend/cuda/gemm/fp8_skinny_gemm.cuh"
#include "backend/cuda/gemm/int4_skinny_gemm.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/fp8.h"

namespace {

using deepinfer::cuda::Fp8SkinnyGemmParams;
using deepinfer::cuda::Fp8SkinnyProblem;
using deepinfer::cuda::LaunchStream;
using deepinfer::cuda::SkinnyEpilogue;

constexpr int kCalls = 20;
constexpr int kReplays = 10;
constexpr size_t kColdBytes = size_t{256} << 20;

int64_t blocks(int64_t n) { return (n + 127) / 128; }

struct DeviceArray {
  void* data = nullptr;
  explicit DeviceArray(size_t bytes) { CUDA_TRY(cudaMalloc(&data, std::max<size_t>(bytes, 16))); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : data(o.data) { o.data = nullptr; }
  ~DeviceArray() {
    if (data != nullptr) cudaFree(data);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

template <typename T>
DeviceArray upload(const std::vector<T>& host) {
  DeviceArray d(host.size() * sizeof(T));
  CUDA_TRY(cudaMemcpy(d.data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

uint16_t bf16_bits(float v) {
  uint32_t u = 0;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float v = 0.0f;
  std::memcpy(&v, &u, 4);
  return v;
}

// One weight matrix: random finite e4m3 codes and random positive block scales.
struct Fp8Matrix {
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  static Fp8Matrix random(int64_t rows, int64_t k, std::mt19937& rng) {
    Fp8Matrix m{.rows = rows, .k = k, .codes = std::vector<uint8_t>(static_cast<size_t>(rows * k)),
                .scales = std::vector<float>(static_cast<size_t>(blocks(rows) * blocks(k)))};
    std::uniform_int_distribution<int> code(0, 255);
    for (uint8_t& c : m.codes) {
      c = static_cast<uint8_t>(code(rng));
      if ((c & 0x7f) == 0x7f) c = 0;  // no NaN codes
    }
    std::uniform_real_distribution<float> scale(0.5e-3f, 2e-3f);
    for (float& s : m.scales) s = scale(rng);
    return m;
  }
  double value(int64_t r, int64_t c) const {
    return double{deepinfer::e4m3_to_float(codes[static_cast<size_t>(r * k + c)])} *
           scales[static_cast<size_t>((r / 128) * blocks(k) + c / 128)];
  }
};

// The buffers the backend gives the kernel for its rescaled activations.
struct Scratch {
  DeviceArray x_f16, unscale;
  Scratch(int64_t tokens, int64_t k) : x_f16(static_cast<size_t>(tokens * k) * 2), unscale(tokens * sizeof(float)) {}
};

Fp8SkinnyGemmParams params(const uint16_t* x, int64_t tokens, int64_t k, const Scratch& scratch) {
  return {.x = x, .tokens = tokens, .k_dim = k, .x_row_stride = k, .num_problems = 0, .problems = {},
          .x_f16 = scratch.x_f16.as<uint16_t>(), .x_unscale = scratch.unscale.as<float>(), .num_sms = 0};
}

int num_sms() {
  int device = 0, sms = 0;
  CUDA_TRY(cudaGetDevice(&device));
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// max |got - ref| / max |ref| of one product (kStore, or kSiluMul over [gate; up]) against the host in double.
double check_case(int64_t tokens, int64_t n_out, int64_t k, bool silu_mul, std::mt19937& rng) {
  const int64_t rows = silu_mul ? 2 * n_out : n_out;
  const Fp8Matrix w = Fp8Matrix::random(rows, k, rng);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<uint16_t> x(static_cast<size_t>(tokens * k));
  for (uint16_t& v : x) v = bf16_bits(value(rng));
  const DeviceArray d_x = upload(x), d_codes = upload(w.codes), d_scales = upload(w.scales);
  const DeviceArray d_out(static_cast<size_t>(tokens * n_out) * sizeof(float));
  const Scratch scratch(tokens, k);
  Fp8SkinnyGemmParams p = params(d_x.as<uint16_t>(), tokens, k, scratch);
  p.num_problems = 1;
  p.num_sms = num_sms();
  p.problems[0] = {.w = d_codes.as<uint8_t>(), .scale_inv = d_scales.as<float>(), .out = d_out.data, .n_out = n_out,
                   .out_row_stride = n_out, .epilogue = silu_mul ? SkinnyEpilogue::kSiluMul : SkinnyEpilogue::kStore,
                   .out_f32 = true};
  deepinfer::cuda::fp8_skinny_gemm(p, LaunchStream{.handle = nullptr, .pdl = true});
  CUDA_TRY(cudaDeviceSynchronize());
  std::vector<float> got(static_cast<size_t>(tokens * n_out));
  CUDA_TRY(cudaMemcpy(got.data(), d_out.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double max_ref = 0.0, max_err = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t n = 0; n < n_out; ++n) {
      const auto dot = [&](int64_t r) {
        double s = 0.0;
        for (int64_t c = 0; c < k; ++c) s += w.value(r, c) * bf16_value(x[static_cast<size_t>(t * k + c)]);
        return s;
      };
      double ref = dot(n);
      if (silu_mul) ref = ref / (1.0 + std::exp(-ref)) * dot(n + n_out);
      max_ref = std::max(max_ref, std::abs(ref));
      max_err = std::max(max_err, std::abs(ref - got[static_cast<size_t>(t * n_out + n)]));
    }
  }
  return max_err / std::max(max_ref, 1e-30);
}

double copy_gbs() {
  const size_t bytes = size_t{1} << 30;
  DeviceArray a(bytes), b(bytes);
  double best = 0.0;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CUDA_TRY(cudaMemcpy(b.data, a.data, bytes, cudaMemcpyDeviceToDevice));
    CUDA_TRY(cudaDeviceSynchronize());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

struct Shape {
  const char* name;
  std::vector<int64_t> rows;  // one per product
  int64_t k;
  bool silu_mul = false;
};

// Seconds per call of `calls` (call i on weight copy i % copies), recorded in one graph.
template <typename Call>
double time_graph(cudaStream_t stream, Call call) {
  cudaGraph_t graph = nullptr;
  CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) call(i);
  CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_TRY(cudaGraphLaunch(exec, stream));
  CUDA_TRY(cudaStreamSynchronize(stream));
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kReplays; ++r) CUDA_TRY(cudaGraphLaunch(exec, stream));
  CUDA_TRY(cudaStreamSynchronize(stream));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CUDA_TRY(cudaGraphExecDestroy(exec));
  CUDA_TRY(cudaGraphDestroy(graph));
  return s / (kReplays * kCalls);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only_shape;
  int64_t only_m = 0;
  bool int4 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) only_shape = argv[++i];
    if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) only_m = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--int4") == 0) int4 = true;
  }
  std::mt19937 rng(12345);
  int failures = 0;
  std::string json = std::string("{\"bench\": \"") + (int4 ? "int4_skinny" : "fp8_skinny") + "\", \"commit\": \"" +
                     deepinfer::bench::json_escape(deepinfer::bench::env_or("BENCH_COMMIT", "unknown")) +
                     "\", \"date\": \"" + deepinfer::bench::env_or("BENCH_DATE", "") + "\", \"checks\": [";
  // Odd token counts, a gated product whose halves straddle a 128-row scale block, several K blocks.
  struct Check {
    int64_t tokens, n_out, k;
    bool silu_mul;
  };
  bool first = true;
  for (const Check& c : {Check{1, 320, 1024, false}, Check{5, 320, 1024, false}, Check{13, 200, 640, true},
                         Check{37, 96, 1024, false}, Check{64, 160, 768, true}}) {
    const double rel = check_case(c.tokens, c.n_out, c.k, c.silu_mul, rng);
    const bool ok = rel <= 1e-4;  // fp32 outputs: only the summation order differs from the reference
    failures += ok ? 0 : 1;
    std::printf("check tokens %-3lld n_out %-4lld K %-5lld %-8s max|diff|/max|ref| %.2e %s\n",
                static_cast<long long>(c.tokens), static_cast<long long>(c.n_out), static_cast<long long>(c.k),
                c.silu_mul ? "silu_mul" : "store", rel, ok ? "ok" : "FAILED");
    json += std::string(first ? "" : ", ") + "{\"tokens\": " + std::to_string(c.tokens) + ", \"n_out\": " +
            std::to_string(c.n_out) + ", \"k\": " + std::to_string(c.k) + ", \"silu_mul\": " +
            (c.silu_mul ? "true" : "false") + ", \"rel_err\": " + std::to_string(rel) + "}";
    first = false;
  }
  const double copy = copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s\n", copy);
  json += "], \"copy_gbs\": " + std::to_string(copy) + ", \"cases\": [";

  cudaStream_t stream = nullptr;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<Shape> shapes = {
      {"v3 q_a + kv_a", {1536, 576}, 7168},        {"v3 q_b_proj", {24576}, 1536},
      {"v3 o_proj", {7168}, 16384},                {"v3 dense gate_up+silu", {2 * 18432}, 7168, true},
      {"v3 dense down", {7168}, 18432},
  };
  first = true;
  for (const Shape& s : shapes) {
    if (!only_shape.empty() && std::string(s.name).find(only_shape) == std::string::npos) continue;
    constexpr int64_t kGroup = 128;
    const auto int4_bytes = [&](int64_t r) {
      return r * s.k / 2 + r * (s.k / kGroup) * 4 + r * ((s.k / kGroup + 7) / 8) * 4;
    };
    int64_t w_bytes = 0;
    for (const int64_t r : s.rows) w_bytes += int4 ? int4_bytes(r) : r * s.k + blocks(r) * blocks(s.k) * 4;
    const int copies = static_cast<int>(std::min<int64_t>(kCalls, std::max<int64_t>(1, kColdBytes / w_bytes + 1)));
    std::vector<DeviceArray> codes, scales, zeros;
    for (int c = 0; c < copies; ++c) {
      for (const int64_t r : s.rows) {
        const size_t code_bytes = static_cast<size_t>(int4 ? r * s.k / 2 : r * s.k);
        const size_t scale_bytes = static_cast<size_t>(int4 ? r * (s.k / kGroup) : blocks(r) * blocks(s.k)) * 4;
        codes.emplace_back(code_bytes);
        CUDA_TRY(cudaMemset(codes.back().data, 0x3c, code_bytes));  // e4m3 1.5; INT4 codes 12 and 3
        scales.emplace_back(scale_bytes);
        CUDA_TRY(cudaMemset(scales.back().data, 0, scale_bytes));
        const size_t zero_bytes = static_cast<size_t>(r * ((s.k / kGroup + 7) / 8)) * 4;
        zeros.emplace_back(zero_bytes);
        CUDA_TRY(cudaMemset(zeros.back().data, 0x88, zero_bytes));
      }
    }
    for (const int64_t m : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      if (only_m != 0 && m != only_m) continue;
      const DeviceArray x(static_cast<size_t>(m * s.k) * 2);
      CUDA_TRY(cudaMemset(x.data, 0, static_cast<size_t>(m * s.k) * 2));
      const Scratch scratch(m, s.k);
      std::vector<DeviceArray> outs;
      int64_t io_bytes = m * s.k * 2;
      for (const int64_t r : s.rows) {
        const int64_t n_out = s.silu_mul ? r / 2 : r;
        outs.emplace_back(static_cast<size_t>(m * n_out) * 2);
        io_bytes += m * n_out * 2;
      }
      const double t = int4 ? time_graph(stream, [&](int call) {
        const int c = call % copies;
        deepinfer::cuda::Int4SkinnyGemmParams p{.x = x.as<uint16_t>(), .tokens = m, .k_dim = s.k, .x_row_stride = s.k,
                                                .num_problems = static_cast<int>(s.rows.size()), .num_sms = num_sms()};
        for (size_t i = 0; i < s.rows.size(); ++i) {
          const size_t w = static_cast<size_t>(c) * s.rows.size() + i;
          p.problems[i] = {.w = codes[w].as<uint32_t>(), .scales = scales[w].as<float>(),
                           .zeros = zeros[w].as<int32_t>(), .out = outs[i].data,
                           .n_out = s.silu_mul ? s.rows[i] / 2 : s.rows[i],
                           .out_row_stride = s.silu_mul ? s.rows[i] / 2 : s.rows[i], .group_size = kGroup,
                           .epilogue = s.silu_mul ? SkinnyEpilogue::kSiluMul : SkinnyEpilogue::kStore};
        }
        deepinfer::cuda::int4_skinny_gemm(p, LaunchStream{.handle = stream, .pdl = true});
      }) : time_graph(stream, [&](int call) {
        const int c = call % copies;
        Fp8SkinnyGemmParams p = params(x.as<uint16_t>(), m, s.k, scratch);
        p.num_problems = static_cast<int>(s.rows.size());
        p.num_sms = num_sms();
        for (size_t i = 0; i < s.rows.size(); ++i) {
          const size_t w = static_cast<size_t>(c) * s.rows.size() + i;
          p.problems[i] = {.w = codes[w].as<uint8_t>(), .scale_inv = scales[w].as<float>(), .out = outs[i].data,
                           .n_out = s.silu_mul ? s.rows[i] / 2 : s.rows[i],
                           .out_row_stride = s.silu_mul ? s.rows[i] / 2 : s.rows[i],
                           .epilogue = s.silu_mul ? SkinnyEpilogue::kSiluMul : SkinnyEpilogue::kStore};
        }
        deepinfer::cuda::fp8_skinny_gemm(p, LaunchStream{.handle = stream, .pdl = true});
      });
      const double bytes = static_cast<double>(w_bytes + io_bytes);
      const double gbs = bytes / t / 1e9;
      std::printf("%-24s M=%-3lld %8.1f MB %9.2f us %6.0f GB/s %5.1f%% of copy\n", s.name,
                  static_cast<long long>(m), bytes / 1e6, t * 1e6, gbs, 100.0 * gbs / copy);
      json += std::string(first ? "" : ", ") + "{\"shape\": \"" + s.name + "\", \"m\": " + std::to_string(m) +
              ", \"mb\": " + std::to_string(bytes / 1e6) + ", \"us\": " + std::to_string(t * 1e6) +
              ", \"gbs\": " + std::to_string(gbs) + ", \"pct_copy\": " + std::to_string(100.0 * gbs / copy) + "}";
      first = false;
    }
  }
  CUDA_TRY(cudaStreamDestroy(stream));
  json += "]}\n";
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f != nullptr) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  std::printf("%s\n", failures == 0 ? "all checks passed" : "CHECKS FAILED");
  return failures == 0 ? 0 : 1;
}
