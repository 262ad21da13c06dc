// Decode-sized GEMMs on the GPU: the skinny kernel against cuBLAS (a second backend whose tuning record has
// skinny_gemm off), at DeepSeek-V2-Lite's and V3's projection shapes and 1..8 tokens, beside a
// device-to-device copy measured in the same run. Disabled in normal runs (the GPU script passes
// --gtest_also_run_disabled_tests).
//
// Timing: each figure is one CUDA graph of kCalls calls, replayed kReplays times after a warm-up replay, over host
// time with the device synchronized around it (a replay is one launch, so launch cost does not hide in the figure).
// The calls cycle through enough copies of the weight matrix to exceed the L2 cache twice over, so every call reads
// its weights from HBM as a decode step does.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/error.h"
#include "core/weight.h"
#include "device_memory.h"

namespace deepinfer::op_test {
namespace {

constexpr int kCalls = 20;
constexpr int kReplays = 10;
constexpr size_t kColdBytes = size_t{256} << 20;  // weight copies cycled per graph: well past the 50-60 MB L2

class GemmPerf {
 public:
  TensorView tensor(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    void* data = memory_.allocate(bytes);
    CUDA_TRY(cudaMemset(data, 0x3c, bytes));  // bf16 values near 0.0115: finite sums
    return {data, dtype, shape, Device::kCuda};
  }

  // Seconds per call of op(copy) over kCalls calls recorded in one graph, copy = call % copies.
  double time(Backend& backend, int copies, const std::function<void(int)>& op) {
    std::unique_ptr<StepGraph> graph = backend.capture([&] {
      for (int i = 0; i < kCalls; ++i) op(i % copies);
    });
    DI_CHECK(graph != nullptr, "the CUDA backend records graphs");
    DI_CHECK(graph->replay(), "a fresh graph replays");
    CUDA_TRY(cudaDeviceSynchronize());
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kReplays; ++r) DI_CHECK(graph->replay(), "the graph still holds");
    CUDA_TRY(cudaDeviceSynchronize());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / (kReplays * kCalls);
  }

  double copy_gbs() {
    const size_t bytes = size_t{1} << 30;
    const TensorView a = tensor({static_cast<int64_t>(bytes)}, DType::kF8E4M3);
    const TensorView b = tensor({static_cast<int64_t>(bytes)}, DType::kF8E4M3);
    double best = 0.0;
    for (int i = 0; i < 5; ++i) {
      CUDA_TRY(cudaDeviceSynchronize());
      const auto start = std::chrono::steady_clock::now();
      CUDA_TRY(cudaMemcpy(b.data, a.data, bytes, cudaMemcpyDeviceToDevice));
      CUDA_TRY(cudaDeviceSynchronize());  // a device-to-device cudaMemcpy may return before the copy ends
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, 2.0 * bytes / s / 1e9);
    }
    return best;
  }

 private:
  DeviceMemory memory_;
};

struct GemmShape {
  const char* name;
  int64_t n;  // weight rows (linear_silu_mul: gate + up rows)
  int64_t k;
  enum Kind { kLinear, kLinearF32, kAccumulate, kSiluMul } kind = kLinear;
};

// One line: the op's time and bandwidth on both paths, beside the time a copy-speed read of its bytes would take.
void print_versus(const char* name, int64_t m, double bytes, double t_skinny, double t_cublas, double copy_gbs) {
  std::printf("[ perf     ] %-30s M=%-3lld %9.1f MB | skinny %8.2f us %6.0f GB/s %5.1f%% | cuBLAS %8.2f us %6.0f "
              "GB/s %5.1f%% | floor %7.2f us\n",
              name, static_cast<long long>(m), bytes / 1e6, t_skinny * 1e6, bytes / t_skinny / 1e9,
              100.0 * bytes / t_skinny / 1e9 / copy_gbs, t_cublas * 1e6, bytes / t_cublas / 1e9,
              100.0 * bytes / t_cublas / 1e9 / copy_gbs, bytes / (copy_gbs * 1e9) * 1e6);
}

