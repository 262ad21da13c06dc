#include "backend/cuda/gemm/dequantized_linear.h"

#include <algorithm>
#include <cstddef>

#include "backend/cuda/gemm/gemm_operands.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/error.h"

namespace deepinfer::cuda {
namespace {

// Weight rows widened at a time: 64 MB of bf16 is 4.5k rows of K = 7168, wide enough for cuBLAS's best tiles, and
// small beside a weight of a few hundred MB.
constexpr int64_t kChunkBytes = int64_t{64} << 20;
constexpr size_t kAlign = 256;

}  // namespace

void dequantized_linear(CudaContext& ctx, const ConstTensorView& x, int64_t n, const TensorView& out, bool accumulate,
                        int64_t row_multiple, const WidenRows& widen) {
#ifdef DEEPINFER_HAVE_CUBLAS
  constexpr const char* kOp = "cuda linear (quantized weight, widened)";
  const int64_t m = x.shape[0], k = x.shape[1];
  const bool f32 = x.dtype == DType::kF32;
  const int64_t elem = f32 ? 4 : 2;
  const int64_t chunk = std::min(n, std::max(row_multiple, kChunkBytes / (k * elem) / row_multiple * row_multiple));
  void* const rows_buffer =
      ctx.workspace(WorkspaceUse::kWeightDequant, {.bytes = static_cast<size_t>(chunk * k * elem), .alignment = kAlign})
          .data;
  const int64_t out_elem = static_cast<int64_t>(dtype_size(out.dtype));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType_t type = cuda_type(x.dtype);
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t rows = std::min(chunk, n - first);
    widen(first, rows, rows_buffer, f32);
    // Row-major out[M, rows] (rows n apart) (+)= x[M, K] · w[rows, K]^T: column-major out^T = w^T · x^T, as
    // linear_op.cpp does it.
    CUDA_TRY(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(rows, kOp, "N"), gemm_int(m, kOp, "M"),
                          gemm_int(k, kOp, "K"), &alpha, rows_buffer, type, gemm_int(k, kOp, "K"), x.data, type,
                          gemm_int(k, kOp, "K"), &beta, static_cast<std::byte*>(out.data) + first * out_elem,
                          cuda_type(out.dtype), gemm_int(n, kOp, "N"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    ctx.ledger().library_work(OpAccesses::any());
  }
#else
  (void)ctx, (void)x, (void)n, (void)out, (void)accumulate, (void)row_multiple, (void)widen;
  throw UnsupportedOp("cuda linear: quantized weights past the skinny kernels need cuBLAS, which this build lacks");
#endif
}

}  // namespace deepinfer::cuda
