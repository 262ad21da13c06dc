// mla_decode: the argument checks, the cache format (bfloat16 or FP8: the kernel that reads it), the split count, the
// workspace, and the choice between the split combine kernel and W_UV's fold of it.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/gemm/head_gemv.cuh"
#include "backend/cuda/mla/mla_decode.cuh"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/op_checks.h"
#include "backend/ops/latent_fp8.h"

namespace deepinfer::cuda {
namespace {

// What the MLA decode kernels take (mla_decode_params.h): DeepSeek's 512-wide latent plus 64 rope values per row,
// bfloat16 queries and outputs, heads in multiples of 16; the cache in bfloat16 or in the FP8 layout
// (backend/ops/latent_fp8.h) at those dims.
constexpr int64_t kDecodeRank = 512;
constexpr int64_t kDecodeRowDim = 576;
constexpr int64_t kDecodeHeadMultiple = 16;

// The FP8 cache's rows the kernel reads: LatentFp8Layout at the kernel's dims, whose size the kernel hard-codes.
int64_t fp8_row_bytes() {
  const int64_t bytes = LatentFp8Layout{.rank = kDecodeRank, .rope_dim = kDecodeRowDim - kDecodeRank}.row_bytes();
  DI_CHECK(bytes == kMlaDecodeFp8RowBytes, "the FP8 decode kernel reads rows of ", kMlaDecodeFp8RowBytes,
           " bytes; the layout at rank ", kDecodeRank, " is ", bytes);
  return bytes;
}

}  // namespace

void mla_decode(CudaContext& ctx, const MlaDecodeArgs& a) {
  const auto timing = ctx.timed("mla_decode");
  constexpr const char* kOp = "cuda mla_decode";
  a.validate();  // shapes and dtypes; the metadata is device memory, checked on the host before its upload
  check_on_device(a.q, kOp, "q");
  check_on_device(a.cache, kOp, "cache");
  check_on_device(a.out_latent, kOp, "out_latent");
  check_on_device(a.meta.context_lens, kOp, "context_lens");
  check_on_device(a.meta.page_table, kOp, "page_table");
  if (a.projects()) {
    check_on_device(a.w_uv, kOp, "w_uv");
    check_on_device(a.out, kOp, "out");
  }
  const int64_t seqs = a.meta.num_seqs, heads = a.q.shape[1];
  if (seqs == 0 || heads == 0) return;
  if (a.q.dtype != DType::kBF16 || a.kv_lora_rank != kDecodeRank || a.q.shape[2] != kDecodeRowDim ||
      heads % kDecodeHeadMultiple != 0) {
    throw UnsupportedOp(str_cat(kOp, ": the kernel takes bfloat16 rows of ", kDecodeRank, " + ",
                                kDecodeRowDim - kDecodeRank, " values and heads in multiples of ",
                                kDecodeHeadMultiple, "; got ", dtype_name(a.q.dtype), " rows of ", a.kv_lora_rank,
                                " + ", a.q.shape[2] - a.kv_lora_rank, " values and ", heads, " heads"));
  }
  const bool fp8 = is_fp8_latent_cache(a.cache);
  if (fp8 && a.cache.shape[2] != fp8_row_bytes()) {
    throw UnsupportedOp(str_cat(kOp, ": the FP8 kernel reads cache rows of ", fp8_row_bytes(), " bytes (", kDecodeRank,
                                " e4m3 codes, their float32 scales, ", kDecodeRowDim - kDecodeRank,
                                " bfloat16 rope values); got rows of ", a.cache.shape[2], " bytes"));
  }
  DI_CHECK(a.cache.shape[1] <= INT32_MAX && heads <= INT32_MAX, kOp, ": page size ", a.cache.shape[1], ", ", heads,
           " heads");
  MlaDecodeParams p{.q = a.q.as<uint16_t>(),
                    .cache = fp8 ? nullptr : a.cache.as<uint16_t>(),
                    .cache_fp8 = fp8 ? a.cache.as<uint8_t>() : nullptr,
                    .page_table = a.meta.page_table.as<int32_t>(),
                    .context_lens = a.meta.context_lens.as<int32_t>(),
                    .out = a.out_latent.as<uint16_t>(),
                    .workspace = nullptr,
                    .batch = a.meta.num_seqs,
                    .num_heads = static_cast<int32_t>(heads),
                    .page_size = static_cast<int32_t>(a.cache.shape[1]),
                    .max_pages_per_seq = a.meta.max_pages_per_seq,
                    .max_context_len = a.meta.max_context_len,
                    .num_sms = ctx.num_sms(),
                    .forced_splits = ctx.tuning().mla_decode_splits,
                    // The cache rows it may copy before its wait, and when its combine lets the next op start: the
                    // ledger's answers from the ops still possibly running.
                    .fresh_rows = ctx.ledger().mla_decode_fresh_rows(a),
                    .trigger_early = ctx.ledger().trigger(OpKind::kMlaDecode) == Trigger::kAtStart ? 1 : 0,
                    .softmax_scale = a.softmax_scale};
  // The split count, chosen once: the workspace, the decode kernels and W_UV's fold below all take this one.
  p.num_splits = mla_decode_num_splits(p);
  // The split partials live in the context's decode workspace (runtime/workspace.h: grown to the largest decode seen
  // so far, sized from host values only). A CUDA graph captured later must be replayed only with decodes that fit the
  // workspace it captured.
  const size_t bytes = mla_decode_workspace_bytes(p);
  void* const workspace = ctx.workspace(WorkspaceUse::kMlaDecode, {.bytes = bytes}).data;
  p.workspace = bytes > 0 ? workspace : nullptr;
  // The attention kernels trigger after their wait: once the op after this one starts, every op before it has
  // completed, whatever the combine's or W_UV's trigger. The op is recorded before the projection's head_linear,
  // which records itself; a folded projection is part of this op.
  const auto record = [&] { ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any()); };
  if (!a.projects()) {
    mla_decode(p, ctx.launch());
    record();
    return;
  }
  // The projection: for one sequence with split partials, W_UV's head_gemv combines them as it reads its x (one
  // dependent launch fewer: the combine kernel's); else the combine kernel, then head_linear on out_latent. Folding
  // won at batch 1 on v2-lite (engine_bench on an H200, context 1k) and lost at batches 2 to 8: with more rows, the
  // 64 CTAs of W_UV read the partials with less parallelism than the combine's grid of a CTA per row and column block.
  const HeadLinearArgs projection = a.projection();
  const HeadGemvParams gemv{.x = nullptr,
                            .w = projection.w.as<uint16_t>(),
                            .out = projection.out.as<uint16_t>(),
                            .tokens = seqs,
                            .heads = heads,
                            .k = kDecodeRank,
                            .n = projection.w.shape[1],
                            .x_head_stride = kDecodeRank,
                            .out_head_stride = projection.w.shape[1],
                            .num_sms = ctx.num_sms(),
                            .before_wait = 0,
                            .trigger_early = ctx.ledger().trigger(OpKind::kHeadLinear) == Trigger::kAtStart ? 1 : 0,
                            .x_partials = static_cast<const float*>(p.workspace),
                            .x_splits = p.num_splits};
  const bool fold_combine = seqs == 1 && p.workspace != nullptr && a.w_uv.dtype == DType::kBF16 &&
                            a.out.dtype == DType::kBF16 && head_gemv_fits(gemv);
  p.defer_combine = fold_combine ? 1 : 0;
  mla_decode(p, ctx.launch());
  record();
  if (fold_combine) {
    head_gemv(gemv, ctx.launch());
  } else {
    head_linear(ctx, projection);
  }
}

}  // namespace deepinfer::cuda
