// Parameters of the MLA decode kernels (absorbed form) over the paged latent cache, bf16 or FP8.
//
// For every sequence b (one query token each) and head h:
//   scores[j] = softmax_scale * (q[b, h, :512] · cache_row(b, j)[:512] + q[b, h, 512:] · cache_row(b, j)[512:])
//   out[b, h, :] = softmax(scores[0 .. context_lens[b])) · cache_row(b, ·)[:512]
// where cache_row(b, j) is the 576 values of row (page_table[b, j / page_size], j % page_size) of the cache: the
// bf16 row itself (`cache`), or the FP8 row widened (`cache_fp8`, backend/ops/latent_fp8.h: c_kv[i] =
// e4m3(code[i]) * scale[i / 128], then the bf16 k_pe). The widening is exact (power-of-two scales), so both formats
// give the same result on the same values, up to the order of the fp32 sums.
//
// All tensors are contiguous, bf16 values stored as their 16-bit patterns (uint16_t).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The most KV splits a decode takes (num_splits, forced_splits): the combine stages one weight a split in shared memory.
inline constexpr int32_t kMlaDecodeMaxSplits = 256;

// Bytes of one FP8 cache row at DeepSeek's dims: 512 e4m3 codes, 4 float32 scales, 64 bf16 k_pe values
// (LatentFp8Layout{512, 64}.row_bytes(); the op checks the two agree).
inline constexpr int32_t kMlaDecodeFp8RowBytes = 656;

// Which kernel runs. kAuto picks by cache format and head count; the others exist for tests and benchmarks, and each
// takes one cache format (the launcher throws on the other).
enum class MlaDecodeKernel : uint8_t {
  kAuto,
  kNarrow,     // bf16 cache: 16 heads per CTA, queries in registers, mma.sync (V2-Lite: 16 heads)
  kWide,       // bf16 cache: 64 heads per CTA, queries in shared memory, mma.sync
  kWideWgmma,  // bf16 cache: 64 heads per CTA, queries in shared memory, warpgroup MMA (V3: 128 heads)
  kNarrowFp8,  // FP8 cache: 16 heads per CTA, queries in registers, mma.sync; every FP8 decode (mla_decode_fp8.cuh)
};

struct MlaDecodeParams {
  const uint16_t* q = nullptr;             // [batch, num_heads, 576]: q_latent (512, q_nope·W_UK) then q_pe (64)
  // Exactly one of the two caches is given: it names the format.
  const uint16_t* cache = nullptr;         // bf16: [num_pages, page_size, 576]: c_kv (512) then k_pe (64)
  // FP8: [num_pages, page_size, 656] bytes, rows in backend/ops/latent_fp8.h's layout: 512 e4m3 codes, 4 float32
  // power-of-two scales (one per 128 codes, at most 2^7: the kernel widens with the factor 2^120 * scale in bf16),
  // 64 bf16 k_pe values.
  const uint8_t* cache_fp8 = nullptr;
  const int32_t* page_table = nullptr;     // [batch, max_pages_per_seq]; only the first ceil(ctx / page_size) read
  const int32_t* context_lens = nullptr;   // [batch], device memory; 0 gives a zero output
  uint16_t* out = nullptr;                 // [batch, num_heads, 512]
  void* workspace = nullptr;               // mla_decode_workspace_bytes(p) bytes (split partials), 16-byte aligned
  int32_t batch = 0;
  int32_t num_heads = 0;                   // a multiple of the chosen kernel's heads per CTA (16 or 64)
  int32_t page_size = 64;                  // tokens per page, any positive value
  int32_t max_pages_per_seq = 0;           // row length of page_table
  int32_t max_context_len = 0;             // host-side upper bound of context_lens; picks the split count
  int32_t num_sms = 132;                   // multiprocessors of the device (cudaDevAttrMultiProcessorCount)
  int32_t num_splits = 0;                  // KV splits per sequence (<= 256); 0 = chosen by mla_decode_num_splits
  // > 0: the heuristic's count replaced by this one (at most one split a tile): CudaTuning::mla_decode_splits, a
  // measurement knob.
  int32_t forced_splits = 0;
  // >= 0: every row of a sequence but its last fresh_rows, and the metadata, were complete before the kernel that
  // precedes this one (earlier kernels, the step's input upload, earlier steps): the kernel copies them while that
  // kernel still runs (before its grid dependency wait; ptx.cuh: a grid starts only after every CTA of its
  // predecessor has passed its own wait). -1: any of it may come from the previous kernel.
  int32_t fresh_rows = -1;
  // 1: the kernel after the split combine may launch as soon as the combine starts (LaunchLedger::trigger).
  int32_t trigger_early = 0;
  // 1 with more than one split: no combine kernel; the partials and log-sum-exps stay in the workspace (fp32
  // [num_splits, batch * num_heads, 512], then [num_splits, batch * num_heads]) for the next kernel, which combines
  // them as it reads them (head_gemv's x_partials), and `out` is not written.
  int32_t defer_combine = 0;
  float softmax_scale = 1.0f;
  MlaDecodeKernel kernel = MlaDecodeKernel::kAuto;
};

}  // namespace deepinfer::cuda
