// Device memory a kernel pulls into L2 while it runs, for kernels later in the step: a hint, which changes no
// result. A decode step at batch 1 leaves the memory idle through most of the attention chain (its kernels wait on
// each other, not on bytes); the MoE that follows reads the shared experts' weights whatever the routing picks, so
// their bytes can move then rather than while the routed experts stream (l2_prefetch.cuh issues them).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

inline constexpr int kL2PrefetchMaxRegions = 2;

struct L2PrefetchRegions {
  const void* ptr[kL2PrefetchMaxRegions] = {};  // 16-byte aligned
  int64_t bytes[kL2PrefetchMaxRegions] = {};    // multiples of 16
  int count = 0;
  // Issued after the kernel's grid dependency wait (its own weights have arrived by then) rather than right after
  // its own weight loads go out, before the wait.
  bool after_wait = false;
};

}  // namespace deepinfer::cuda
