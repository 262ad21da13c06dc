// MLA prefill entry points: parameter checks and launches (the kernels are in mla_prefill_kernels.cuh).
#include "backend/cuda/mla/mla_prefill.cuh"

#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/latent_fp8_math.h"
#include "backend/cuda/mla/mla_prefill_kernels.cuh"
#include "backend/ops/latent_fp8.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxGridY = 65535;

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The gather: one thread per 16-byte chunk of a workspace row (8 bf16 values); grid (chunk blocks over
// max_context_len rows, sequences). The cache rows' format is a template argument: each gives the chunk c of row
// src_row.

constexpr int kGatherThreads = 256;
using GatherTraits = mla_prefill_detail::MlaPrefillTraits;

// bf16 rows: the chunk is copied.
struct Bf16CacheRows {
  static __device__ __forceinline__ uint4 chunk(const MlaPrefillGatherParams& p, int64_t src_row, int c) {
    return __ldg(reinterpret_cast<const uint4*>(p.cache + src_row * GatherTraits::kLatent) + c);
  }
};

// FP8 rows at the kernels' dims: 512 codes, 4 float32 scales, 64 bf16 k_pe values, 656 bytes, no padding. A c_kv
// chunk reads its 8 codes and its group's scale and widens them: e4m3 * 2^k is exactly a bf16 (latent_fp8.h), so the
// conversions do not round. A k_pe chunk is 16 bytes of the row, copied.
struct Fp8CacheRows {
  static constexpr int kScalesOffset = GatherTraits::kRank;
  static constexpr int kRopeOffset = kScalesOffset + 4 * (GatherTraits::kRank / kLatentFp8Group);
  static constexpr int kRowBytes = kRopeOffset + 2 * GatherTraits::kRope;
  static constexpr int kCkvChunks = GatherTraits::kRank / GatherTraits::kChunk;  // 64
  static_assert(kRowBytes == 656 && kRopeOffset % 16 == 0, "16-byte aligned k_pe chunks in 16-byte rows");
  static_assert(kLatentFp8Group % GatherTraits::kChunk == 0, "a chunk's codes share one scale");

  static __device__ __forceinline__ uint4 chunk(const MlaPrefillGatherParams& p, int64_t src_row, int c) {
    const uint8_t* row = p.cache_fp8 + src_row * kRowBytes;
    if (c >= kCkvChunks) return __ldg(reinterpret_cast<const uint4*>(row + kRopeOffset) + (c - kCkvChunks));
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(row) + c);
    const float scale =
        __ldg(reinterpret_cast<const float*>(row + kScalesOffset) + c * GatherTraits::kChunk / kLatentFp8Group);
    const uint32_t words[2] = {codes.x, codes.y};
    uint32_t out[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 v = latent_fp8_values(static_cast<uint16_t>(words[w / 2] >> (16 * (w % 2))));
      out[w] = mla_prefill_detail::pack_bf16x2(v.x * scale, v.y * scale);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }
};

template <typename CacheRows>
__global__ void __launch_bounds__(kGatherThreads) mla_prefill_gather_kernel(
    const __grid_constant__ MlaPrefillGatherParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = GatherTraits;
  constexpr int kChunksPerRow = T::kLatent / T::kChunk;  // 72
  const int s = blockIdx.y;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kGatherThreads + threadIdx.x;
  const int j = static_cast<int>(idx / kChunksPerRow), c = static_cast<int>(idx % kChunksPerRow);
  if (p.query_start[s + 1] == p.query_start[s] || j >= p.context_lens[s]) return;
  const int32_t page = p.page_table[static_cast<int64_t>(s) * p.max_pages_per_seq + j / p.page_size];
  const int64_t src_row = static_cast<int64_t>(page) * p.page_size + j % p.page_size;
  const int64_t dst_row = mla_prefill_detail::first_row(p.context_lens, s) + j;
  reinterpret_cast<uint4*>(p.latents + dst_row * T::kLatent)[c] = CacheRows::chunk(p, src_row, c);
}

}  // namespace

