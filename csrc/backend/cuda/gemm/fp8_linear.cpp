// The FP8 prefill GEMMs (fp8_linear.h): cuBLASLt's block-scaled FP8 GEMM for W8A8, the dequantize-then-dense-GEMM
// path otherwise.
#include "backend/cuda/gemm/fp8_linear.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>

#include "backend/cuda/gemm/dequantized_linear.h"
#include "backend/cuda/gemm/fp8_convert.cuh"
#include "backend/cuda/gemm/gemm_operands.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/error.h"

#ifdef DEEPINFER_HAVE_CUBLAS
#include <cublasLt.h>
#endif

namespace deepinfer::cuda {
namespace {

// cuBLASLt's workspace for the block-scaled kernels (what CublasHandle gives the dense ones).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
constexpr size_t kAlign = 256;

constexpr size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

#ifdef DEEPINFER_HAVE_CUBLAS

// The weight widened into x's dtype, a chunk of block rows at a time (dequantized_linear.h).
void dequantized_gemm(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                      bool accumulate) {
  const int64_t k = w.shape[1];
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scale_inv.data);
  dequantized_linear(ctx, x, w.shape[0], out, accumulate, kFp8Block,
                     [&](int64_t first_row, int64_t rows, void* buffer, bool f32) {
                       dequantize_fp8_rows(codes, scales, first_row, rows, k, buffer, f32, ctx.launch());
                       ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
                     });
}

#if CUBLAS_VERSION >= 120900
#define DEEPINFER_HAVE_BLOCK_SCALED_FP8 1

template <typename Handle>
using LtPtr = std::unique_ptr<std::remove_pointer_t<Handle>, cublasStatus_t (*)(Handle)>;

// The descriptors of out^T[N, M] (+)= w[N, K] · xq[M, K]^T, seen column-major: A = w (K x N, transposed: the TN
// form FP8 requires), B = the quantized x (K x M), C = D = out^T (N x M). A's scales are the weight's 128x128 grid
// as DeepSeek stores it (row-major [N / 128][K / 128], i.e. column-major with K blocks contiguous); B's are one per
// 128 channels per token, token-contiguous ([K / 128][M], what quantize_fp8_activations writes).
struct BlockScaledGemm {
  LtPtr<cublasLtMatmulDesc_t> desc{nullptr, cublasLtMatmulDescDestroy};
  LtPtr<cublasLtMatrixLayout_t> a{nullptr, cublasLtMatrixLayoutDestroy};
  LtPtr<cublasLtMatrixLayout_t> b{nullptr, cublasLtMatrixLayoutDestroy};
  LtPtr<cublasLtMatrixLayout_t> c{nullptr, cublasLtMatrixLayoutDestroy};

  BlockScaledGemm(int64_t m, int64_t n, int64_t k, DType out_dtype, const void* w_scale, const void* x_scale) {
    cublasLtMatmulDesc_t d = nullptr;
    CUDA_TRY(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    desc.reset(d);
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set(CUBLASLT_MATMUL_DESC_TRANSA, trans_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, trans_b);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale);
    a = layout(CUDA_R_8F_E4M3, k, n, k);
    b = layout(CUDA_R_8F_E4M3, k, m, k);
    c = layout(cuda_type(out_dtype), n, m, n);
  }

  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    CUDA_TRY(cublasLtMatmulDescSetAttribute(desc.get(), attribute, &value, sizeof(value)));
  }
  static LtPtr<cublasLtMatrixLayout_t> layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l = nullptr;
    CUDA_TRY(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
    return {l, cublasLtMatrixLayoutDestroy};
  }

