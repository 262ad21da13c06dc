// MLA prefill entry points: parameter checks and launches (the kernels are in mla_prefill_kernels.cuh).
#include "backend/cuda/mla/mla_prefill.cuh"

#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/mla_prefill_kernels.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxGridY = 65535;

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The gather: one thread per 16-byte chunk of a latent row; grid (chunk blocks over max_context_len rows, sequences).

constexpr int kGatherThreads = 256;

__global__ void __launch_bounds__(kGatherThreads) mla_prefill_gather_kernel(
    const __grid_constant__ MlaPrefillGatherParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = mla_prefill_detail::MlaPrefillTraits;
  constexpr int kChunksPerRow = T::kLatent / T::kChunk;  // 72
  const int s = blockIdx.y;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kGatherThreads + threadIdx.x;
  const int j = static_cast<int>(idx / kChunksPerRow), c = static_cast<int>(idx % kChunksPerRow);
  if (p.query_start[s + 1] == p.query_start[s] || j >= p.context_lens[s]) return;
  const int32_t page = p.page_table[static_cast<int64_t>(s) * p.max_pages_per_seq + j / p.page_size];
  const int64_t src_row = static_cast<int64_t>(page) * p.page_size + j % p.page_size;
  const int64_t dst_row = mla_prefill_detail::first_row(p.context_lens, s) + j;
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.cache + src_row * T::kLatent) + c);
  reinterpret_cast<uint4*>(p.latents + dst_row * T::kLatent)[c] = v;
}

}  // namespace

void mla_prefill_gather(const MlaPrefillGatherParams& p, LaunchStream stream) {
  using T = mla_prefill_detail::MlaPrefillTraits;
  DI_CHECK(p.num_seqs >= 0 && p.num_seqs <= kMaxGridY && p.max_context_len >= 0 && p.page_size > 0 &&
               p.max_pages_per_seq >= 0,
           "mla_prefill_gather: ", p.num_seqs, " sequences, longest context ", p.max_context_len, ", page size ",
           p.page_size, ", ", p.max_pages_per_seq, " pages per sequence");
  if (p.num_seqs == 0 || p.max_context_len == 0) return;
  DI_CHECK(p.cache != nullptr && p.page_table != nullptr && p.context_lens != nullptr && p.query_start != nullptr &&
               p.latents != nullptr && aligned16(p.cache) && aligned16(p.latents),
           "mla_prefill_gather: null or misaligned pointer");
  const int64_t chunks = static_cast<int64_t>(p.max_context_len) * (T::kLatent / T::kChunk);
  const dim3 grid(static_cast<unsigned>((chunks + kGatherThreads - 1) /
                                        kGatherThreads),
                  p.num_seqs);
  launch_pdl(mla_prefill_gather_kernel, {.grid = grid, .block = dim3(kGatherThreads)}, stream, p);
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
