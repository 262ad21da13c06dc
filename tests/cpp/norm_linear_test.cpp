// norm_linear against the ops it stands for, run explicitly: a copy of the residual, add_rms_norm (rms_norm without
// x), then multi_linear. On the CPU the results must be the same bits; on CUDA the fused kernel (the skinny GEMM with
// its norm prologue) must give the same bits as the separate kernels at decode sizes. The op's naive-formula cases
// and its rejected arguments are in norm_linear_cases.h (run by the shared op harness).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "norm_linear_cases.h"
#include "op_test_harness.h"

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "device_memory.h"
#endif

namespace deepinfer::op_test {
namespace {

// One set of the op's tensors on a runner, from the same host values: inputs read-only, outputs NaN-filled.
struct NormLinearTensors {
  bool with_x = false;
  ConstTensorView x, residual_in, norm_weight;
  TensorView residual_out, normed;
  std::vector<LinearTarget> targets;

  NormLinearTensors(OpRunner& run, const NormLinearShape& s, const NormLinearValues& v, DType dtype,
                    bool out0_f32) {
    const int64_t t = s.tokens, d = s.dim;
    with_x = s.with_x;
    const auto upload = [&](Shape shape, const std::vector<float>& values) {
      return run.upload(dtype == DType::kBF16 ? HostTensor::bf16(shape, values) : HostTensor::f32(shape, values));
    };
    x = s.with_x ? upload({t, d}, v.x) : ConstTensorView{};
    residual_in = upload({t, d}, v.residual);
    norm_weight = run.upload(HostTensor::f32({d}, v.norm));
    residual_out = run.output({t, d}, dtype);
    normed = run.output({t, d}, dtype);
    for (size_t i = 0; i < s.widths.size(); ++i) {
      targets.push_back({.w = upload({s.weight_rows(i), d}, v.ws[i]),
                         .out = run.output({t, s.widths[i]}, i == 0 && out0_f32 ? DType::kF32 : dtype),
                         .silu_mul = i == 1});
    }
  }

  NormLinearArgs args() const {
    return {.x = x, .residual_in = residual_in, .residual_out = residual_out, .norm_weight = norm_weight,
            .eps = kNormLinearEps, .normed = normed, .targets = targets};
  }

  // The composition, op by op, on `backend`.
  void run_composed(Backend& backend) const {
    backend.copy_strided({.src = residual_in, .dst = residual_out});
    if (with_x) {
      backend.add_rms_norm({.residual = residual_out, .x = x, .weight = norm_weight, .out = normed,
                            .eps = kNormLinearEps});
    } else {
      backend.rms_norm({.x = residual_out, .weight = norm_weight, .out = normed, .eps = kNormLinearEps});
    }
    backend.multi_linear({.x = normed, .targets = targets});
  }

  std::vector<std::pair<std::string, HostTensor>> outputs(OpRunner& run) const {
    std::vector<std::pair<std::string, HostTensor>> outs = {{"residual_out", run.download(residual_out)},
                                                            {"normed", run.download(normed)}};
    for (size_t i = 0; i < targets.size(); ++i) outs.emplace_back(str_cat("out", i), run.download(targets[i].out));
    return outs;
  }
};

void expect_same_bits(OpRunner& run, const NormLinearTensors& op, const NormLinearTensors& composed) {
  const auto got = op.outputs(run), want = composed.outputs(run);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].second.bytes, want[i].second.bytes) << got[i].first;
  for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
}

// The CPU backend's norm_linear (the reference) is its composition, to the bit: several rows and widths, with and
// without x, one to three targets (the second gated).
TEST(NormLinear, CpuEqualsTheComposedOps) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const NormLinearShape shapes[] = {{.tokens = 1, .dim = 64, .widths = {48, 16}, .with_x = true},
                                    {.tokens = 3, .dim = 200, .widths = {7, 5, 9}, .with_x = true},
                                    {.tokens = 8, .dim = 2048, .widths = {64}, .with_x = true},
                                    {.tokens = 5, .dim = 96, .widths = {33, 4}, .with_x = false},
                                    {.tokens = 0, .dim = 32, .widths = {3}, .with_x = true}};
  uint64_t seed = 1;
  for (const NormLinearShape& s : shapes) {
    SCOPED_TRACE(s.name());
    const NormLinearValues v(s, seed++);
    HostMemory memory;
    OpRunner run(*cpu, memory);
    const NormLinearTensors op(run, s, v, DType::kF32, false), composed(run, s, v, DType::kF32, false);
    cpu->norm_linear(op.args());
    composed.run_composed(*cpu);
    expect_same_bits(run, op, composed);
  }
}