  // cuBLASLt's first pick for this problem, or none (no block-scaled kernel for these sizes on this GPU).
  std::optional<cublasLtMatmulAlgo_t> algorithm(cublasLtHandle_t lt) const {
    cublasLtMatmulPreference_t p = nullptr;
    CUDA_TRY(cublasLtMatmulPreferenceCreate(&p));
    const LtPtr<cublasLtMatmulPreference_t> pref{p, cublasLtMatmulPreferenceDestroy};
    const uint64_t workspace = kLtWorkspaceBytes;
    CUDA_TRY(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                  sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt, desc.get(), a.get(), b.get(), c.get(), c.get(), p, 1, &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return std::nullopt;
    return result.algo;
  }
};

// cuBLAS's handle holds a cuBLASLt one: the documented cast gives cuBLASLt the same stream-bound library context.
cublasLtHandle_t lt_handle(CudaContext& ctx) { return reinterpret_cast<cublasLtHandle_t>(ctx.cublas()); }

// The scale grid's rows must be 16-byte aligned for cuBLASLt (K / 128 scales a multiple of 4), and x's rows for the
// quantization kernel a whole number of 128-channel blocks.
bool block_scaled_shape(int64_t k) { return k > 0 && k % (4 * kFp8Block) == 0; }

// W8A8 through cuBLASLt; false (nothing queued) when it has no kernel for the problem.
bool block_scaled_gemm(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                       bool accumulate) {
  const int64_t m = x.shape[0], n = w.shape[0], k = w.shape[1];
  if (!block_scaled_shape(k)) return false;
  const size_t code_bytes = align_up(static_cast<size_t>(m * k));
  const size_t scale_bytes = align_up(static_cast<size_t>(m * (k / kFp8Block)) * sizeof(float));
  auto* const base = static_cast<std::byte*>(
      ctx.workspace(WorkspaceUse::kFp8Activations,
                    {.bytes = code_bytes + scale_bytes + kLtWorkspaceBytes, .alignment = kAlign})
          .data);
  auto* const codes = reinterpret_cast<uint8_t*>(base);
  auto* const scales = reinterpret_cast<float*>(base + code_bytes);
  void* const lt_workspace = base + code_bytes + scale_bytes;
  const BlockScaledGemm gemm(m, n, k, out.dtype, w.scale_inv.data, scales);
  const std::optional<cublasLtMatmulAlgo_t> algo = gemm.algorithm(lt_handle(ctx));
  if (!algo) return false;
  quantize_fp8_activations(x.data, x.dtype == DType::kF32, m, k, codes, scales, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUDA_TRY(cublasLtMatmul(lt_handle(ctx), gemm.desc.get(), &alpha, w.data, gemm.a.get(), codes, gemm.b.get(), &beta,
                          out.data, gemm.c.get(), out.data, gemm.c.get(), &*algo, lt_workspace, kLtWorkspaceBytes,
                          ctx.stream()));
  ctx.ledger().library_work(OpAccesses::any());
  return true;
}
#endif  // CUBLAS_VERSION >= 120900

#endif  // DEEPINFER_HAVE_CUBLAS

}  // namespace

void fp8_linear_prefill(CudaContext& ctx, const ConstTensorView& x, const WeightView& w, const TensorView& out,
                        bool accumulate) {
  DI_CHECK(w.is_fp8(), "fp8_linear_prefill: w is ", dtype_name(w.dtype), ", not an FP8 weight");
#ifdef DEEPINFER_HAVE_CUBLAS
#ifdef DEEPINFER_HAVE_BLOCK_SCALED_FP8
  if (w.fp8_activations && block_scaled_gemm(ctx, x, w, out, accumulate)) return;
#endif
  dequantized_gemm(ctx, x, w, out, accumulate);
#else
  (void)ctx, (void)x, (void)out, (void)accumulate;
  throw UnsupportedOp("cuda linear: FP8 weights past the skinny kernel need cuBLAS, which this build lacks");
#endif
}

bool fp8_block_scaled_gemm_available(CudaContext& ctx, int64_t m, int64_t n, int64_t k, DType out_dtype) {
#if defined(DEEPINFER_HAVE_CUBLAS) && defined(DEEPINFER_HAVE_BLOCK_SCALED_FP8)
  if (!block_scaled_shape(k) || m <= 0 || n <= 0) return false;
  return BlockScaledGemm(m, n, k, out_dtype, nullptr, nullptr).algorithm(lt_handle(ctx)).has_value();
#else
  (void)ctx, (void)m, (void)n, (void)k, (void)out_dtype;
  return false;
#endif
}

bool fp8_block_scaled_gemm_takes(int64_t k) {
#if defined(DEEPINFER_HAVE_CUBLAS) && defined(DEEPINFER_HAVE_BLOCK_SCALED_FP8)
  return block_scaled_shape(k);
#else
  (void)k;
  return false;
#endif
}

}  // namespace deepinfer::cuda
