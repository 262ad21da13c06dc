// The CUDA backend's dense projections with packed INT4 weights (core/weight.h) against the CPU reference, which
// multiplies by the dequantized weight (backend/cpu/weight_values.cpp): the INT4 skinny GEMM at decode sizes
// (gemm/int4_skinny_gemm.cu, both ways of applying the group scales) and past it the widening prefill path
// (gemm/int4_linear.cpp).
//
// The weights are random codes, scales and zero points packed on the host (model/int4.h); both backends get the same
// words. The activations are rounded to bf16 first. Groups of 128 inputs or more multiply the exact integers q - z
// and scale the fp32 sums, so they compare like the bf16 GEMMs (1e-2 of the largest reference value: the GPU's bf16
// output rounding and summation order); narrower groups round (q - z) * scale to bf16 in registers, 2e-2.
//
// FP4 weights (e2m1 codes in the same packing, groups of 16 (NVFP4) and 32 (MXFP4), no zero points) run through the
// same kernels and compare the same way: their scales always apply in registers (2e-2).
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/int4_skinny_gemm.cuh"
#include "core/weight.h"
#include "cuda_device_required.h"
#include "device_memory.h"
#include "model/int4.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {
namespace {

using deepinfer::test::cuda_device_available;

// Random 4-bit rows packed as the engine keeps them (fp4: e2m1 codes, symmetric).
struct HostInt4Weight {
  int64_t rows = 0, cols = 0, group = 0;
  bool fp4 = false;
  std::vector<int32_t> words, zeros;
  std::vector<float> scales;

