// Collectives of the sampling kernel (sample.cu) over the CTAs that share one row: a single CTA, or a cluster of
// kCluster CTAs that exchange their partial results through distributed shared memory. Also the order-preserving
// float keys, the bin choice of a radix select, a bitonic selection and warp-aggregated appends.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace deepinfer::cuda::sample_group {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;  // radix digits of 11 bits (the last of 10)
constexpr int kBinsPerThread = kBins / kThreads;
static_assert(kBins % kThreads == 0, "a histogram scan gives each thread whole bins");

// A larger float has a larger key; -0 and +0 share a key (they compare equal). NaN is not expected.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// A token ranked by its key, then by its lower index: the largest `ranked` of a set is the first index of its
// maximum. 0 ranks below every token.
__device__ __forceinline__ uint64_t ranked(uint32_t key, int32_t index) {
  return (static_cast<uint64_t>(key) << 32) | ~static_cast<uint32_t>(index);
}
__device__ __forceinline__ uint32_t ranked_key(uint64_t r) { return static_cast<uint32_t>(r >> 32); }
__device__ __forceinline__ int32_t ranked_index(uint64_t r) { return static_cast<int32_t>(~static_cast<uint32_t>(r)); }

// What the bins of a histogram hold: token counts and fixed-point masses.
struct BinSums {
  unsigned long long count;
  unsigned long long mass;
};
struct AddBinSums {
  __device__ __forceinline__ BinSums operator()(const BinSums& a, const BinSums& b) const {
    return {a.count + b.count, a.mass + b.mass};
  }
};

// One level of a radix select: the chosen bin and the sums above it and in it.
struct BinPick {
  uint32_t bin;
  BinSums above;    // over the bins of higher digits
  BinSums in_bin;
  uint64_t target;  // the weight the bin was chosen for
  bool found;       // false when all bins together fall short of the target
};

struct GroupShared {
  uint32_t count[kBins];
  unsigned long long mass[kBins];
  typename cub::BlockScan<BinSums, kThreads>::TempStorage scan;
  uint64_t warp_u64[kWarps];
  double warp_f64[kWarps];
  uint64_t exchange_u64;  // this CTA's part of a cluster reduction
  double exchange_f64;
  BinPick pick;
};

// A slot of a shared list for each calling thread: one atomic per group of converged threads.
__device__ __forceinline__ int append_slot(int* counter) {
  const cg::coalesced_group group = cg::coalesced_threads();
  int base = 0;
  if (group.thread_rank() == 0) base = atomicAdd(counter, static_cast<int>(group.size()));
  return group.shfl(base, 0) + static_cast<int>(group.thread_rank());
}

// The n-th largest (1-based, n <= kThreads) of one value per thread of the CTA; `scratch` holds kThreads values.
__device__ __forceinline__ uint64_t nth_largest(uint64_t v, int n, uint64_t* scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  scratch[tid] = v;
  __syncthreads();
  for (int k = 2; k <= kThreads; k <<= 1) {  // bitonic sort, descending
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int partner = tid ^ j;
      if (partner > tid) {
        const bool descending = (tid & k) == 0;
        const uint64_t x = scratch[tid], y = scratch[partner];
        if ((x < y) == descending) {
          scratch[tid] = y;
          scratch[partner] = x;
        }
      }
      __syncthreads();
    }
  }
  const uint64_t result = scratch[n - 1];
  __syncthreads();
  return result;
}

