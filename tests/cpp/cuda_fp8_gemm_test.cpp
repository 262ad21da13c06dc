// The CUDA backend's dense projections with block-scaled FP8 weights (core/weight.h) against the CPU reference, which
// multiplies by the dequantized weight: the FP8 skinny GEMM at decode sizes (gemm/fp8_skinny_gemm.cu), and past it
// the prefill path (gemm/fp8_linear.cpp: W8A16 dequantized, W8A8 through cuBLASLt's block-scaled FP8 GEMM).
//
// The weights are quantized on the host (quantize_fp8_block_rows) and both backends get the same codes and scales;
// the activations are rounded to bf16 first. W8A16 compares like the bf16 GEMMs (1e-2 of the largest reference value:
// the GPU's bf16 output rounding and summation order). W8A8 quantizes the activations per token per 128 channels
// (e4m3 keeps 3 mantissa bits), so its cases allow 4e-2; at decode sizes it runs the skinny kernel on exact
// activations all the same.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/fp8_skinny_gemm.cuh"
#include "core/fp8.h"
#include "core/weight.h"
#include "cuda_device_required.h"
#include "device_memory.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {
namespace {

using deepinfer::test::cuda_device_available;

// A weight quantized on the host: e4m3 codes and their 128x128 block scales.
struct HostFp8Weight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  static HostFp8Weight quantize(const std::vector<float>& values, int64_t rows, int64_t cols) {
    HostFp8Weight w{.rows = rows, .cols = cols, .codes = std::vector<uint8_t>(static_cast<size_t>(rows * cols)),
                    .scales = std::vector<float>(static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols)))};
    quantize_fp8_block_rows(values, rows, cols, Fp8ScaleFormat::kFloat, w.codes, w.scales);
    return w;
  }
  WeightView upload(OpRunner& run, bool w8a8) const {
    const TensorView codes_view = run.upload(HostTensor::from_raw({rows, cols}, DType::kF8E4M3, codes.data()));
    const TensorView scale_view = run.upload(HostTensor::f32({fp8_blocks(rows), fp8_blocks(cols)}, scales));
    return {codes_view, scale_view, w8a8};
  }
};

