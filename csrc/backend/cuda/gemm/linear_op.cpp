// linear, linear_silu_mul and multi_linear: the skinny GEMM where its rule allows, cuBLAS (or the composed ops)
// otherwise.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include <cuda_runtime_api.h>

#include "backend/cuda/elementwise/elementwise_ops.h"
#include "backend/cuda/gemm/gemm_operands.h"
#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/gemm/skinny_gemm.cuh"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {
namespace {

// One product of a skinny GEMM launch: weights, output, epilogue.
struct SkinnyTarget {
  ConstTensorView w;
  TensorView out;
  SkinnyEpilogue epilogue;
};

SkinnyGemmParams skinny_params(const CudaContext& ctx, const ConstTensorView& x,
                               std::span<const SkinnyTarget> targets) {
  SkinnyGemmParams p{.x = static_cast<const uint16_t*>(x.data), .tokens = x.shape[0], .k_dim = x.shape[1],
                     .x_row_stride = x.shape[1], .num_problems = static_cast<int>(targets.size()),
                     .num_sms = ctx.num_sms()};
  for (size_t i = 0; i < targets.size() && i < std::size(p.problems); ++i) {
    const SkinnyTarget& t = targets[i];
    p.problems[i] = {.w = static_cast<const uint16_t*>(t.w.data), .out = t.out.data, .n_out = t.out.shape[1],
                     .out_row_stride = t.out.shape[1], .epilogue = t.epilogue,
                     .out_f32 = t.out.dtype == DType::kF32};
  }
  return p;
}
SkinnyGemmParams skinny_params(const CudaContext& ctx, const ConstTensorView& x,
                               std::initializer_list<SkinnyTarget> targets) {
  return skinny_params(ctx, x, std::span<const SkinnyTarget>(targets.begin(), targets.size()));
}

// Decode-sized bf16 GEMMs go to the skinny kernel where it did not lose to cuBLAS on an H200 (benchmarks/results/
// skinny_gemm_h200.md, graph-replayed, weights cold in L2): up to 8 tokens with weights up to 48 MB, the gated MLP
// projection at any size (it also saves the silu_mul kernel), and above all several products of one x in one launch
// (q_proj with kv_a_proj). cuBLAS keeps 9 tokens and more and the large matrices (both stream them near copy
// bandwidth); the per-head products are head_linear's (head_gemv.cu or cuBLAS). CudaTuning::skinny_gemm off sends
// every GEMM to cuBLAS.
bool use_skinny(const CudaContext& ctx, DType dtype, const SkinnyGemmParams& p) {
  constexpr int64_t kMaxWeightBytes = int64_t{48} << 20;
  if (!ctx.tuning().skinny_gemm || dtype != DType::kBF16 || !skinny_gemm_fits(p)) return false;
  for (int i = 0; i < p.num_problems; ++i) {
    const SkinnyProblem& q = p.problems[i];
    const bool silu_mul = q.epilogue == SkinnyEpilogue::kSiluMul;
    if (!silu_mul && q.n_out * p.k_dim * 2 > kMaxWeightBytes) return false;
  }
  return true;
}

}  // namespace

void linear(CudaContext& ctx, const LinearArgs& a) {
  const auto timing =
      ctx.timed([&] { return str_cat("linear [", a.w.shape[0], " x ", a.w.shape[1], "] M=", a.x.shape[0]); });
  constexpr const char* kOp = "cuda linear";
  a.validate();
  check_gemm_operands(a.x, a.w, a.out, kOp);
  const int64_t m = a.x.shape[0], n = a.w.shape[0], k = a.x.shape[1];
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!a.accumulate) {
      CUDA_TRY(cudaMemsetAsync(a.out.data, 0, a.out.bytes(), ctx.stream()));
      ctx.ledger().serialized();
    }
    return;
  }
  const SkinnyGemmParams skinny = skinny_params(
      ctx, a.x, {{a.w, a.out, a.accumulate ? SkinnyEpilogue::kAccumulate : SkinnyEpilogue::kStore}});
  if (use_skinny(ctx, a.x.dtype, skinny)) {
    skinny_gemm(skinny, ctx.launch());
    ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
    return;
  }
#ifdef DEEPINFER_HAVE_CUBLAS
  // Row-major out[M, N] = x[M, K] · w[N, K]^T is, column-major, out^T[N, M] = w^T · x^T: cuBLAS sees w as a
  // column-major K x N matrix (ld K) to transpose, x as K x M (ld K), and out as N x M (ld N).
  const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
  const cudaDataType_t type = cuda_type(a.x.dtype);
  CUDA_TRY(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(m, kOp, "M"),
                        gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), a.x.data, type,
                        static_cast<int>(k), &beta, a.out.data, cuda_type(a.out.dtype), static_cast<int>(n),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  ctx.ledger().library_work(accesses_of(a));
#else
  throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
}

void linear_silu_mul(CudaContext& ctx, const LinearSiluMulArgs& a) {
  a.validate();
  check_gemm_operands(a.x, a.w, a.out, "cuda linear_silu_mul");
  const SkinnyGemmParams skinny = skinny_params(ctx, a.x, {{a.w, a.out, SkinnyEpilogue::kSiluMul}});
  if (a.out.numel() == 0 || !use_skinny(ctx, a.x.dtype, skinny)) {
    // The composition Backend::linear_silu_mul runs (dense_composed.cpp): cuBLAS, then the silu_mul kernel.
    Tensor gate_up = ctx.empty({a.x.shape[0], a.w.shape[0]}, a.out.dtype);  // [M, 2I]
    linear(ctx, {.x = a.x, .w = a.w, .out = gate_up.view()});
    silu_mul(ctx, {.gate_up = gate_up.cview(), .out = a.out});
    return;
  }
  const auto timing = ctx.timed(
      [&] { return str_cat("linear_silu_mul [", a.w.shape[0], " x ", a.w.shape[1], "] M=", a.x.shape[0]); });
  skinny_gemm(skinny, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

void multi_linear(CudaContext& ctx, const MultiLinearArgs& a) {
  a.validate();
  static_assert(kSkinnyMaxProblems >= kMultiLinearMaxTargets, "one launch takes every target");
  std::array<SkinnyTarget, kMultiLinearMaxTargets> targets{};  // no allocation per step
  for (size_t i = 0; i < a.targets.size(); ++i) {
    const LinearTarget& t = a.targets[i];
    check_gemm_operands(a.x, t.w, t.out, "cuda multi_linear");
    targets[i] = {t.w, t.out, t.silu_mul ? SkinnyEpilogue::kSiluMul : SkinnyEpilogue::kStore};
  }
  const SkinnyGemmParams skinny =
      skinny_params(ctx, a.x, std::span<const SkinnyTarget>(targets.data(), a.targets.size()));
  if (a.x.shape[0] == 0 || !use_skinny(ctx, a.x.dtype, skinny)) {
    // The composition Backend::multi_linear runs: one op per target, each with its own choice of kernel.
    for (const LinearTarget& t : a.targets) {
      if (t.silu_mul) {
        linear_silu_mul(ctx, {.x = a.x, .w = t.w, .out = t.out});
      } else {
        linear(ctx, {.x = a.x, .w = t.w, .out = t.out});
      }
    }
    return;
  }
  const auto timing = ctx.timed([&] {
    std::string label = str_cat("multi_linear M=", a.x.shape[0]);
    for (const LinearTarget& t : a.targets) label += str_cat(" [", t.w.shape[0], " x ", t.w.shape[1], "]");
    return label;
  });
  skinny_gemm(skinny, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