  static HostInt4Weight random(Rng& rng, int64_t rows, int64_t cols, int64_t group, bool symmetric, bool fp4 = false) {
    Int4Rows r;
    r.resize(rows, cols, group, symmetric || fp4);
    r.e2m1 = fp4;
    const std::vector<float> q = rng.uniform(rows * cols, 0.0f, 16.0f);
    for (size_t i = 0; i < r.q.size(); ++i) r.q[i] = static_cast<uint8_t>(std::min(15.0f, q[i]));
    // Scales of a unit-variance weight's size: |q - z| <= 15.
    const std::vector<float> s = rng.uniform(static_cast<int64_t>(r.scales.size()), 0.01f, 0.1f);
    r.scales.assign(s.begin(), s.end());
    const std::vector<float> z = rng.uniform(static_cast<int64_t>(r.zeros.size()), 0.0f, 16.0f);
    for (size_t i = 0; i < r.zeros.size(); ++i) r.zeros[i] = static_cast<uint8_t>(std::min(15.0f, z[i]));
    HostInt4Weight w{.rows = rows, .cols = cols, .group = group, .fp4 = fp4};
    w.words.resize(static_cast<size_t>(rows * cols / 8));
    pack_int4_codes(r, w.words);
    if (!r.symmetric()) {
      w.zeros.resize(static_cast<size_t>(rows * int4_zero_words(r.groups())));
      pack_int4_zeros(r, w.zeros);
    }
    w.scales = r.scales;
    return w;
  }
  WeightView upload(OpRunner& run) const {
    const TensorView codes = run.upload(HostTensor::from_raw({rows, cols / 8}, DType::kI32, words.data()));
    const TensorView scale_view = run.upload(HostTensor::f32({rows, cols / group}, scales));
    const ConstTensorView zero_view =
        zeros.empty() ? ConstTensorView()
                      : ConstTensorView(run.upload(HostTensor::from_raw({rows, int4_zero_words(cols / group)},
                                                                        DType::kI32, zeros.data())));
    return {ConstTensorView(codes.data, fp4 ? DType::kE2M1 : DType::kU4, {rows, cols}, codes.device), scale_view,
            zero_view};
  }
};

std::vector<float> bf16_values(Rng& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = rng.uniform(n, lo, hi);
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

HostTensor activations(const OpRunner& run, Shape shape, const std::vector<float>& values, bool f32 = false) {
  return run.device() == Device::kCpu || f32 ? HostTensor::f32(shape, values) : HostTensor::bf16(shape, values);
}

struct Int4Mode {
  int64_t group = 128;  // -1: a group per row
  bool symmetric = false;
  bool x_f32 = false;
  bool fp4 = false;  // e2m1 codes (symmetric by nature)
  int64_t group_for(int64_t k) const { return group == -1 ? k : group; }
  std::string tag() const {
    if (fp4) return str_cat("fp4_g", group, x_f32 ? "_xf32" : "");
    return str_cat(group == -1 ? std::string("gK") : str_cat("g", group), symmetric ? "_sym" : "_asym",
                   x_f32 ? "_xf32" : "");
  }
  double tolerance() const {
    if (x_f32) return 1e-5;
    return !fp4 && (group == -1 || group % 128 == 0) ? 1e-2 : 2e-2;
  }
  HostInt4Weight weight(Rng& rng, int64_t rows, int64_t k) const {
    return HostInt4Weight::random(rng, rows, k, group_for(k), symmetric, fp4);
  }
};

void add_int4_linear(CaseRegistry& r, Int4Mode mode, int64_t m, int64_t n, int64_t k, uint64_t seed,
                     bool out_f32 = false, bool accumulate = false) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const HostInt4Weight w = mode.weight(rng, n, k);
  const bool out32 = out_f32 || mode.x_f32;
  std::vector<float> prior = out32 ? rng.uniform(m * n, -4.0f, 4.0f) : bf16_values(rng, m * n, -4.0f, 4.0f);
  r.add({.op = OpKind::kLinear,
         .name = str_cat("int4_linear_", mode.tag(), "_", m, "x", n, "x", k, out_f32 ? "_out_f32" : "",
                         accumulate ? "_accumulate" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const DType out_dtype = out32 || run.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
           const TensorView out = accumulate ? run.upload(activations(run, {m, n}, prior, out32), Access::kReadWrite)
                                             : run.output({m, n}, out_dtype);
           run.backend().linear({.x = run.upload(activations(run, {m, k}, x, mode.x_f32)), .w = w.upload(run),
                                 .out = out, .accumulate = accumulate});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = mode.tolerance()});
}

void add_int4_linear_silu_mul(CaseRegistry& r, Int4Mode mode, int64_t m, int64_t inter, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const HostInt4Weight w = mode.weight(rng, 2 * inter, k);
  r.add({.op = OpKind::kLinearSiluMul,
         .name = str_cat("int4_linear_silu_mul_", mode.tag(), "_", m, "x", inter, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, inter}, run.device() == Device::kCpu ? DType::kF32 : DType::kBF16);
           run.backend().linear_silu_mul({.x = run.upload(activations(run, {m, k}, x)), .w = w.upload(run), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = mode.tolerance()});
}

// Target 1 gated when there are three, all plain otherwise; target 0 float32 when out0_f32.
void add_int4_multi_linear(CaseRegistry& r, Int4Mode mode, int64_t m, int64_t k, std::vector<int64_t> widths,
                           bool out0_f32, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = bf16_values(rng, m * k);
  const auto gated = [n = widths.size()](size_t i) { return n == 3 && i == 1; };
  std::vector<HostInt4Weight> ws;
  for (size_t i = 0; i < widths.size(); ++i) {
    ws.push_back(mode.weight(rng, gated(i) ? 2 * widths[i] : widths[i], k));
  }
  r.add({.op = OpKind::kMultiLinear,
         .name = str_cat("int4_multi_linear_", mode.tag(), "_", m, "x", k, "_", widths.size(), "_targets",
                         out0_f32 ? "_out0_f32" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           std::vector<LinearTarget> targets;
           for (size_t i = 0; i < widths.size(); ++i) {
             const DType out_dtype = (i == 0 && out0_f32) || run.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
             targets.push_back({.w = ws[i].upload(run), .out = run.output({m, widths[i]}, out_dtype), .silu_mul = gated(i)});
           }
           run.backend().multi_linear({.x = run.upload(activations(run, {m, k}, x)), .targets = targets});
           Outputs outs;
           for (size_t i = 0; i < widths.size(); ++i) outs.push_back({str_cat("out", i), run.fetch(targets[i].out)});
           return outs;
         },
         .tolerance = mode.tolerance()});
}

CaseRegistry build_int4_registry() {
  CaseRegistry r;
  uint64_t seed = 9000;
  const Int4Mode g128{}, g128_sym{.symmetric = true}, g64{.group = 64}, g32_sym{.group = 32, .symmetric = true},
      per_row{.group = -1}, g256{.group = 256, .symmetric = true};
  // Decode sizes (1, 2, 4 and 8 token tiles) and past them (65, 300: the widening path). N = 576 (kv_a: not a
  // multiple of 128), K = 7168 and 1536.
  for (const int64_t m : {1, 3, 8, 16, 33, 64, 65, 300}) {
    add_int4_linear(r, g128, m, 576, 7168, ++seed);
    add_int4_linear(r, g128_sym, m, 640, 1536, ++seed, m % 2 == 1);
    add_int4_linear(r, g64, m, 576, 1536, ++seed, false, true);
  }
  for (const Int4Mode mode : {g32_sym, per_row, g256}) {
    for (const int64_t m : {1, 8, 64, 65}) add_int4_linear(r, mode, m, 512, 2048, ++seed);
  }
  add_int4_linear(r, g128, 24, 200, 384, ++seed, true, true);      // 3 token tiles' worth, N not MMA-friendly
  add_int4_linear(r, Int4Mode{.group = 16}, 5, 64, 256, ++seed);   // groups of 16: widened
  add_int4_linear(r, g128, 5, 64, 256, ++seed);                    // K = 256: two steps, one a warp
  add_int4_linear(r, Int4Mode{.group = 8}, 3, 48, 200, ++seed);    // K not a multiple of 128: widened
  add_int4_linear(r, Int4Mode{.x_f32 = true}, 4, 576, 1536, ++seed);  // float32 activations: widened, fp32 GEMM
  for (const int64_t m : {1, 8, 40, 64, 300}) add_int4_linear_silu_mul(r, g128, m, 576, 1536, ++seed);
  add_int4_linear_silu_mul(r, g64, 2, 100, 1536, ++seed);  // gate and up halves not multiples of 16 rows
  for (const int64_t m : {1, 16, 64, 65}) {
    add_int4_multi_linear(r, g128, m, 7168, {1536, 576}, false, ++seed);         // q_a with kv_a
    add_int4_multi_linear(r, g128_sym, m, 1536, {256, 576, 128}, m == 1, ++seed);  // plain, gated, plain
  }
  // FP4: NVFP4's groups of 16 and MXFP4's of 32 at decode sizes (the skinny kernel, both halves of a lane's inputs
  // with their own scale) and past them (the widening path), every epilogue, and float32 activations.
  const Int4Mode nvfp4{.group = 16, .fp4 = true}, mxfp4{.group = 32, .fp4 = true};
  for (const Int4Mode mode : {nvfp4, mxfp4}) {
    for (const int64_t m : {1, 3, 8, 16, 33, 64, 65, 300}) add_int4_linear(r, mode, m, 576, 7168, ++seed);
    add_int4_linear(r, mode, 5, 640, 1536, ++seed, true, true);
    add_int4_linear(r, mode, 3, 48, 224, ++seed);  // K not a multiple of 128: widened
    for (const int64_t m : {1, 40, 300}) add_int4_linear_silu_mul(r, mode, m, 576, 1536, ++seed);
    for (const int64_t m : {1, 64, 65}) add_int4_multi_linear(r, mode, m, 1536, {256, 576, 128}, m == 1, ++seed);
  }
  add_int4_linear(r, Int4Mode{.group = 16, .x_f32 = true, .fp4 = true}, 4, 576, 1536, ++seed);
  return r;
}

const CaseRegistry& int4_registry() {
  static const CaseRegistry r = build_int4_registry();
  return r;
}

class CudaInt4VsCpu : public ::testing::TestWithParam<size_t> {
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

TEST_P(CudaInt4VsCpu, Case) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  DeviceMemory device_memory;
  HostMemory host_memory;
  expect_matches_reference(int4_registry().cases()[GetParam()], *cuda_, device_memory, *cpu_, host_memory);
}

INSTANTIATE_TEST_SUITE_P(CudaInt4Gemm, CudaInt4VsCpu, ::testing::Range<size_t>(0, int4_registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return int4_registry().cases()[info.param].name;
                         });

// Every code and zero point through the skinny kernel, bit for bit: one-hot activations pick single weight columns,
// so out[t][n] = (q[n][t] - z[n]) * scale exactly (the unpacking and the exact integer product lose nothing), rows
// with their own zero points and power-of-two scales.
TEST(CudaInt4Gemm, SkinnyKernelDecodesEveryCodeExactly) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend(0, cuda::CudaTuning::from_env());
  constexpr int64_t kTokens = 64, kRows = 48, kK = 128;
  Int4Rows rows;
  rows.resize(kRows, kK, kK, false);
  for (int64_t n = 0; n < kRows; ++n) {
    for (int64_t k = 0; k < kK; ++k) rows.q[static_cast<size_t>(n * kK + k)] = static_cast<uint8_t>((n + 3 * k) % 16);
    rows.zeros[static_cast<size_t>(n)] = static_cast<uint8_t>(n % 16);
    rows.scales[static_cast<size_t>(n)] = n % 3 == 0 ? 0.25f : 2.0f;
  }
  std::vector<int32_t> words(static_cast<size_t>(kRows * kK / 8)), zeros(static_cast<size_t>(kRows));
  pack_int4_codes(rows, words);
  pack_int4_zeros(rows, zeros);
  std::vector<float> x(static_cast<size_t>(kTokens * kK), 0.0f);
  for (int64_t t = 0; t < kTokens; ++t) x[static_cast<size_t>(t * kK + (t * 2) % kK)] = 1.0f;
  DeviceMemory memory;
  OpRunner run(*cuda, memory);
  const TensorView codes = run.upload(HostTensor::from_raw({kRows, kK / 8}, DType::kI32, words.data()));
  const WeightView w(ConstTensorView(codes.data, DType::kU4, {kRows, kK}, codes.device),
                     run.upload(HostTensor::f32({kRows, 1}, rows.scales)),
                     run.upload(HostTensor::from_raw({kRows, 1}, DType::kI32, zeros.data())));
  const TensorView out = run.output({kTokens, kRows}, DType::kF32);
  cuda->linear({.x = run.upload(HostTensor::bf16({kTokens, kK}, x)), .w = w, .out = out});
  const std::vector<double> got = run.fetch(out);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t n = 0; n < kRows; ++n) {
      const int64_t k = (t * 2) % kK;
      const double expected = (double{rows.q[static_cast<size_t>(n * kK + k)]} - rows.zeros[static_cast<size_t>(n)]) *
                              rows.scales[static_cast<size_t>(n)];
      ASSERT_EQ(got[static_cast<size_t>(t * kRows + n)], expected) << "token " << t << " row " << n;
    }
  }
  for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
}

