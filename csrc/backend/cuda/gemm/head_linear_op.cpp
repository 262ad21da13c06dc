// head_linear: the per-head GEMV at decode sizes, cuBLAS's strided batched GEMM otherwise.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/gemm/gemm_operands.h"
#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/gemm/head_gemv.cuh"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

void head_linear(CudaContext& ctx, const HeadLinearArgs& a) {
  const auto timing = ctx.timed([&] { return str_cat("head_linear ", a.w.shape.str(), " T=", a.x.shape[0]); });
  constexpr const char* kOp = "cuda head_linear";
  a.validate();
  check_gemm_operands(a.x, a.w, a.out, kOp);
  const int64_t tokens = a.x.shape[0], heads = a.x.shape[1], k = a.x.shape[2], n = a.w.shape[1];
  const int64_t x_stride = a.x_head_stride == 0 ? k : a.x_head_stride;
  const int64_t out_stride = a.out_head_stride == 0 ? n : a.out_head_stride;
  if (tokens == 0 || heads == 0 || n == 0) return;
  if (a.x.dtype == DType::kBF16 && a.w.dtype == DType::kBF16 && a.out.dtype == DType::kBF16) {
    // Whether the GEMV may compute before its wait, and when it lets the next op start: the ledger's answers from
    // the ops still possibly running.
    const Trigger trigger = ctx.ledger().trigger(OpKind::kHeadLinear);
    const HeadGemvParams gemv{.x = static_cast<const uint16_t*>(a.x.data),
                              .w = static_cast<const uint16_t*>(a.w.data),
                              .out = static_cast<uint16_t*>(a.out.data), .tokens = tokens, .heads = heads, .k = k,
                              .n = n, .x_head_stride = x_stride, .out_head_stride = out_stride,
                              .num_sms = ctx.num_sms(),
                              .before_wait = ctx.ledger().head_linear_before_wait(a) ? 1 : 0,
                              .trigger_early = trigger == Trigger::kAtStart ? 1 : 0};
    if (head_gemv_fits(gemv)) {  // decode sizes: weights loaded while the previous kernel drains
      head_gemv(gemv, ctx.launch());
      ctx.ledger().launched(trigger, accesses_of(a));
      return;
    }
  }
#ifdef DEEPINFER_HAVE_CUBLAS
  if (k == 0) {  // every (token, head) row of out is N zeros, rows out_stride apart
    const size_t elem = dtype_size(a.out.dtype);
    CUDA_TRY(cudaMemset2DAsync(a.out.data, static_cast<size_t>(out_stride) * elem, 0, static_cast<size_t>(n) * elem,
                               static_cast<size_t>(tokens * heads), ctx.stream()));
    ctx.ledger().serialized();
    return;
  }
  // Head h: out[:, h, :] = x[:, h, :] · w[h]^T. Column-major per head: out_h^T[N, T] = w_h^T · x_h^T, where x_h is
  // K x T with ld H*x_stride starting at h*x_stride, w_h is K x N (ld K) at h*N*K, and out_h is N x T with ld
  // H*out_stride at h*out_stride.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = cuda_type(a.x.dtype);
  CUDA_TRY(cublasGemmStridedBatchedEx(
      ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(tokens, kOp, "T"),
      gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), n * k, a.x.data, type,
      gemm_int(heads * x_stride, kOp, "H * x head stride"), x_stride, &beta, a.out.data, cuda_type(a.out.dtype),
      gemm_int(heads * out_stride, kOp, "H * out head stride"), out_stride, gemm_int(heads, kOp, "H"),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  ctx.ledger().library_work(accesses_of(a));
#else
  throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
}

}  // namespace deepinfer::cuda