// The CTAs of one row. Every member function is a collective: all threads of all kCluster CTAs call it.
template <int kCluster>
struct Group {
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4 || kCluster == 8, "a portable cluster size");
  GroupShared& sh;

  __device__ static int rank() {
    if constexpr (kCluster == 1) {
      return 0;
    } else {
      return static_cast<int>(cg::this_cluster().block_rank());
    }
  }
  // A barrier over the group; it also orders shared-memory accesses across the cluster.
  __device__ static void sync() {
    if constexpr (kCluster == 1) {
      __syncthreads();
    } else {
      cg::this_cluster().sync();
    }
  }
  template <typename T>
  __device__ static T* at_rank(T* local, int r) {
    if constexpr (kCluster == 1) {
      return local;
    } else {
      return cg::this_cluster().map_shared_rank(local, r);
    }
  }

  __device__ uint64_t max(uint64_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), offset);
      v = other > v ? other : v;
    }
    if (threadIdx.x % 32 == 0) sh.warp_u64[threadIdx.x / 32] = v;
    __syncthreads();
    v = sh.warp_u64[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = sh.warp_u64[w] > v ? sh.warp_u64[w] : v;
    if constexpr (kCluster > 1) {
      if (threadIdx.x == 0) sh.exchange_u64 = v;
      sync();
      for (int c = 0; c < kCluster; ++c) {
        const uint64_t other = *at_rank(&sh.exchange_u64, c);
        v = other > v ? other : v;
      }
    }
    sync();  // the slots are written again by the next reduction
    return v;
  }

  __device__ double sum(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0) sh.warp_f64[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += sh.warp_f64[w];
    if constexpr (kCluster > 1) {
      if (threadIdx.x == 0) sh.exchange_f64 = v;
      sync();
      v = 0.0;
      for (int c = 0; c < kCluster; ++c) v += *at_rank(&sh.exchange_f64, c);
    }
    sync();
    return v;
  }

  // Exact: integer sums in any order.
  __device__ uint64_t sum(uint64_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      v += __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), offset);
    }
    if (threadIdx.x % 32 == 0) sh.warp_u64[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += sh.warp_u64[w];
    if constexpr (kCluster > 1) {
      if (threadIdx.x == 0) sh.exchange_u64 = v;
      sync();
      v = 0;
      for (int c = 0; c < kCluster; ++c) v += *at_rank(&sh.exchange_u64, c);
    }
    sync();
    return v;
  }

  __device__ bool any(bool flag) { return max(flag ? 1 : 0) != 0; }

  // The highest bin b of the group's histograms (sh.count / sh.mass of every CTA, summed) whose weight together with
  // every higher bin reaches target_of(total weight): weight is the count or (kByMass) the mass. Call once every
  // thread has added to its CTA's histogram; every thread of the group gets the same pick. In a cluster, the other
  // CTAs add their non-zero bins into rank 0's histogram (histograms are sparse), and every CTA scans rank 0's.
  template <bool kByMass, typename TargetOf>
  __device__ __noinline__ BinPick pick_bin(TargetOf target_of) {
    sync();  // every histogram of the group is complete
    if constexpr (kCluster > 1) {
      if (rank() != 0) {
        for (int b = static_cast<int>(threadIdx.x); b < kBins; b += kThreads) {
          if (sh.count[b] != 0) atomicAdd(at_rank(&sh.count[b], 0), sh.count[b]);
          if (kByMass && sh.mass[b] != 0) atomicAdd(at_rank(&sh.mass[b], 0), sh.mass[b]);
        }
      }
      sync();  // rank 0 holds the sums
    }
    // Thread t owns kBinsPerThread consecutive bins, the highest bins going to thread 0.
    const int top = kBins - 1 - kBinsPerThread * static_cast<int>(threadIdx.x);
    const uint32_t* count = at_rank(sh.count, 0);
    const unsigned long long* mass = at_rank(sh.mass, 0);
    BinSums bins[kBinsPerThread], mine{0, 0};
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      bins[j] = {count[top - j], kByMass ? mass[top - j] : 0ull};
      mine = AddBinSums{}(mine, bins[j]);
    }
    if (threadIdx.x == 0) sh.pick.found = false;
    BinSums before, total;
    cub::BlockScan<BinSums, kThreads>(sh.scan).ExclusiveScan(mine, before, BinSums{0, 0}, AddBinSums{}, total);
    const uint64_t target = target_of(kByMass ? total.mass : total.count);
    __syncthreads();  // sh.pick.found = false is visible
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      const uint64_t w_before = kByMass ? before.mass : before.count;
      const uint64_t w_bin = kByMass ? bins[j].mass : bins[j].count;
      if (w_before < target && w_before + w_bin >= target) {
        sh.pick = {static_cast<uint32_t>(top - j), before, bins[j], target, true};
      }
      before = AddBinSums{}(before, bins[j]);
    }
    __syncthreads();
    BinPick pick = sh.pick;
    pick.target = target;
    sync();  // no CTA clears its histogram, or writes sh.pick, before every CTA has read
    return pick;
  }
};

}  // namespace deepinfer::cuda::sample_group