TEST(CudaGemmPerf, DISABLED_SkinnyVsCublas) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  cuda::CudaTuning tuning = cuda::CudaTuning::from_env();
  tuning.skinny_gemm = true;
  const std::unique_ptr<Backend> skinny = make_cuda_backend(0, tuning);
  tuning.skinny_gemm = false;  // every GEMM on cuBLAS
  const std::unique_ptr<Backend> cublas = make_cuda_backend(0, tuning);
  GemmPerf perf;
  const double copy = perf.copy_gbs();
  std::printf("[ perf     ] device-to-device copy: %.0f GB/s\n", copy);
  const std::vector<GemmShape> shapes = {
      {"v2-lite q_proj", 3072, 2048},
      {"v2-lite kv_a_proj", 576, 2048},
      {"v2-lite o_proj", 2048, 2048},
      {"v2-lite router (f32 out)", 64, 2048, GemmShape::kLinearF32},
      {"v3 router (f32 out)", 256, 7168, GemmShape::kLinearF32},
      {"v2-lite shared gate_up+silu", 5632, 2048, GemmShape::kSiluMul},
      {"v2-lite shared down (+=)", 2048, 2816, GemmShape::kAccumulate},
      {"v2-lite lm_head (f32 out)", 102400, 2048, GemmShape::kLinearF32},
      {"v3 q_a_proj", 1536, 7168},
      {"v3 q_b_proj", 24576, 1536},
      {"v3 kv_a_proj", 576, 7168},
      {"v3 o_proj", 7168, 16384},
      {"v3 shared gate_up+silu", 4096, 7168, GemmShape::kSiluMul},
  };
  constexpr DType kBf16 = DType::kBF16;
  for (const GemmShape& s : shapes) {
    const size_t w_bytes = static_cast<size_t>(s.n * s.k) * 2;
    const int copies = static_cast<int>(std::min<size_t>(kCalls, std::max<size_t>(1, kColdBytes / w_bytes + 1)));
    std::vector<TensorView> weights;
    for (int c = 0; c < copies; ++c) weights.push_back(perf.tensor({s.n, s.k}, kBf16));
    for (const int64_t m : {int64_t{1}, int64_t{4}, int64_t{8}}) {
      const TensorView x = perf.tensor({m, s.k}, kBf16);
      const int64_t out_cols = s.kind == GemmShape::kSiluMul ? s.n / 2 : s.n;
      const TensorView out = perf.tensor({m, out_cols}, s.kind == GemmShape::kLinearF32 ? DType::kF32 : kBf16);
      const auto op_on = [&](Backend& b) {
        return [&b, &s, &weights, x, out](int c) {
          if (s.kind == GemmShape::kSiluMul) {
            b.linear_silu_mul({.x = x, .w = weights[static_cast<size_t>(c)], .out = out});
          } else {
            b.linear({.x = x, .w = weights[static_cast<size_t>(c)], .out = out,
                      .accumulate = s.kind == GemmShape::kAccumulate});
          }
        };
      };
      const double t_skinny = perf.time(*skinny, copies, op_on(*skinny));
      const double t_cublas = perf.time(*cublas, copies, op_on(*cublas));
      print_versus(s.name, m, static_cast<double>(w_bytes + x.bytes() + out.bytes()), t_skinny, t_cublas, copy);
    }
  }
  // Two products of the same activations in one op (multi_linear): one skinny launch, or cuBLAS op by op.
  struct PairShape {
    const char* name;
    int64_t n0, n1, k;
    bool out0_f32, gated1;
  };
  for (const PairShape& pr : {PairShape{"v2-lite q_proj + kv_a_proj", 3072, 576, 2048, false, false},
                              PairShape{"v2-lite router + shared gate_up", 64, 2816, 2048, true, true},
                              PairShape{"v3 q_a_proj + kv_a_proj", 1536, 576, 7168, false, false},
                              PairShape{"v3 router + shared gate_up", 256, 2048, 7168, true, true}}) {
    const int64_t rows1 = pr.gated1 ? 2 * pr.n1 : pr.n1;
    const size_t w_bytes = static_cast<size_t>((pr.n0 + rows1) * pr.k) * 2;
    const int copies = static_cast<int>(std::min<size_t>(kCalls, kColdBytes / w_bytes + 1));
    std::vector<TensorView> w0, w1;
    for (int c = 0; c < copies; ++c) {
      w0.push_back(perf.tensor({pr.n0, pr.k}, kBf16));
      w1.push_back(perf.tensor({rows1, pr.k}, kBf16));
    }
    for (const int64_t m : {int64_t{1}, int64_t{8}}) {
      const TensorView x = perf.tensor({m, pr.k}, kBf16);
      const TensorView out0 = perf.tensor({m, pr.n0}, pr.out0_f32 ? DType::kF32 : kBf16);
      const TensorView out1 = perf.tensor({m, pr.n1}, kBf16);
      const auto op_on = [&](Backend& b) {
        return [&b, &w0, &w1, &pr, x, out0, out1](int c) {
          const std::array targets{LinearTarget{.w = w0[static_cast<size_t>(c)], .out = out0},
                                   LinearTarget{.w = w1[static_cast<size_t>(c)], .out = out1, .silu_mul = pr.gated1}};
          b.multi_linear({.x = x, .targets = targets});
        };
      };
      const double t_skinny = perf.time(*skinny, copies, op_on(*skinny));
      const double t_cublas = perf.time(*cublas, copies, op_on(*cublas));
      const double bytes = static_cast<double>(w_bytes + x.bytes() + out0.bytes() + out1.bytes());
      std::printf("[ perf     ] %-30s M=%-3lld %9.1f MB | one launch %8.2f us %5.1f%% of copy | cuBLAS op by op %8.2f "
                  "us %5.1f%% of copy\n",
                  pr.name, static_cast<long long>(m), bytes / 1e6, t_skinny * 1e6,
                  100.0 * bytes / t_skinny / 1e9 / copy, t_cublas * 1e6, 100.0 * bytes / t_cublas / 1e9 / copy);
    }
  }
}

