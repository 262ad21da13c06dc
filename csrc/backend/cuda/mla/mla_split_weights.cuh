// The weights of MLA decode's split combine, shared by the combine kernel (mla_decode.cu) and by W_UV's fold of the
// combine into its x reads (gemm/head_gemv.cu), which parallelize the combine differently but must give the same
// bits: split k of a row weighs w_k = 2^(lse_k - max lse), and an empty split (lse -inf: it wrote no partial) weighs
// 0, so its partial is never read into the sum. The callers reduce the maxima and sums over their threads.
#pragma once

#include <cmath>

namespace deepinfer::cuda::mla_detail {

// The max of lse(k) over this thread's splits k = first, first + step, ... < num_splits (-inf for none).
template <typename Lse>
__device__ __forceinline__ float splits_lse_max(int first, int step, int num_splits, Lse&& lse) {
  float m = -INFINITY;
  for (int k = first; k < num_splits; k += step) m = fmaxf(m, lse(k));
  return m;
}

// The weights of this thread's splits (as splits_lse_max's), each handed to store(k, w_k), and their sum. lse_max is
// the row's max over all splits: finite whenever some split is not empty.
template <typename Lse, typename Store>
__device__ __forceinline__ float split_weights(int first, int step, int num_splits, float lse_max, Lse&& lse,
                                               Store&& store) {
  float sum = 0.0f;
  for (int k = first; k < num_splits; k += step) {
    const float l = lse(k);
    const float w = l == -INFINITY ? 0.0f : exp2f(l - lse_max);
    store(k, w);
    sum += w;
  }
  return sum;
}

// 1 / (sum of a row's weights), 0 for a row whose splits are all empty (its output is zero).
__device__ __forceinline__ float inverse_weight_sum(float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; }

}  // namespace deepinfer::cuda::mla_detail
