// Device side of L2PrefetchRegions: a CTA's share of the regions as bulk L2 prefetches (the copy engine's
// cp.async.bulk.prefetch: one instruction moves a whole chunk, nothing waits for it), marked evict-last so the
// weights streamed meanwhile (evict-first, ptx::ld_stream_16) leave first.
#pragma once

#include <cstdint>

#include "backend/cuda/l2_prefetch_params.h"

namespace deepinfer::cuda {

// Bytes one bulk prefetch asks for: a warp's lane 0 issues chunks of the CTA's share in turn.
inline constexpr int64_t kL2PrefetchChunk = 16 * 1024;

__device__ __forceinline__ void bulk_prefetch_l2_evict_last(const void* ptr, uint32_t bytes) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(ptr), "r"(bytes), "l"(policy)
               : "memory");
}

// Share `share` of `shares` (a CTA of the grid) of the regions, cut at 16-byte units: the shares of a grid cover
// every byte once. Lane 0 of warp w issues the share's chunks w, w + warps, ... within each region.
__device__ __forceinline__ void prefetch_l2_share(const L2PrefetchRegions& r, int64_t share, int64_t shares) {
  if (r.count == 0 || (threadIdx.x & 31) != 0) return;
  int64_t units = 0;
  for (int i = 0; i < r.count; ++i) units += r.bytes[i] / 16;
  const int64_t begin = units * share / shares * 16, end = units * (share + 1) / shares * 16;
  const int64_t warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t base = 0;  // the region's first byte in the concatenation
  for (int i = 0; i < r.count; ++i) {
    const int64_t lo = max(begin, base) - base, hi = min(end, base + r.bytes[i]) - base;
    const char* region = static_cast<const char*>(r.ptr[i]);
    for (int64_t at = lo + warp * kL2PrefetchChunk; at < hi; at += warps * kL2PrefetchChunk) {
      bulk_prefetch_l2_evict_last(region + at, static_cast<uint32_t>(min(kL2PrefetchChunk, hi - at)));
    }
    base += r.bytes[i];
  }
}

}  // namespace deepinfer::cuda