// DeepSeek-V3's decode projections as the quantized skinny GEMMs take them: one launch a shape.
struct DecodeShape {
  const char* name;
  std::vector<int64_t> rows;  // weight rows per product (one launch); silu_mul: gate + up rows
  int64_t k;
  bool silu_mul = false;
};

const std::vector<DecodeShape>& v3_decode_shapes() {
  static const std::vector<DecodeShape> shapes = {
      {"v3 q_a + kv_a", {1536, 576}, 7168},
      {"v3 q_b_proj", {24576}, 1536},
      {"v3 o_proj", {7168}, 16384},
      {"v3 dense gate_up+silu", {2 * 18432}, 7168, true},
      {"v3 dense down", {7168}, 18432},
  };
  return shapes;
}

// Seconds per call of one decode shape's op (linear, linear_silu_mul or multi_linear) on `backend`: weight set c of
// `weights` (one weight a product) against x into `outs`.
double time_decode_op(Backend& backend, GemmPerf& perf, const DecodeShape& s,
                      const std::vector<std::vector<WeightView>>& weights, const TensorView& x,
                      const std::vector<TensorView>& outs) {
  return perf.time(backend, static_cast<int>(weights.size()), [&](int c) {
    const std::vector<WeightView>& set = weights[static_cast<size_t>(c)];
    if (s.silu_mul) {
      backend.linear_silu_mul({.x = x, .w = set[0], .out = outs[0]});
    } else if (set.size() == 1) {
      backend.linear({.x = x, .w = set[0], .out = outs[0]});
    } else {
      std::vector<LinearTarget> targets;
      for (size_t i = 0; i < set.size(); ++i) targets.push_back({.w = set[i], .out = outs[i]});
      backend.multi_linear({.x = x, .targets = targets});
    }
  });
}