// Every e2m1 code through the skinny kernel and the widening path, bit for bit: one-hot activations pick single
// weight columns, so out[t][n] = e2m1(q[n][t]) * scale exactly with power-of-two scales (groups of 16: each half of a
// lane's inputs has its own scale).
TEST(CudaInt4Gemm, Fp4DecodesEveryCodeExactly) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend(0, cuda::CudaTuning::from_env());
  constexpr int64_t kRows = 48, kK = 256, kGroup = 16;
  Int4Rows rows;
  rows.resize(kRows, kK, kGroup, true);
  rows.e2m1 = true;
  for (int64_t n = 0; n < kRows; ++n) {
    for (int64_t k = 0; k < kK; ++k) rows.q[static_cast<size_t>(n * kK + k)] = static_cast<uint8_t>((n + 5 * k) % 16);
    for (int64_t g = 0; g < kK / kGroup; ++g) {
      rows.scales[static_cast<size_t>(n * (kK / kGroup) + g)] = (n + g) % 3 == 0 ? 0.125f : (g % 2 == 0 ? 2.0f : 1.0f);
    }
  }
  std::vector<int32_t> words(static_cast<size_t>(kRows * kK / 8));
  pack_int4_codes(rows, words);
  std::vector<float> expected(static_cast<size_t>(kRows * kK));
  rows.dequantize(expected);
  for (const int64_t tokens : {int64_t{64}, int64_t{200}}) {  // the skinny kernel, then the widening path
    std::vector<float> x(static_cast<size_t>(tokens * kK), 0.0f);
    for (int64_t t = 0; t < tokens; ++t) x[static_cast<size_t>(t * kK + (t * 3) % kK)] = 1.0f;
    DeviceMemory memory;
    OpRunner run(*cuda, memory);
    const TensorView codes = run.upload(HostTensor::from_raw({kRows, kK / 8}, DType::kI32, words.data()));
    const WeightView w(ConstTensorView(codes.data, DType::kE2M1, {kRows, kK}, codes.device),
                       run.upload(HostTensor::f32({kRows, kK / kGroup}, rows.scales)), ConstTensorView());
    const TensorView out = run.output({tokens, kRows}, DType::kF32);
    cuda->linear({.x = run.upload(HostTensor::bf16({tokens, kK}, x)), .w = w, .out = out});
    const std::vector<double> got = run.fetch(out);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t n = 0; n < kRows; ++n) {
        const int64_t k = (t * 3) % kK;
        ASSERT_EQ(got[static_cast<size_t>(t * kRows + n)], expected[static_cast<size_t>(n * kK + k)])
            << tokens << " tokens, token " << t << " row " << n << " code "
            << int{rows.q[static_cast<size_t>(n * kK + k)]};
      }
    }
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

