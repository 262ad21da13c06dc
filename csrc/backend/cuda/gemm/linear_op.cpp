// linear, linear_silu_mul and multi_linear: the skinny GEMM where its rule allows, cuBLAS (or the composed ops)
// otherwise. FP8 weights: the FP8 skinny GEMM up to kFp8SkinnyMaxTokens bf16 tokens, the prefill path (fp8_linear.h)
// otherwise; packed 4-bit weights (INT4, FP4) the same with their own kernels (int4_skinny_gemm.cuh, int4_linear.h).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include <cuda_runtime_api.h>

#include "backend/cuda/elementwise/elementwise_ops.h"
#include "backend/cuda/gemm/fp8_decode_route.h"
#include "backend/cuda/gemm/fp8_linear.h"
#include "backend/cuda/gemm/fp8_skinny_gemm.cuh"
#include "backend/cuda/gemm/gemm_operands.h"
#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/gemm/int4_linear.h"
#include "backend/cuda/gemm/int4_skinny_gemm.cuh"
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

// One product of an FP8 skinny GEMM launch.
struct Fp8SkinnyTarget {
  WeightView w;
  TensorView out;
  SkinnyEpilogue epilogue;
};

Fp8SkinnyGemmParams fp8_skinny_params(const CudaContext& ctx, const ConstTensorView& x,
                                      std::span<const Fp8SkinnyTarget> targets) {
  Fp8SkinnyGemmParams p{.x = static_cast<const uint16_t*>(x.data), .tokens = x.shape[0], .k_dim = x.shape[1],
                        .x_row_stride = x.shape[1], .num_problems = static_cast<int>(targets.size()),
                        .num_sms = ctx.num_sms()};
  for (size_t i = 0; i < targets.size() && i < std::size(p.problems); ++i) {
    const Fp8SkinnyTarget& t = targets[i];
    p.problems[i] = {.w = static_cast<const uint8_t*>(t.w.data),
                     .scale_inv = static_cast<const float*>(t.w.scale_inv.data), .out = t.out.data,
                     .n_out = t.out.shape[1], .out_row_stride = t.out.shape[1], .epilogue = t.epilogue,
                     .out_f32 = t.out.dtype == DType::kF32};
  }
  return p;
}

// FP8 weights at decode sizes go to the FP8 skinny kernel where it takes the operands and fp8_decode_route.h's rule
// keeps them there; CudaTuning::skinny_gemm off sends everything to the prefill path.
bool use_fp8_skinny(const CudaContext& ctx, DType x_dtype, const Fp8SkinnyGemmParams& p,
                    std::span<const Fp8SkinnyTarget> targets) {
  if (!ctx.tuning().skinny_gemm || x_dtype != DType::kBF16 || !fp8_skinny_gemm_fits(p)) return false;
  Fp8DecodeLaunch launch{.tokens = p.tokens, .all_w8a8 = true, .block_scaled_k = fp8_block_scaled_gemm_takes(p.k_dim)};
  for (const Fp8SkinnyTarget& t : targets) {
    launch.code_bytes += t.w.shape[0] * t.w.shape[1];
    launch.all_w8a8 = launch.all_w8a8 && t.w.fp8_activations;
  }
  return fp8_decode_takes_skinny(launch, ctx.tuning().fp8_skinny_max_tokens);
}