// Each of v3_decode_shapes() at 1, 8, 16, 32 and 64 tokens, its weights of `format` made by `weight(rows, k)` and
// reading `weight_bytes(rows, k)` bytes each (copies cycled past L2): one line a case, GB/s over those bytes plus x
// and out, and the share of the copy bandwidth `copy` (GB/s). With `bf16_beside`, the same op with bf16 weights too
// (the skinny GEMM up to 8 tokens, cuBLAS past it) and the quantized op's speedup over it.
void time_decode_shapes(Backend& backend, GemmPerf& perf, double copy, const char* format,
                        const std::function<int64_t(int64_t, int64_t)>& weight_bytes,
                        const std::function<WeightView(int64_t, int64_t)>& weight, bool bf16_beside = false) {
  const auto copies_of = [](int64_t bytes) {
    return static_cast<int>(std::min<int64_t>(kCalls, std::max<int64_t>(1, kColdBytes / bytes + 1)));
  };
  for (const DecodeShape& s : v3_decode_shapes()) {
    int64_t w_bytes = 0, bf16_bytes = 0;
    for (const int64_t r : s.rows) w_bytes += weight_bytes(r, s.k), bf16_bytes += r * s.k * 2;
    std::vector<std::vector<WeightView>> weights(static_cast<size_t>(copies_of(w_bytes)));
    for (auto& set : weights) {
      for (const int64_t r : s.rows) set.push_back(weight(r, s.k));
    }
    std::vector<std::vector<WeightView>> bf16_weights(bf16_beside ? static_cast<size_t>(copies_of(bf16_bytes)) : 0);
    for (auto& set : bf16_weights) {
      for (const int64_t r : s.rows) set.push_back(WeightView(perf.tensor({r, s.k}, DType::kBF16)));
    }
    for (const int64_t m : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{32}, int64_t{64}}) {
      const TensorView x = perf.tensor({m, s.k}, DType::kBF16);
      std::vector<TensorView> outs;
      int64_t io_bytes = x.bytes();
      for (const int64_t r : s.rows) {
        outs.push_back(perf.tensor({m, s.silu_mul ? r / 2 : r}, DType::kBF16));
        io_bytes += outs.back().bytes();
      }
      const double t = time_decode_op(backend, perf, s, weights, x, outs);
      const double bytes = static_cast<double>(w_bytes + io_bytes);
      std::printf("[ perf     ] %-30s %-5s M=%-3lld %9.1f MB | %8.2f us %6.0f GB/s %5.1f%% of copy", s.name, format,
                  static_cast<long long>(m), bytes / 1e6, t * 1e6, bytes / t / 1e9, 100.0 * bytes / t / 1e9 / copy);
      if (bf16_beside) {
        const double t_bf16 = time_decode_op(backend, perf, s, bf16_weights, x, outs);
        std::printf(" | bf16 %8.2f us, %.2fx", t_bf16 * 1e6, t_bf16 / t);
      }
      std::printf("\n");
    }
  }
}

// FP8 weights (block-scaled e4m3, core/weight.h, W8A8 as the engine loads them): the path an FP8 linear layer takes
// at DeepSeek-V3's decode shapes (the FP8 skinny GEMM up to CudaTuning::fp8_skinny_max_tokens tokens, the block-scaled
// cuBLASLt GEMM past it), as GB/s over the codes and scales it reads (plus x and out), the share of the copy
// bandwidth and the speed against bf16 weights, at 1 to 64 tokens; then the
// prefill path's TFLOP/s at 4096 x 7168 x 7168, W8A8 (cuBLASLt's block-scaled FP8 GEMM, activations quantized) and
// W8A16 (dequantized chunk by chunk, then the bf16 GEMM).
TEST(CudaGemmPerf, DISABLED_Fp8Weights) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> backend = make_cuda_backend(0, cuda::CudaTuning::from_env());
  GemmPerf perf;
  const double copy = perf.copy_gbs();
  std::printf("[ perf     ] device-to-device copy: %.0f GB/s\n", copy);
  const auto fp8_weight = [&perf](int64_t rows, int64_t k, bool w8a8) {
    const TensorView codes = perf.tensor({rows, k}, DType::kF8E4M3);  // 0x3c: e4m3 1.5
    const TensorView scales = perf.tensor({fp8_blocks(rows), fp8_blocks(k)}, DType::kF32);
    CUDA_TRY(cudaMemset(scales.data, 0, scales.bytes()));  // finite sums whatever the codes
    return WeightView(codes, scales, w8a8);
  };
  time_decode_shapes(
      *backend, perf, copy, "fp8", [](int64_t r, int64_t k) { return r * k + fp8_blocks(r) * fp8_blocks(k) * 4; },
      [&](int64_t r, int64_t k) { return fp8_weight(r, k, true); }, /*bf16_beside=*/true);
  constexpr int64_t kM = 4096, kN = 7168, kK = 7168;
  const TensorView x = perf.tensor({kM, kK}, DType::kBF16);
  const TensorView out = perf.tensor({kM, kN}, DType::kBF16);
  for (const bool w8a8 : {true, false}) {
    const WeightView w = fp8_weight(kN, kK, w8a8);
    const double t = perf.time(*backend, 1, [&](int) { backend->linear({.x = x, .w = w, .out = out}); });
    std::printf("[ perf     ] fp8 prefill %s %lldx%lldx%lld %9.2f us %7.1f TFLOP/s\n", w8a8 ? "W8A8 " : "W8A16",
                static_cast<long long>(kM), static_cast<long long>(kN), static_cast<long long>(kK), t * 1e6,
                2.0 * kM * kN * kK / t / 1e12);
  }
}