void mla_prefill_gather(const MlaPrefillGatherParams& p, LaunchStream stream) {
  using T = mla_prefill_detail::MlaPrefillTraits;
  DI_CHECK(p.num_seqs >= 0 && p.num_seqs <= kMaxGridY && p.max_context_len >= 0 && p.page_size > 0 &&
               p.max_pages_per_seq >= 0,
           "mla_prefill_gather: ", p.num_seqs, " sequences, longest context ", p.max_context_len, ", page size ",
           p.page_size, ", ", p.max_pages_per_seq, " pages per sequence");
  if (p.num_seqs == 0 || p.max_context_len == 0) return;
  const bool fp8 = p.cache_fp8 != nullptr;
  const void* cache = fp8 ? static_cast<const void*>(p.cache_fp8) : p.cache;
  DI_CHECK((p.cache == nullptr) != (p.cache_fp8 == nullptr) && p.page_table != nullptr &&
               p.context_lens != nullptr && p.query_start != nullptr && p.latents != nullptr && aligned16(cache) &&
               aligned16(p.latents),
           "mla_prefill_gather: null or misaligned pointer (or both caches, or neither)");
  const LatentFp8Layout layout{.rank = T::kRank, .rope_dim = T::kRope};
  DI_CHECK(!fp8 || (layout.scales_offset() == Fp8CacheRows::kScalesOffset &&
                    layout.rope_offset() == Fp8CacheRows::kRopeOffset && layout.row_bytes() == Fp8CacheRows::kRowBytes),
           "mla_prefill_gather: the FP8 rows the gather reads are not the layout of backend/ops/latent_fp8.h");
  const int64_t chunks = static_cast<int64_t>(p.max_context_len) * (T::kLatent / T::kChunk);
  const dim3 grid(static_cast<unsigned>((chunks + kGatherThreads - 1) /
                                        kGatherThreads),
                  p.num_seqs);
  if (fp8) {
    launch_pdl(mla_prefill_gather_kernel<Fp8CacheRows>, {.grid = grid, .block = dim3(kGatherThreads)}, stream, p);
  } else {
    launch_pdl(mla_prefill_gather_kernel<Bf16CacheRows>, {.grid = grid, .block = dim3(kGatherThreads)}, stream, p);
  }
}

void mla_prefill_attention(const MlaPrefillAttentionParams& p, LaunchStream stream) {
  DI_CHECK(p.num_seqs >= 0 && p.num_seqs <= kMaxGridY && p.num_heads >= 0 && p.num_heads <= kMaxGridY &&
               p.max_context_len >= 0 && p.max_queries >= 0,
           "mla_prefill_attention: ", p.num_seqs, " sequences, ", p.num_heads, " heads, longest context ",
           p.max_context_len, ", at most ", p.max_queries, " queries");
  if (p.num_seqs == 0 || p.num_heads == 0 || p.max_queries == 0) return;
  DI_CHECK(p.q != nullptr && p.latents != nullptr && p.kv != nullptr && p.context_lens != nullptr &&
               p.query_start != nullptr && p.out != nullptr && aligned16(p.q) && aligned16(p.latents) &&
               aligned16(p.kv) && aligned16(p.out),
           "mla_prefill_attention: null or misaligned pointer");
  DI_CHECK(p.kernel == MlaPrefillKernel::kMma || p.kernel == MlaPrefillKernel::kWgmma,
           "mla_prefill_attention: unknown kernel ", static_cast<int>(p.kernel));
  if (p.kernel == MlaPrefillKernel::kWgmma) {
    mla_prefill_detail::launch_mla_prefill_attention_wgmma(p, stream);
  } else {
    mla_prefill_detail::launch_mla_prefill_attention(p, stream);
  }
}

}  // namespace deepinfer::cuda