// The FP8 skinny kernel with its rescaled activations in the context's workspace (two launches).
void launch_fp8_skinny(CudaContext& ctx, Fp8SkinnyGemmParams p) {
  constexpr size_t kAlign = 256;
  const size_t f16_bytes = (static_cast<size_t>(p.tokens * p.k_dim) * 2 + kAlign - 1) / kAlign * kAlign;
  auto* const base = static_cast<std::byte*>(
      ctx.workspace(WorkspaceUse::kF16Activations,
                    {.bytes = f16_bytes + static_cast<size_t>(p.tokens) * sizeof(float), .alignment = kAlign})
          .data);
  p.x_f16 = reinterpret_cast<uint16_t*>(base);
  p.x_unscale = reinterpret_cast<float*>(base + f16_bytes);
  fp8_skinny_gemm(p, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

// One product of a packed 4-bit (INT4 or FP4) skinny GEMM launch.
struct Int4SkinnyTarget {
  WeightView w;
  TensorView out;
  SkinnyEpilogue epilogue;
};

Int4SkinnyGemmParams int4_skinny_params(const CudaContext& ctx, const ConstTensorView& x,
                                        std::span<const Int4SkinnyTarget> targets) {
  Int4SkinnyGemmParams p{.x = static_cast<const uint16_t*>(x.data), .tokens = x.shape[0], .k_dim = x.shape[1],
                         .x_row_stride = x.shape[1], .num_problems = static_cast<int>(targets.size()),
                         .e2m1 = !targets.empty() && targets[0].w.is_fp4(), .num_sms = ctx.num_sms()};
  for (size_t i = 0; i < targets.size() && i < std::size(p.problems); ++i) {
    const Int4SkinnyTarget& t = targets[i];
    p.problems[i] = {.w = static_cast<const uint32_t*>(t.w.data),
                     .scales = static_cast<const float*>(t.w.scale_inv.data),
                     .zeros = static_cast<const int32_t*>(t.w.zeros.data), .out = t.out.data,
                     .n_out = t.out.shape[1], .out_row_stride = t.out.shape[1], .group_size = t.w.group_size(),
                     .epilogue = t.epilogue, .out_f32 = t.out.dtype == DType::kF32};
  }
  return p;
}

// Packed 4-bit weights at decode sizes go to the INT4 skinny kernel where it takes the operands, as FP8 ones do (one
// launch holds INT4 or FP4 weights, never both: multi_linear's callers check).
bool use_int4_skinny(const CudaContext& ctx, DType x_dtype, const Int4SkinnyGemmParams& p) {
  return ctx.tuning().skinny_gemm && x_dtype == DType::kBF16 && int4_skinny_gemm_fits(p);
}

void launch_int4_skinny(CudaContext& ctx, const Int4SkinnyGemmParams& p) {
  int4_skinny_gemm(p, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

bool is_quantized(const WeightView& w) { return w.is_fp8() || w.is_packed4(); }

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
  const SkinnyEpilogue epilogue = a.accumulate ? SkinnyEpilogue::kAccumulate : SkinnyEpilogue::kStore;
  if (a.w.is_packed4()) {
    const Int4SkinnyTarget target{a.w, a.out, epilogue};
    const Int4SkinnyGemmParams int4 = int4_skinny_params(ctx, a.x, {&target, 1});
    if (use_int4_skinny(ctx, a.x.dtype, int4)) {
      launch_int4_skinny(ctx, int4);
    } else {
      int4_linear_prefill(ctx, a.x, a.w, a.out, a.accumulate);
    }
    return;
  }
  if (a.w.is_fp8()) {
    const Fp8SkinnyTarget target{a.w, a.out, epilogue};
    const Fp8SkinnyGemmParams fp8 = fp8_skinny_params(ctx, a.x, {&target, 1});
    if (use_fp8_skinny(ctx, a.x.dtype, fp8, {&target, 1})) {
      launch_fp8_skinny(ctx, fp8);
    } else {
      fp8_linear_prefill(ctx, a.x, a.w, a.out, a.accumulate);
    }
    return;
  }
  const SkinnyGemmParams skinny = skinny_params(ctx, a.x, {{a.w, a.out, epilogue}});
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
  if (a.w.is_fp8() && a.out.numel() > 0) {
    const Fp8SkinnyTarget target{a.w, a.out, SkinnyEpilogue::kSiluMul};
    const Fp8SkinnyGemmParams fp8 = fp8_skinny_params(ctx, a.x, {&target, 1});
    if (use_fp8_skinny(ctx, a.x.dtype, fp8, {&target, 1})) {
      const auto timing = ctx.timed([&] {
        return str_cat("linear_silu_mul fp8 [", a.w.shape[0], " x ", a.w.shape[1], "] M=", a.x.shape[0]);
      });
      launch_fp8_skinny(ctx, fp8);
      return;
    }
  }
  if (a.w.is_packed4() && a.out.numel() > 0) {
    const Int4SkinnyTarget target{a.w, a.out, SkinnyEpilogue::kSiluMul};
    const Int4SkinnyGemmParams int4 = int4_skinny_params(ctx, a.x, {&target, 1});
    if (use_int4_skinny(ctx, a.x.dtype, int4)) {
      const auto timing = ctx.timed([&] {
        return str_cat("linear_silu_mul ", dtype_name(a.w.dtype), " [", a.w.shape[0], " x ", a.w.shape[1], "] M=",
                       a.x.shape[0]);
      });
      launch_int4_skinny(ctx, int4);
      return;
    }
  }
  const SkinnyGemmParams skinny = skinny_params(ctx, a.x, {{a.w, a.out, SkinnyEpilogue::kSiluMul}});
  if (a.out.numel() == 0 || is_quantized(a.w) || !use_skinny(ctx, a.x.dtype, skinny)) {
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
  static_assert(kSkinnyMaxProblems >= kMultiLinearMaxTargets && kFp8SkinnyMaxProblems >= kMultiLinearMaxTargets &&
                    kInt4SkinnyMaxProblems >= kMultiLinearMaxTargets,
                "one launch takes every target");
  std::array<SkinnyTarget, kMultiLinearMaxTargets> targets{};  // no allocation per step
  for (size_t i = 0; i < a.targets.size(); ++i) {
    const LinearTarget& t = a.targets[i];
    check_gemm_operands(a.x, t.w, t.out, "cuda multi_linear");
    targets[i] = {t.w, t.out, t.silu_mul ? SkinnyEpilogue::kSiluMul : SkinnyEpilogue::kStore};
  }
  // FP8 (INT4, FP4) targets share a launch only with FP8 (INT4, FP4) targets: all of them in the FP8 (INT4) skinny
  // kernel, or op by op.
  const auto all = [&](auto pred) { return std::all_of(a.targets.begin(), a.targets.end(), pred); };
  const bool all_fp8 = all([](const LinearTarget& t) { return t.w.is_fp8(); });
  const bool all_int4 = all([](const LinearTarget& t) { return t.w.is_int4(); }) ||
                        all([](const LinearTarget& t) { return t.w.is_fp4(); });
  const bool any_quantized =
      std::any_of(a.targets.begin(), a.targets.end(), [](const LinearTarget& t) { return is_quantized(t.w); });
  if (all_int4 && a.x.shape[0] > 0) {
    std::array<Int4SkinnyTarget, kMultiLinearMaxTargets> int4_targets{};
    for (size_t i = 0; i < a.targets.size(); ++i) int4_targets[i] = {a.targets[i].w, a.targets[i].out, targets[i].epilogue};
    const Int4SkinnyGemmParams int4 =
        int4_skinny_params(ctx, a.x, std::span<const Int4SkinnyTarget>(int4_targets.data(), a.targets.size()));
    if (use_int4_skinny(ctx, a.x.dtype, int4)) {
      const auto timing =
          ctx.timed([&] { return str_cat("multi_linear ", dtype_name(a.targets[0].w.dtype), " M=", a.x.shape[0]); });
      launch_int4_skinny(ctx, int4);
      return;
    }
  }
  if (all_fp8 && a.x.shape[0] > 0) {
    std::array<Fp8SkinnyTarget, kMultiLinearMaxTargets> fp8_targets{};
    for (size_t i = 0; i < a.targets.size(); ++i) fp8_targets[i] = {a.targets[i].w, a.targets[i].out, targets[i].epilogue};
    const std::span<const Fp8SkinnyTarget> fp8_span(fp8_targets.data(), a.targets.size());
    const Fp8SkinnyGemmParams fp8 = fp8_skinny_params(ctx, a.x, fp8_span);
    if (use_fp8_skinny(ctx, a.x.dtype, fp8, fp8_span)) {
      const auto timing = ctx.timed([&] { return str_cat("multi_linear fp8 M=", a.x.shape[0]); });
      launch_fp8_skinny(ctx, fp8);
      return;
    }
  }
  const SkinnyGemmParams skinny =
      skinny_params(ctx, a.x, std::span<const SkinnyTarget>(targets.data(), a.targets.size()));
  if (a.x.shape[0] == 0 || any_quantized || !use_skinny(ctx, a.x.dtype, skinny)) {
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
