// mla_prefill: the argument checks, the workspace, the gather, the decompression GEMM (cuBLAS) and the attention.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/mla/latent_fp8_rows.h"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/cuda/mla/mla_prefill.cuh"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/op_checks.h"

namespace deepinfer::cuda {

// Decompressing prefill: gather each prefill sequence's latent rows (the sequences' contexts back to back), decompress
// them with one cuBLAS GEMM (kv = c_kv · kv_b^T: per head 128 k_nope then 128 v columns), then the causal
// flash-attention kernel reads q, the kv rows and the latents' k_pe. Over an FP8 cache the gather widens the rows into
// the same bf16 workspace, and the rest runs as over a bf16 cache.
void mla_prefill(CudaContext& ctx, const MlaPrefillArgs& a) {
  const auto timing = ctx.timed("mla_prefill");
  constexpr const char* kOp = "cuda mla_prefill";
  a.validate();  // shapes and dtypes; the metadata is device memory, checked on the host before its upload
  check_on_device(a.q, kOp, "q");
  check_on_device(a.cache, kOp, "cache");
  check_on_device(a.kv_b, kOp, "kv_b");
  check_on_device(a.out, kOp, "out");
  check_on_device(a.meta.query_start, kOp, "query_start");
  check_on_device(a.meta.context_lens, kOp, "context_lens");
  check_on_device(a.meta.page_table, kOp, "page_table");
  const int64_t tokens = a.q.shape[0], heads = a.q.shape[1];
  const int64_t seqs = a.meta.num_seqs, max_ctx = a.meta.max_context_len;
  if (tokens == 0 || heads == 0 || seqs == 0 || max_ctx == 0) return;
  const bool fp8 = is_fp8_latent_cache(a.cache);
  // The rope width: q's columns past nope (a row of an FP8 cache counts bytes, not values).
  const int64_t rope = a.q.shape[2] - a.qk_nope_head_dim;
  const bool bf16_cache = a.cache.dtype == DType::kBF16 && a.cache.shape[2] == kMlaPrefillRank + kMlaPrefillRope;
  if (a.q.dtype != DType::kBF16 || a.kv_b.dtype != DType::kBF16 || a.kv_lora_rank != kMlaPrefillRank ||
      rope != kMlaPrefillRope || !(bf16_cache || fp8) || a.qk_nope_head_dim != kMlaPrefillNope ||
      a.v_head_dim != kMlaPrefillV) {
    throw UnsupportedOp(str_cat(kOp, ": the kernels take bfloat16 q and kv_b, a bfloat16 or FP8 cache, at DeepSeek's "
                                "dims (rank ", kMlaPrefillRank, ", rope ", kMlaPrefillRope, ", nope ", kMlaPrefillNope,
                                ", v ", kMlaPrefillV, "); got ", dtype_name(a.q.dtype), " q, ",
                                dtype_name(a.kv_b.dtype), " kv_b, a ", dtype_name(a.cache.dtype), " cache of rows ",
                                a.cache.shape[2], " wide, rank ", a.kv_lora_rank, ", rope ", rope, ", nope ",
                                a.qk_nope_head_dim, ", v ", a.v_head_dim));
  }
  if (fp8) checked_fp8_latent_layout(a.cache, a.kv_lora_rank, rope, kOp);  // 656-byte rows
#ifdef DEEPINFER_HAVE_CUBLAS
  // Workspace rows are bf16 latent rows whichever the cache holds.
  const int64_t row_dim = kMlaPrefillRank + kMlaPrefillRope, kv_width = heads * (a.qk_nope_head_dim + a.v_head_dim);
  // The workspace holds every sequence's context back to back; without the host-side sum, its bound.
  const int64_t rows = a.meta.total_context_len > 0 ? a.meta.total_context_len : seqs * max_ctx;
  DI_CHECK(rows <= INT32_MAX && kv_width <= INT32_MAX && heads <= INT32_MAX && a.cache.shape[1] <= INT32_MAX, kOp,
           ": ", seqs, " sequences x longest context ", max_ctx, ", ", heads, " heads, page size ", a.cache.shape[1]);
  // Workspace: latents [rows, 576], then kv [rows, H * 256], bf16, 256-byte aligned parts, in the context's prefill
  // workspace (runtime/workspace.h: grown to the largest prefill seen so far, sized from host values only).
  constexpr size_t kAlign = 256;
  const auto align = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const size_t latent_bytes = align(static_cast<size_t>(rows * row_dim) * sizeof(uint16_t));
  const size_t kv_bytes = align(static_cast<size_t>(rows * kv_width) * sizeof(uint16_t));
  auto* base = static_cast<uint8_t*>(
      ctx.workspace(WorkspaceUse::kMlaPrefill, {.bytes = latent_bytes + kv_bytes, .alignment = kAlign}).data);
  auto* latents = reinterpret_cast<uint16_t*>(base);
  auto* kv = reinterpret_cast<uint16_t*>(base + latent_bytes);

  mla_prefill_gather({.cache = fp8 ? nullptr : a.cache.as<uint16_t>(),
                      .cache_fp8 = fp8 ? a.cache.as<uint8_t>() : nullptr,
                      .page_table = a.meta.page_table.as<int32_t>(),
                      .context_lens = a.meta.context_lens.as<int32_t>(),
                      .query_start = a.meta.query_start.as<int32_t>(),
                      .latents = latents,
                      .num_seqs = a.meta.num_seqs,
                      .page_size = static_cast<int32_t>(a.cache.shape[1]),
                      .max_pages_per_seq = a.meta.max_pages_per_seq,
                      .max_context_len = a.meta.max_context_len},
                     ctx.launch());
  // Row-major kv[rows, N] = latents[rows, :512] (row stride 576) · kv_b[N, 512]^T; column-major as in linear().
  const float alpha = 1.0f, beta = 0.0f;
  CUDA_TRY(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kv_width), static_cast<int>(rows),
                        static_cast<int>(a.kv_lora_rank), &alpha, a.kv_b.data, CUDA_R_16BF,
                        static_cast<int>(a.kv_lora_rank), latents, CUDA_R_16BF, static_cast<int>(row_dim), &beta, kv,
                        CUDA_R_16BF, static_cast<int>(kv_width), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  mla_prefill_attention({.q = a.q.as<uint16_t>(),
                         .latents = latents,
                         .kv = kv,
                         .context_lens = a.meta.context_lens.as<int32_t>(),
                         .query_start = a.meta.query_start.as<int32_t>(),
                         .out = a.out.as<uint16_t>(),
                         .num_seqs = a.meta.num_seqs,
                         .num_heads = static_cast<int32_t>(heads),
                         .max_context_len = a.meta.max_context_len,
                         .max_queries = static_cast<int32_t>(std::min<int64_t>(tokens, max_ctx)),
                         .softmax_scale = a.softmax_scale,
                         .kernel = ctx.tuning().mla_prefill_kernel},
                        ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());  // the attention kernel waits first
#else
  throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
}

}  // namespace deepinfer::cuda