// INT4 weights (W4A16, packed as core/weight.h: groups of 128 with zero points, as AWQ and GPTQ checkpoints of
// DeepSeek-V3 store them): the INT4 skinny GEMM at V3's decode shapes, as GB/s over the 4-bit codes, scales and zero
// points it reads (plus x and out) and the share of the copy bandwidth, at 1, 8 and 64 tokens; then the prefill path
// (the weight widened to bf16 a chunk at a time, then the bf16 GEMM) at 4096 x 7168 x 7168 beside the bf16 GEMM itself.
// The decode shapes again with NVFP4 weights (e2m1 codes in the same words, a float32 scale per 16, no zero points),
// which the same kernels unpack.
TEST(CudaGemmPerf, DISABLED_Int4Weights) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> backend = make_cuda_backend(0, cuda::CudaTuning::from_env());
  GemmPerf perf;
  const double copy = perf.copy_gbs();
  std::printf("[ perf     ] device-to-device copy: %.0f GB/s\n", copy);
  struct Packed4Format {
    const char* name;
    int64_t group;
    bool zeros;
    DType dtype;
  };
  constexpr Packed4Format kInt4{"int4", 128, true, DType::kU4}, kNvfp4{"nvfp4", 16, false, DType::kE2M1};
  const auto weight_bytes = [](const Packed4Format& f, int64_t rows, int64_t k) {
    return rows * k / 2 + rows * (k / f.group) * 4 + (f.zeros ? rows * int4_zero_words(k / f.group) * 4 : 0);
  };
  const auto packed_weight = [&perf](const Packed4Format& f, int64_t rows, int64_t k) {
    const TensorView words = perf.tensor({rows, k / 8}, DType::kI32);
    const TensorView scales = perf.tensor({rows, k / f.group}, DType::kF32);
    CUDA_TRY(cudaMemset(scales.data, 0, scales.bytes()));  // finite sums whatever the codes
    const ConstTensorView zeros =
        f.zeros ? ConstTensorView(perf.tensor({rows, int4_zero_words(k / f.group)}, DType::kI32)) : ConstTensorView();
    return WeightView(ConstTensorView(words.data, f.dtype, {rows, k}, Device::kCuda), scales, zeros);
  };
  for (const Packed4Format& f : {kInt4, kNvfp4}) {
    time_decode_shapes(
        *backend, perf, copy, f.name, [&](int64_t r, int64_t k) { return weight_bytes(f, r, k); },
        [&](int64_t r, int64_t k) { return packed_weight(f, r, k); });
  }
  constexpr int64_t kM = 4096, kN = 7168, kK = 7168;
  const TensorView x = perf.tensor({kM, kK}, DType::kBF16);
  const TensorView out = perf.tensor({kM, kN}, DType::kBF16);
  const WeightView w = packed_weight(kInt4, kN, kK);
  const TensorView dense = perf.tensor({kN, kK}, DType::kBF16);
  const double t_int4 = perf.time(*backend, 1, [&](int) { backend->linear({.x = x, .w = w, .out = out}); });
  const double t_bf16 = perf.time(*backend, 1, [&](int) { backend->linear({.x = x, .w = dense, .out = out}); });
  const double flop = 2.0 * kM * kN * kK;
  std::printf("[ perf     ] int4 prefill W4A16 %lldx%lldx%lld %9.2f us %7.1f TFLOP/s | bf16 %9.2f us %7.1f TFLOP/s | "
              "%5.1f%% of bf16\n",
              static_cast<long long>(kM), static_cast<long long>(kN), static_cast<long long>(kK), t_int4 * 1e6,
              flop / t_int4 / 1e12, t_bf16 * 1e6, flop / t_bf16 / 1e12, 100.0 * t_bf16 / t_int4);
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