std::vector<float> bf16_values(Rng& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = rng.uniform(n, lo, hi);
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

// bf16 activations on the device, their float32 values on the CPU.
HostTensor activations(const OpRunner& run, Shape shape, const std::vector<float>& values, bool f32 = false) {
  return run.device() == Device::kCpu || f32 ? HostTensor::f32(shape, values) : HostTensor::bf16(shape, values);
}

struct Fp8Mode {
  bool w8a8 = false;
  bool x_f32 = false;  // float32 activations on the device too (the dequantized path's fp32 GEMM)
  std::string tag() const { return std::string(w8a8 ? "w8a8" : "w8a16") + (x_f32 ? "_xf32" : ""); }
  double tolerance() const { return w8a8 ? 4e-2 : x_f32 ? 1e-5 : 1e-2; }
};

void add_fp8_linear(CaseRegistry& r, Fp8Mode mode, int64_t m, int64_t n, int64_t k, uint64_t seed, bool out_f32 = false,
                    bool accumulate = false) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const HostFp8Weight w = HostFp8Weight::quantize(rng.uniform(n * k), n, k);
  const bool out32 = out_f32 || mode.x_f32;
  std::vector<float> prior = rng.uniform(m * n, -4.0f, 4.0f);
  if (!out32) prior = bf16_values(rng, m * n, -4.0f, 4.0f);
  r.add({.op = OpKind::kLinear,
         .name = str_cat("fp8_linear_", mode.tag(), "_", m, "x", n, "x", k, out_f32 ? "_out_f32" : "",
                         accumulate ? "_accumulate" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const DType out_dtype = out32 || run.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
           const TensorView out = accumulate ? run.upload(activations(run, {m, n}, prior, out32), Access::kReadWrite)
                                             : run.output({m, n}, out_dtype);
           run.backend().linear({.x = run.upload(activations(run, {m, k}, x, mode.x_f32)), .w = w.upload(run, mode.w8a8),
                                 .out = out, .accumulate = accumulate});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = mode.tolerance()});
}

void add_fp8_linear_silu_mul(CaseRegistry& r, Fp8Mode mode, int64_t m, int64_t inter, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const HostFp8Weight w = HostFp8Weight::quantize(rng.uniform(2 * inter * k), 2 * inter, k);
  r.add({.op = OpKind::kLinearSiluMul,
         .name = str_cat("fp8_linear_silu_mul_", mode.tag(), "_", m, "x", inter, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, inter}, run.device() == Device::kCpu ? DType::kF32 : DType::kBF16);
           run.backend().linear_silu_mul(
               {.x = run.upload(activations(run, {m, k}, x)), .w = w.upload(run, mode.w8a8), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = mode.tolerance()});
}

// Target 1 gated when there are three (the router, the shared experts' gate_up, kv_a), all plain otherwise (q_a with
// kv_a); target 0 float32 when out0_f32.
void add_fp8_multi_linear(CaseRegistry& r, Fp8Mode mode, int64_t m, int64_t k, std::vector<int64_t> widths,
                          bool out0_f32, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const auto gated = [n = widths.size()](size_t i) { return n == 3 && i == 1; };
  std::vector<HostFp8Weight> ws;
  for (size_t i = 0; i < widths.size(); ++i) {
    const int64_t rows = gated(i) ? 2 * widths[i] : widths[i];
    ws.push_back(HostFp8Weight::quantize(rng.uniform(rows * k), rows, k));
  }
  r.add({.op = OpKind::kMultiLinear,
         .name = str_cat("fp8_multi_linear_", mode.tag(), "_", m, "x", k, "_", widths.size(), "_targets",
                         out0_f32 ? "_out0_f32" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           std::vector<LinearTarget> targets;
           for (size_t i = 0; i < widths.size(); ++i) {
             const DType out_dtype = (i == 0 && out0_f32) || run.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
             targets.push_back({.w = ws[i].upload(run, mode.w8a8), .out = run.output({m, widths[i]}, out_dtype),
                                .silu_mul = gated(i)});
           }
           run.backend().multi_linear({.x = run.upload(activations(run, {m, k}, x)), .targets = targets});
           Outputs outs;
           for (size_t i = 0; i < widths.size(); ++i) outs.push_back({str_cat("out", i), run.fetch(targets[i].out)});
           return outs;
         },
         .tolerance = mode.tolerance()});
}

CaseRegistry build_fp8_registry() {
  CaseRegistry r;
  const Fp8Mode w8a16{}, w8a8{.w8a8 = true};
  uint64_t seed = 7000;
  // Decode sizes (the skinny kernel: 1, 2, 4 and 8 token tiles) and past it (65, 300: the prefill path). N = 576
  // (kv_a: not a multiple of 128), K = 7168 and 1536.
  for (const int64_t m : {1, 3, 8, 16, 64, 65, 300}) {
    add_fp8_linear(r, w8a16, m, 576, 7168, ++seed);
    add_fp8_linear(r, w8a16, m, 640, 1536, ++seed, m % 2 == 1);
    add_fp8_linear(r, w8a16, m, 576, 1536, ++seed, false, true);
  }
  for (const int64_t m : {1, 64, 65, 300}) {
    add_fp8_linear(r, w8a8, m, 576, 7168, ++seed);
    add_fp8_linear(r, w8a8, m, 1024, 1536, ++seed, true);
    add_fp8_linear(r, w8a8, m, 576, 1536, ++seed, false, true);
  }
  add_fp8_linear(r, w8a16, 24, 200, 384, ++seed, true, true);  // 3 token tiles' worth, N and K not MMA-friendly
  add_fp8_linear(r, w8a16, 5, 64, 200, ++seed);                 // K not a multiple of 128: dequantized
  add_fp8_linear(r, Fp8Mode{.x_f32 = true}, 4, 576, 1536, ++seed);  // float32 activations: dequantized, fp32 GEMM
  for (const int64_t m : {1, 8, 40, 64, 300}) {
    add_fp8_linear_silu_mul(r, w8a16, m, 576, 1536, ++seed);
  }
  add_fp8_linear_silu_mul(r, w8a16, 2, 100, 1536, ++seed);  // gate and up halves not multiples of 16 rows
  add_fp8_linear_silu_mul(r, w8a8, 300, 512, 7168, ++seed);
  for (const int64_t m : {1, 16, 64, 65}) {
    add_fp8_multi_linear(r, w8a16, m, 7168, {1536, 576}, false, ++seed);         // q_a with kv_a
    add_fp8_multi_linear(r, w8a16, m, 1536, {256, 576, 128}, m == 1, ++seed);   // plain, gated, plain
  }
  add_fp8_multi_linear(r, w8a8, 300, 7168, {1536, 576}, false, ++seed);
  return r;
}

const CaseRegistry& fp8_registry() {
  static const CaseRegistry r = build_fp8_registry();
  return r;
}

class CudaFp8VsCpu : public ::testing::TestWithParam<size_t> {
 public:
  static void SetUpTestSuite() {
    if (!cuda_device_available()) return;
    cuda_ = make_cuda_backend(0, cuda::CudaTuning::from_env());
    cpu_ = make_cpu_backend();
  }
  static void TearDownTestSuite() {
    cuda_.reset();
    cpu_.reset();
  }

 protected:
  static inline std::unique_ptr<Backend> cuda_;
  static inline std::unique_ptr<Backend> cpu_;
};

TEST_P(CudaFp8VsCpu, Case) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  DeviceMemory device_memory;
  HostMemory host_memory;
  expect_matches_reference(fp8_registry().cases()[GetParam()], *cuda_, device_memory, *cpu_, host_memory);
}

INSTANTIATE_TEST_SUITE_P(CudaFp8Gemm, CudaFp8VsCpu, ::testing::Range<size_t>(0, fp8_registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return fp8_registry().cases()[info.param].name;
                         });

// Every finite e4m3 code through the skinny kernel, bit for bit: one-hot activations pick single weight columns, so
// out[t][n] = e4m3(code[n][t]) * scale exactly (the widening to fp16 and the activations' power-of-two rescale lose
// nothing, subnormal codes included). Two scale block rows with different power-of-two scales.
TEST(CudaFp8Gemm, SkinnyKernelDecodesEveryCodeExactly) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend(0, cuda::CudaTuning::from_env());
  constexpr int64_t kTokens = 8, kRows = 256, kK = 128;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kK));
  for (int64_t i = 0; i < kRows * kK; ++i) {
    const auto code = static_cast<uint8_t>((i / kK) + 37 * (i % kK));
    codes[static_cast<size_t>(i)] = (code & 0x7f) == 0x7f ? 0 : code;  // no NaN codes
  }
  const std::vector<float> scales = {1.0f, 0.125f};  // [2 block rows, 1 block column]
  std::vector<float> x(static_cast<size_t>(kTokens * kK), 0.0f);
  for (int64_t t = 0; t < kTokens; ++t) x[static_cast<size_t>(t * kK + t)] = 1.0f;
  DeviceMemory memory;
  OpRunner run(*cuda, memory);
  const WeightView w(run.upload(HostTensor::from_raw({kRows, kK}, DType::kF8E4M3, codes.data())),
                     run.upload(HostTensor::f32({2, 1}, scales)));
  const TensorView out = run.output({kTokens, kRows}, DType::kF32);
  cuda->linear({.x = run.upload(HostTensor::bf16({kTokens, kK}, x)), .w = w, .out = out});
  const std::vector<double> got = run.fetch(out);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t n = 0; n < kRows; ++n) {
      const double expected = double{e4m3_to_float(codes[static_cast<size_t>(n * kK + t)])} * scales[n / 128];
      ASSERT_EQ(got[static_cast<size_t>(t * kRows + n)], expected) << "token " << t << " row " << n;
    }
  }
  for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
}