// A rejected call writes nothing: the residual, normed and target buffers keep their bytes (the op validates every
// argument before its first write), here with residual_out aliasing residual_in and with a target that does not fit.
TEST(NormLinear, RejectsBadArgumentsBeforeWritingAnything) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const NormLinearShape s{.tokens = 2, .dim = 32, .widths = {8}, .with_x = true};
  const NormLinearValues v(s, 7);
  HostMemory memory;
  OpRunner run(*cpu, memory);
  NormLinearTensors t(run, s, v, DType::kF32, false);
  const auto before = t.outputs(run);
  NormLinearArgs aliased = t.args();
  aliased.residual_out = TensorView(const_cast<void*>(t.residual_in.data), DType::kF32, t.residual_in.shape,
                                    Device::kCpu);
  EXPECT_THROW(cpu->norm_linear(aliased), Error);
  const std::vector<float> wide(static_cast<size_t>(8 * 64), 1.0f);
  const std::array bad_target{LinearTarget{.w = run.upload(HostTensor::f32({8, 64}, wide)), .out = t.targets[0].out}};
  NormLinearArgs bad_k = t.args();
  bad_k.targets = bad_target;
  EXPECT_THROW(cpu->norm_linear(bad_k), Error);
  NormLinearArgs short_weight = t.args();
  short_weight.norm_weight = short_weight.norm_weight.rows(0, 16);
  EXPECT_THROW(cpu->norm_linear(short_weight), Error);
  const auto after = t.outputs(run);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i].second.bytes, before[i].second.bytes) << after[i].first;
  for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
}

#ifdef DEEPINFER_HAVE_CUDA
// The fused CUDA path (one skinny GEMM launch whose CTAs normalize the rows themselves) against add_rms_norm (or
// rms_norm) then multi_linear on the CUDA backend itself (Backend's default norm_linear): the new residual, the normed
// rows and every product equal bit for bit. Decode sizes (1, 3 and 8 tokens) at V2-Lite's hidden size (q_proj with
// kv_a, the router's float32 logits with K split over a cluster, the dense MLP's gated projection) and V3's (q_a_proj
// with kv_a, the router), with and without the sublayer output.
TEST(CudaBackend, NormLinearMatchesAddRmsNormThenMultiLinearBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  struct Targets {
    std::vector<int64_t> widths;  // target 1 gated
    bool out0_f32;
  };
  const std::vector<std::pair<int64_t, std::vector<Targets>>> dims = {
      {2048, {{{3072, 576}, false}, {{64}, true}, {{2048, 1408}, false}}},
      {7168, {{{1536, 576}, false}, {{256}, true}}}};
  uint64_t seed = 100;
  for (const auto& [dim, target_sets] : dims) {
    for (const Targets& ts : target_sets) {
      for (const int64_t tokens : {int64_t{1}, int64_t{3}, int64_t{8}}) {
        for (const bool with_x : {true, false}) {
          const NormLinearShape s{.tokens = tokens, .dim = dim, .widths = ts.widths, .with_x = with_x};
          SCOPED_TRACE(str_cat(s.name(), ts.out0_f32 ? " out0 f32" : ""));
          const NormLinearValues v(s, seed++);
          DeviceMemory memory;
          OpRunner run(*cuda, memory);
          const NormLinearTensors fused(run, s, v, DType::kBF16, ts.out0_f32);
          const NormLinearTensors composed(run, s, v, DType::kBF16, ts.out0_f32);
          cuda->norm_linear(fused.args());
          cuda->Backend::norm_linear(composed.args());
          expect_same_bits(run, fused, composed);
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace deepinfer::op_test