// Host-only: the FP4 skinny kernel takes groups of a power of two of at least 16 inputs and no zero points.
TEST(Int4SkinnyGemm, Fp4TakesPowerOfTwoGroupsOfSixteenOrMore) {
  alignas(16) static uint16_t x[8 * 256];
  alignas(16) static uint32_t w[64 * 32];
  alignas(16) static float s[64 * 16];
  alignas(16) static int32_t z[64 * 2];
  cuda::Int4SkinnyGemmParams p{.x = x, .tokens = 8, .k_dim = 256, .x_row_stride = 256, .num_problems = 1,
                               .e2m1 = true};
  p.problems[0] = {.w = w, .scales = s, .out = x, .n_out = 64, .out_row_stride = 64, .group_size = 16};
  EXPECT_TRUE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].group_size = 32;
  EXPECT_TRUE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].group_size = 8;  // narrower than half a lane's inputs
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].group_size = 16;
  p.problems[0].zeros = z;  // e2m1 codes have no zero points
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
}

// Host-only: which operands the INT4 skinny kernel takes (no "Cuda" in the name: runs without a device).
TEST(Int4SkinnyGemm, TakesWholeStepsGroupsOfThirtyTwoAndUpToSixtyFourTokens) {
  alignas(16) static uint16_t x[64 * 256];
  alignas(16) static uint32_t w[64 * 32];
  alignas(16) static float s[64 * 2];
  cuda::Int4SkinnyGemmParams p{.x = x, .tokens = 64, .k_dim = 256, .x_row_stride = 256, .num_problems = 1};
  p.problems[0] = {.w = w, .scales = s, .out = x, .n_out = 64, .out_row_stride = 64, .group_size = 128};
  EXPECT_TRUE(cuda::int4_skinny_gemm_fits(p));
  p.tokens = 65;
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
  p.tokens = 1;
  p.problems[0].group_size = 32;
  EXPECT_TRUE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].group_size = 16;  // narrower than a lane's 32 inputs
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].group_size = 128;
  p.k_dim = p.x_row_stride = 192;  // not a whole number of 128-wide steps
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
  p.k_dim = p.x_row_stride = 256;
  p.problems[0].w = w + 2;  // codes not 16-byte aligned
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
  p.problems[0].w = w;
  p.problems[0].scales = nullptr;
  EXPECT_FALSE(cuda::int4_skinny_gemm_fits(p));
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