// Host-only: which operands the FP8 skinny kernel takes (no "Cuda" in the name: runs without a device).
TEST(Fp8SkinnyGemm, TakesWholeScaleBlocksAndUpToSixtyFourTokens) {
  alignas(16) static uint16_t x[64 * 256];
  alignas(16) static uint8_t w[64 * 256];
  alignas(16) static float s[4];
  cuda::Fp8SkinnyGemmParams p{.x = x, .tokens = 64, .k_dim = 256, .x_row_stride = 256, .num_problems = 1};
  p.problems[0] = {.w = w, .scale_inv = s, .out = x, .n_out = 64, .out_row_stride = 64};
  EXPECT_TRUE(cuda::fp8_skinny_gemm_fits(p));
  p.tokens = 65;
  EXPECT_FALSE(cuda::fp8_skinny_gemm_fits(p));
  p.tokens = 1;
  p.k_dim = p.x_row_stride = 192;  // not a whole number of 128-wide scale blocks
  EXPECT_FALSE(cuda::fp8_skinny_gemm_fits(p));
  p.k_dim = p.x_row_stride = 256;
  p.problems[0].w = w + 8;  // codes not 16-byte aligned
  EXPECT_FALSE(cuda::fp8_skinny_gemm_fits(p));
  p.problems[0].w = w;
  p.problems[0].scale_inv = nullptr;
  EXPECT_FALSE(cuda::fp8_skinny_gemm_fits(p));
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
