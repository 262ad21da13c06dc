// MoE routing and token -> expert alignment on the device: the workspace layout, parameter checks, the route kernel
// (scores, group limit, top-k, weights, histograms; its last block scans) and the stable scatter of pairs into rows.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace moe_detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kExpertsPerLane = kMaxRoutedExperts / 32;  // routed expert e sits on lane e % 32, slot e / 32
constexpr int kScanItems = (kMaxExperts + kRouteThreads - 1) / kRouteThreads;  // experts a thread in the scans

// Padded rows in the high 32 bits, active experts in the low ones: one scan gives both offsets (a sum stays below
// 2^32 in each half: at most kMaxExperts experts, and max_rows < 2^31).
using BlockScan = cub::BlockScan<uint64_t, kRouteThreads>;

struct RouteSmem {
  int32_t hist[kMaxExperts];                        // this block's pairs per expert
  float choice[kRouteWarps][kMaxRoutedExperts];     // a warp's token: selection scores (for the group scores)
  float score[kRouteWarps][kMaxRoutedExperts];      // a warp's token: unbiased scores (for the weights)
  int32_t warp_hist[kRouteWarps][kMaxExperts];      // scatter: pairs per expert in each warp of the round
  int32_t base[kMaxExperts];                        // scatter: first row of the round's pairs of each expert
  int32_t offsets[kMaxExperts];                     // padded first row of each expert
  int32_t chunk_ids[kRouteTokensPerBlock * kMaxTopK];  // this block's pairs' expert ids (pair - first pair of block)
  typename BlockScan::TempStorage scan;
  int32_t is_last;
};

// A selection score as an unsigned key that orders like the float: key(a) > key(b) exactly when a > b, equal floats
// (-0 and +0 too) give equal keys, -inf gives 0x007fffff. NaN gives 0, below every number, and is never chosen while a
// number is left. The +1 keeps 0 for "not a candidate".
__device__ __forceinline__ uint32_t choice_key(float v) {
  if (v != v) return 0u;
  const uint32_t bits = __float_as_uint(v + 0.0f);  // -0 + 0 = +0
  return ((bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u)) + 1u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// One warp routes one token from its logits (routed expert lane + 32 j in logits[j], -inf past them): writes its
// routed ids (selection order) and weights, then the shared experts with weight 1, and counts its pairs in `hist`.
// Lane j < top_k writes pair j; the selection sees the routed experts only. The ids written are global; the block's
// chunk_ids and histogram take the weights' slots (expert_slot), -1 for a pair held elsewhere.
__device__ void route_token(const MoeKernelParams& kp, int token, int block, const float (&logits)[kExpertsPerLane],
                            RouteSmem& s, int warp, int lane) {
  const MoeParams& p = kp.p;
  const int routed_experts = num_routed_experts(p), top_k = p.top_k;
  const int routed_k = top_k - p.num_shared_experts;
  float* choice = s.choice[warp];
  float* score = s.score[warp];
  float v[kExpertsPerLane];
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) v[j] = logits[j];
  if (p.scoring == MoeScoring::kSoftmax) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) mx = fmaxf(mx, v[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      v[j] = lane + 32 * j < routed_experts ? expf(v[j] - mx) : 0.0f;
      sum += v[j];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) v[j] = v[j] / sum;
  } else {
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) v[j] = 1.0f / (1.0f + expf(-v[j]));
  }
  float c[kExpertsPerLane];  // selection scores
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) {
    const int e = lane + 32 * j;
    c[j] = -INFINITY;
    if (e < routed_experts) {
      score[e] = v[j];
      c[j] = v[j] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
      choice[e] = c[j];
    }
  }
  __syncwarp();
  if (p.method != MoeTopkMethod::kGreedy && p.n_group > 1) {
    // Lane g scores group g; groups ranked by score, ties to the lower index; all but the best topk_group masked.
    const int per_group = routed_experts / p.n_group;
    float group_score = -INFINITY;
    if (lane < p.n_group) {
      const float* members = choice + lane * per_group;
      if (p.method == MoeTopkMethod::kNoauxTc) {
        float best = -INFINITY, second = -INFINITY;
        for (int i = 0; i < per_group; ++i) {
          const float m = members[i];
          if (m > best) {
            second = best;
            best = m;
          } else if (m > second) {
            second = m;
          }
        }
        group_score = best + second;
      } else {
        for (int i = 0; i < per_group; ++i) group_score = fmaxf(group_score, members[i]);
      }
    }
    int rank = 0;
    for (int g = 0; g < p.n_group; ++g) {
      const float other = __shfl_sync(0xffffffffu, group_score, g);
      rank += (other > group_score || (other == group_score && g < lane)) ? 1 : 0;
    }
    const uint32_t keep = __ballot_sync(0xffffffffu, lane < p.n_group && rank < p.topk_group);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < routed_experts && ((keep >> (e / per_group)) & 1u) == 0) c[j] = -INFINITY;
    }
  }
  // routed_k rounds of a warp arg-max (value descending, index ascending): each lane's best key (its lowest expert on
  // a tie), the warp's best key in one reduction, then the lowest expert holding it in another. Two redux.sync a
  // round instead of five shuffle steps of value and index.
  uint32_t key[kExpertsPerLane];  // 0: past the routed experts, or taken
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) key[j] = lane + 32 * j < routed_experts ? choice_key(c[j]) : 0u;
  int my_id = 0;
  for (int r = 0; r < routed_k; ++r) {
    uint32_t best = 0u;
    int best_j = 0;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      if (key[j] > best) {
        best = key[j];
        best_j = j;
      }
    }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t holder = top != 0u && best == top ? static_cast<uint32_t>(lane + 32 * best_j) : 0xffffffffu;
    const uint32_t chosen = __reduce_min_sync(0xffffffffu, holder);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      if (chosen == static_cast<uint32_t>(lane + 32 * j)) key[j] = 0u;
    }
    if (lane == r && chosen != 0xffffffffu) my_id = static_cast<int>(chosen);
  }
  const float w = lane < routed_k ? score[my_id] : 0.0f;
  const float sum = warp_sum(w);
  const float norm = p.normalize == MoeNormalize::kYes ? 1.0f / (sum + 1e-20f) : 1.0f;
  if (lane < top_k) {
    const bool shared = lane >= routed_k;  // shared expert lane - routed_k, after the routed experts, weight 1
    const int id = shared ? routed_experts + (lane - routed_k) : my_id;
    const int64_t pair = static_cast<int64_t>(token) * top_k + lane;
    p.topk_ids[pair] = id;
    p.topk_weights[pair] = shared ? 1.0f : w * (norm * p.routed_scaling_factor);
    const int slot = expert_slot(p, id);
    s.chunk_ids[(token - block * kRouteTokensPerBlock) * top_k + lane] = slot;
    if (slot >= 0) atomicAdd(&s.hist[slot], 1);
  }
  __syncwarp();  // choice / score are reused by the warp's next token
}

// Places the pairs of route block `b` (tokens 32 b .. +32) into their experts' rows, in pair order:
// row_pair[offsets[e] + (pairs of e in earlier blocks) + (pairs of e earlier in this block)] = pair.
// Rounds of kRouteThreads pairs, one a thread (one round up to 8 pairs a token).
// Needs s.offsets (and s.chunk_ids when b is this block, `own`); every thread of the block calls it.
__device__ void scatter_chunk(const MoeKernelParams& kp, int b, int own, RouteSmem& s) {
  const MoeParams& p = kp.p;
  const int num_experts = p.num_experts;
  const int tid = threadIdx.x, warp = tid >> 5;
  for (int e = tid; e < num_experts; e += kRouteThreads) {
    int sum0 = 0, sum1 = 0, sum2 = 0, sum3 = 0;  // independent sums: many loads in flight
    int b2 = 0;
#pragma unroll 4
    for (; b2 + 4 <= b; b2 += 4) {
      sum0 += __ldcg(&kp.block_counts[(b2 + 0) * num_experts + e]);
      sum1 += __ldcg(&kp.block_counts[(b2 + 1) * num_experts + e]);
      sum2 += __ldcg(&kp.block_counts[(b2 + 2) * num_experts + e]);
      sum3 += __ldcg(&kp.block_counts[(b2 + 3) * num_experts + e]);
    }
    for (; b2 < b; ++b2) sum0 += __ldcg(&kp.block_counts[b2 * num_experts + e]);
    s.base[e] = s.offsets[e] + sum0 + sum1 + sum2 + sum3;
  }
  const int64_t num_pairs = static_cast<int64_t>(p.num_tokens) * p.top_k;
  const int block_pairs = kRouteTokensPerBlock * p.top_k;
  for (int first = 0; first < block_pairs; first += kRouteThreads) {
    for (int i = tid; i < kRouteWarps * kMaxExperts; i += kRouteThreads) (&s.warp_hist[0][0])[i] = 0;
    __syncthreads();
    const int at = first + tid;  // this thread's pair, counted from the block's first
    const int64_t pair = static_cast<int64_t>(b) * block_pairs + at;
    int e = -1;
    if (at < block_pairs && pair < num_pairs) {
      e = b == own ? s.chunk_ids[at] : expert_slot(p, __ldcg(&p.topk_ids[pair]));
      if (e < 0 || e >= num_experts) e = -1;  // an invalid id gets no row (the combine skips it too)
    }
    const uint32_t peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & lanemask_lt());
    if (e >= 0 && rank == 0) s.warp_hist[warp][e] = __popc(peers);
    __syncthreads();
    if (e >= 0) {
      int row = s.base[e] + rank;
      for (int w = 0; w < warp; ++w) row += s.warp_hist[w][e];
      kp.row_pair[row] = static_cast<int32_t>(pair);
    }
    __syncthreads();  // shared arrays are reused by the next round or chunk
    if (first + kRouteThreads < block_pairs) {  // another round: its rows come after this round's
      for (int x = tid; x < num_experts; x += kRouteThreads) {
        int n = 0;
        for (int w = 0; w < kRouteWarps; ++w) n += s.warp_hist[w][x];
        s.base[x] += n;
      }
      __syncthreads();
    }
  }
}

// scatter_chunk for a single route block of at most 32 pairs, on one warp: lane j places pair j. Its row is its
// expert's first row plus the pairs of that expert on lower lanes, as scatter_chunk's order gives. Needs s.offsets and
// s.chunk_ids.
__device__ void scatter_one_warp(const MoeKernelParams& kp, const RouteSmem& s, int lane) {
  const int num_pairs = kp.p.num_tokens * kp.p.top_k;
  int e = -1;
  if (lane < num_pairs) {
    e = s.chunk_ids[lane];
    if (e < 0 || e >= kp.p.num_experts) e = -1;  // an invalid id gets no row (the combine skips it too)
  }
  const uint32_t peers = __match_any_sync(0xffffffffu, e);
  if (e >= 0) kp.row_pair[s.offsets[e] + __popc(peers & lanemask_lt())] = lane;
}

__device__ __forceinline__ float dot_bf16x8(const uint4& a, const uint4& b) {
  float acc = bf16_lo(a.x) * bf16_lo(b.x);
  acc = fmaf(bf16_hi(a.x), bf16_hi(b.x), acc);
  acc = fmaf(bf16_lo(a.y), bf16_lo(b.y), acc);
  acc = fmaf(bf16_hi(a.y), bf16_hi(b.y), acc);
  acc = fmaf(bf16_lo(a.z), bf16_lo(b.z), acc);
  acc = fmaf(bf16_hi(a.z), bf16_hi(b.z), acc);
  acc = fmaf(bf16_lo(a.w), bf16_lo(b.w), acc);
  return fmaf(bf16_hi(a.w), bf16_hi(b.w), acc);
}

// The fused router (kp.fused_router): CTA c computes the logits of routed experts 8c .. 8c + 7 for every token, one
// expert row a warp, lane l holding bytes 16 l .. 16 l + 15 of every 512 of the row. The weights are constant, so
// they are loaded before the grid dependency wait, while the kernel before finishes; x is staged in shared memory
// after it. The logits go to global memory; the last CTA to finish (a completion counter) routes on them. Returns
// whether this CTA is that one.
// With kp.router_cluster the logits also go to `cluster_logits` in rank 0's shared memory, and after a cluster
// barrier rank 0 is the CTA that routes (on them; no fence, counter or reload).
template <int kPieces>
__device__ bool compute_router_logits(const MoeKernelParams& kp, uint4* x_s, float* cluster_logits,
                                      int32_t& is_last) {
  const MoeParams& p = kp.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int routed = num_routed_experts(p), pieces = p.hidden / 256;
  const int e = blockIdx.x * kRouteWarps + warp;
  const uint16_t* row = p.router_weight + static_cast<int64_t>(e < routed ? e : 0) * p.hidden + lane * 8;
  uint4 w[kPieces];
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    w[i] = e < routed && i < pieces ? ld_stream_16(row + i * 256) : make_uint4(0u, 0u, 0u, 0u);
  }
  griddep_wait();
  griddep_launch_dependents();
  const int row_vecs = p.hidden / 8, x_vecs = p.num_tokens * row_vecs;
  for (int i = threadIdx.x; i < x_vecs; i += kRouteThreads) x_s[i] = ld_cg_16(p.x + 8 * static_cast<int64_t>(i));
  __syncthreads();
  if (e < routed) {
    for (int t = 0; t < p.num_tokens; ++t) {
      const uint4* xt = x_s + t * row_vecs + lane;
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kPieces; ++i) {
        if (i < pieces) acc += dot_bf16x8(w[i], xt[i * 32]);
      }
      acc = warp_sum(acc);
      if (lane == 0) {
        const int64_t at = static_cast<int64_t>(t) * routed + e;
        p.router_logits_out[at] = acc;  // the op's output; read by no kernel of this call on the cluster path
        if (kp.router_cluster) cg::this_cluster().map_shared_rank(cluster_logits, 0)[at] = acc;
      }
    }
  }
  if (kp.router_cluster) {
    cg::this_cluster().sync();  // release / acquire: every rank's logits are in rank 0's shared memory
    return cg::this_cluster().block_rank() == 0;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(kp.counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!is_last) return false;
  __threadfence();  // every CTA's logits are visible to this one
  if (threadIdx.x == 0) *kp.counter = 0;
  return true;
}

// Route block `block` (tokens 32 block .. +32) after the wait: routes (or reads the given ids), counts pairs per
// expert; the last block to finish (`single_block`: the only one) turns the counts into padded offsets and the
// active-expert list, resets the counters, and with kp.fused_scatter also scatters every block's pairs. Padding rows
// of row_pair are left undefined: no kernel reads past an expert's count. s.hist is zero on entry.
// `logits`: where the router logits are read (generic address: shared memory of the cluster path), or nullptr for
// p.router_logits, read through L2.
__device__ void route_block(const MoeKernelParams& kp, RouteSmem& s, int block, bool single_block,
                            const float* logits_src = nullptr) {
  const MoeParams& p = kp.p;
  const int num_experts = p.num_experts, top_k = p.top_k;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int kTokensPerWarp = kRouteTokensPerBlock / kRouteWarps;
  const int first_token = block * kRouteTokensPerBlock + warp * kTokensPerWarp;
  if (p.router_logits != nullptr) {
    const int routed_experts = num_routed_experts(p);  // the logits' width
    float logits[kTokensPerWarp][kExpertsPerLane];  // all of the warp's loads in flight at once
#pragma unroll
    for (int i = 0; i < kTokensPerWarp; ++i) {
      const int token = first_token + i;
#pragma unroll
      for (int j = 0; j < kExpertsPerLane; ++j) {
        const int e = lane + 32 * j;
        // Through L2: with the fused router, other CTAs of this grid wrote them.
        const int64_t at = static_cast<int64_t>(token) * routed_experts + e;
        logits[i][j] = (token < p.num_tokens && e < routed_experts)
                           ? (logits_src != nullptr ? logits_src[at] : __ldcg(&p.router_logits[at]))
                           : -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < kTokensPerWarp; ++i) {
      if (first_token + i < p.num_tokens) route_token(kp, first_token + i, block, logits[i], s, warp, lane);
    }
  } else {
    for (int i = 0; i < kTokensPerWarp; ++i) {
      const int token = first_token + i;
      if (token >= p.num_tokens || lane >= top_k) continue;
      const int e = expert_slot(p, p.topk_ids[static_cast<int64_t>(token) * top_k + lane]);
      s.chunk_ids[(warp * kTokensPerWarp + i) * top_k + lane] = e;
      if (e >= 0 && e < num_experts) atomicAdd(&s.hist[e], 1);
    }
  }
  __syncthreads();
  if (!single_block) {
    for (int e = tid; e < num_experts; e += kRouteThreads) {
      const int count = s.hist[e];
      kp.block_counts[block * num_experts + e] = count;
      if (count > 0) atomicAdd(&kp.count_accum[e], count);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) s.is_last = atomicAdd(kp.counter, 1) == kp.route_blocks - 1;
    __syncthreads();
    if (!s.is_last) return;
    __threadfence();
  }

  // The last block: every block's counts are in place. Thread tid scans experts tid * kScanItems + i (CUB's blocked
  // arrangement), so the scan runs in expert order.
  int count[kScanItems];
  uint64_t packed[kScanItems];  // (padded rows << 32) | active
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = tid * kScanItems + i;
    count[i] = 0;
    if (e < num_experts) count[i] = single_block ? s.hist[e] : atomicExch(&kp.count_accum[e], 0);
    const int padded = (count[i] + kRowAlign - 1) / kRowAlign * kRowAlign;
    packed[i] = (static_cast<uint64_t>(padded) << 32) | (count[i] > 0 ? 1u : 0u);
  }
  uint64_t totals = 0;
  BlockScan(s.scan).ExclusiveSum(packed, packed, totals);
  const int total_rows = static_cast<int>(totals >> 32), num_active = static_cast<int>(totals & 0xffffffffu);
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = tid * kScanItems + i;
    const int offset = static_cast<int>(packed[i] >> 32), active_pos = static_cast<int>(packed[i] & 0xffffffffu);
    if (e < num_experts) {
      kp.expert_counts[e] = count[i];
      kp.expert_offsets[e] = offset;
      s.offsets[e] = offset;
      if (count[i] > 0) {
        kp.active_experts[active_pos] = e;
        // Shared experts (the last ones) first, then the routed ones in order (MoeKernelParams::shared_slots).
        const int shared_at = e - (num_experts - kp.shared_slots);
        const int slot = shared_at >= 0 ? shared_at : active_pos + kp.shared_slots;
        if (slot < kp.max_active) kp.slot_info[slot] = make_int4(e, count[i], offset, num_active);
      }
    }
  }
  for (int slot = num_active + tid; slot < kp.max_active; slot += kRouteThreads) {
    kp.slot_info[slot] = make_int4(-1, 0, 0, 0);  // a small-M CTA of this slot exits at once
  }
  if (tid == 0) {
    kp.expert_offsets[num_experts] = total_rows;
    kp.active_experts[num_experts] = num_active;
    if (!single_block) *kp.counter = 0;
  }
  if (kp.fused_scatter) {
    __syncthreads();
    if (single_block && static_cast<int64_t>(p.num_tokens) * top_k <= 32) {
      if (warp == 0) scatter_one_warp(kp, s, lane);  // decode: no per-warp histograms, no barriers
    } else {
      for (int b = 0; b < kp.route_blocks; ++b) scatter_chunk(kp, b, block, s);
    }
  }
}


// Grid: one block per 32 tokens (route_block).
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ RouteSmem s;
  for (int e = threadIdx.x; e < kp.p.num_experts; e += kRouteThreads) s.hist[e] = 0;
  __syncthreads();
  griddep_wait();
  griddep_launch_dependents();
  route_block(kp, s, static_cast<int>(blockIdx.x), gridDim.x == 1);
}

// The fused router's shared memory: every token's x first, then the routing's arrays.
union RouterRouteSmem {
  RouteSmem route;
  uint4 x[kRouterXBytesMax / 16];
};

// The fused router (kp.fused_router), a kernel of its own so that its registers (a lane holds kPieces 16-byte pieces
// of a router row) do not weigh on the route kernel. Grid: one CTA per 8 routed experts; the last to finish routes
// the (at most 32) tokens as the only route block.
template <int kPieces>
__global__ void __launch_bounds__(kRouteThreads) moe_router_route_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ RouterRouteSmem smem;
  __shared__ int32_t router_last;
  // Rank 0's copy receives every rank's logits on the cluster path: apart from x, which the ranks still read then.
  __shared__ float cluster_logits[kRouterClusterLogits];
  if (!compute_router_logits<kPieces>(kp, smem.x, cluster_logits, router_last)) return;
  __syncthreads();  // x's shared memory becomes the routing's
  for (int e = threadIdx.x; e < kp.p.num_experts; e += kRouteThreads) smem.route.hist[e] = 0;
  __syncthreads();
  route_block(kp, smem.route, 0, true, kp.router_cluster ? cluster_logits : nullptr);
}

// Grid: one block per route block (larger batches).
__global__ void __launch_bounds__(kRouteThreads) moe_scatter_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ RouteSmem s;
  griddep_wait();
  griddep_launch_dependents();
  for (int e = threadIdx.x; e < kp.p.num_experts; e += kRouteThreads) s.offsets[e] = __ldcg(&kp.expert_offsets[e]);
  const int block_pairs = kRouteTokensPerBlock * kp.p.top_k;
  const int64_t num_pairs = static_cast<int64_t>(kp.p.num_tokens) * kp.p.top_k;
  for (int at = threadIdx.x; at < block_pairs; at += kRouteThreads) {
    const int64_t pair = static_cast<int64_t>(blockIdx.x) * block_pairs + at;
    if (pair < num_pairs) s.chunk_ids[at] = expert_slot(kp.p, __ldcg(&kp.p.topk_ids[pair]));
  }
  __syncthreads();
  scatter_chunk(kp, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.x), s);
}

size_t align_256(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

}  // namespace

MoeWorkspaceLayout moe_workspace_layout(const MoeParams& p) {
  MoeWorkspaceLayout l;
  const size_t experts = static_cast<size_t>(std::max(p.num_experts, 0));
  const size_t tokens = static_cast<size_t>(std::max(p.num_tokens, 0));
  const size_t pairs = tokens * static_cast<size_t>(std::max(p.top_k, 0));
  l.route_blocks = static_cast<int32_t>((tokens + kRouteTokensPerBlock - 1) / kRouteTokensPerBlock);
  l.max_rows = static_cast<int32_t>(pairs + std::min(experts, pairs) * (kRowAlign - 1));
  size_t at = 0;
  const auto take = [&](size_t bytes) {
    const size_t offset = at;
    at = align_256(at + bytes);
    return offset;
  };
  l.counter = take(sizeof(int32_t));
  l.count_accum = take(experts * sizeof(int32_t));
  l.col_done = take(static_cast<size_t>(std::max(p.hidden, 0) / kDownColsPerCta) * sizeof(int32_t));
  l.ffn_sync = take((2 + experts) * sizeof(int32_t));
  l.zeroed_bytes = at;
  l.block_counts = take(static_cast<size_t>(l.route_blocks) * experts * sizeof(int32_t));
  l.expert_counts = take(experts * sizeof(int32_t));
  l.expert_offsets = take((experts + 1) * sizeof(int32_t));
  l.active_experts = take((experts + 1) * sizeof(int32_t));
  l.slot_info = take(experts * sizeof(int4));
  l.row_pair = take(static_cast<size_t>(l.max_rows) * sizeof(int32_t));
  l.act = take(pairs * static_cast<size_t>(std::max(p.inter, 0)) * 2);
  l.y = take(pairs * static_cast<size_t>(std::max(p.hidden, 0)) * 2);
  if (moe_grouped_w8a8_supported(p)) {
    const auto hidden = static_cast<size_t>(p.hidden), inter = static_cast<size_t>(p.inter);
    l.x_codes = take(tokens * hidden);
    l.x_scales = take(tokens * (hidden / kW8A8BlockK) * sizeof(float));
    l.act_codes = take(pairs * inter);
    l.act_scales = take(pairs * (inter / kW8A8BlockK) * sizeof(float));
  }
  l.total_bytes = at;
  return l;
}

MoeKernelParams make_kernel_params(const MoeParams& p) {
  const MoeWorkspaceLayout l = moe_workspace_layout(p);
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  MoeKernelParams kp;
  kp.p = p;
  kp.counter = reinterpret_cast<int32_t*>(ws + l.counter);
  kp.count_accum = reinterpret_cast<int32_t*>(ws + l.count_accum);
  kp.col_done = reinterpret_cast<int32_t*>(ws + l.col_done);
  kp.ffn_sync = reinterpret_cast<int32_t*>(ws + l.ffn_sync);
  kp.block_counts = reinterpret_cast<int32_t*>(ws + l.block_counts);
  kp.expert_counts = reinterpret_cast<int32_t*>(ws + l.expert_counts);
  kp.expert_offsets = reinterpret_cast<int32_t*>(ws + l.expert_offsets);
  kp.active_experts = reinterpret_cast<int32_t*>(ws + l.active_experts);
  kp.slot_info = reinterpret_cast<int4*>(ws + l.slot_info);
  kp.row_pair = reinterpret_cast<int32_t*>(ws + l.row_pair);
  kp.act = reinterpret_cast<uint16_t*>(ws + l.act);
  kp.y = reinterpret_cast<uint16_t*>(ws + l.y);
  if (l.x_codes != 0) {
    kp.x_codes = ws + l.x_codes;
    kp.x_scales = reinterpret_cast<float*>(ws + l.x_scales);
    kp.act_codes = ws + l.act_codes;
    kp.act_scales = reinterpret_cast<float*>(ws + l.act_scales);
  }
  kp.route_blocks = l.route_blocks;
  kp.fused_scatter = l.route_blocks <= kFusedScatterMaxBlocks ? 1 : 0;
  kp.max_rows = l.max_rows;
  kp.max_active = static_cast<int32_t>(
      std::min<int64_t>(p.num_experts, static_cast<int64_t>(p.num_tokens) * p.top_k));
  // Routing appends every shared expert to every token, so each has rows and a slot of its own (when the weights hold
  // them).
  const bool holds_shared = p.shard.num_local_routed < 0 || p.shard.holds_shared != 0;
  kp.shared_slots = p.router_logits != nullptr && holds_shared ? p.num_shared_experts : 0;
  kp.fused_router = p.router_weight != nullptr ? 1 : 0;
  const int64_t routed = num_routed_experts(p);
  const bool one_cluster = (routed + kRouteWarps - 1) / kRouteWarps <= kRouterClusterMax &&
                           static_cast<int64_t>(p.num_tokens) * routed <= kRouterClusterLogits;
  kp.router_cluster = kp.fused_router && one_cluster ? 1 : 0;
  return kp;
}

void check_common(const MoeParams& p) {
  DI_CHECK(p.num_tokens >= 0 && p.num_tokens <= (1 << 24), "moe: num_tokens ", p.num_tokens, " outside [0, 2^24]");
  DI_CHECK(p.num_experts >= 1 && p.num_experts <= kMaxExperts, "moe: ", p.num_experts, " experts outside [1, ",
           kMaxExperts, "]");
  const bool sharded = p.shard.num_local_routed >= 0;
  // Under a shard a token's pairs may outnumber the experts the weights hold.
  DI_CHECK(p.top_k >= 1 && p.top_k <= kMaxTopK && (sharded || p.top_k <= p.num_experts), "moe: top_k ", p.top_k,
           " outside [1, min(", kMaxTopK, ", experts ", p.num_experts, ")]");
  if (sharded) {
    const MoeShard& sh = p.shard;
    DI_CHECK(sh.num_routed >= 1 && sh.first_routed >= 0 && sh.first_routed + sh.num_local_routed <= sh.num_routed &&
                 p.num_experts >= sh.num_local_routed,
             "moe: shard of routed experts [", sh.first_routed, ", ", sh.first_routed + sh.num_local_routed,
             ") of ", sh.num_routed, " with ", p.num_experts, " experts in the weights");
    if (p.router_logits != nullptr) {
      DI_CHECK(p.num_experts == sh.num_local_routed + (sh.holds_shared ? p.num_shared_experts : 0),
               "moe: the weights' ", p.num_experts, " experts are not the shard's ", sh.num_local_routed,
               " routed ones", sh.holds_shared ? " and the shared ones" : "");
    }
  }
  DI_CHECK(p.workspace != nullptr && reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0,
           "moe: a 256-byte aligned workspace of ", moe_workspace_bytes(p), " bytes is required");
  DI_CHECK(p.topk_ids != nullptr && p.topk_weights != nullptr, "moe: topk_ids and topk_weights are required");
  if (p.router_weight != nullptr) {
    DI_CHECK(p.router_logits != nullptr && p.router_logits_out == p.router_logits && p.x != nullptr,
             "moe: the fused router writes its logits to router_logits_out, which must be router_logits, from x");
    DI_CHECK(moe_fused_router_supported(p.num_tokens, p.hidden), "moe: the route kernel cannot compute the router "
             "logits of ", p.num_tokens, " tokens of width ", p.hidden, " (moe_fused_router_supported)");
    DI_CHECK(reinterpret_cast<uintptr_t>(p.router_weight) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
             "moe: the router weight and x must be 16-byte aligned");
  }
  if (p.router_logits != nullptr) {
    const int32_t shared = p.num_shared_experts, routed = num_routed_experts(p), routed_k = p.top_k - shared;
    DI_CHECK(shared >= 0 && shared <= p.top_k && routed >= 1 && routed <= kMaxRoutedExperts && routed_k <= routed,
             "moe: ", p.num_experts, " experts and top_k ", p.top_k, " with ", shared, " shared leave ", routed,
             " routed experts (1 to ", kMaxRoutedExperts, ") and ", routed_k, " chosen among them");
    DI_CHECK(p.n_group >= 1 && p.n_group <= kMaxGroups && routed % p.n_group == 0, "moe: n_group ", p.n_group,
             " must divide ", routed, " routed experts and be at most ", kMaxGroups);
    if (p.method != MoeTopkMethod::kGreedy && p.n_group > 1) {
      DI_CHECK(p.topk_group >= 1 && p.topk_group <= p.n_group &&
                   static_cast<int64_t>(p.topk_group) * (routed / p.n_group) >= routed_k,
               "moe: topk_group ", p.topk_group, " of ", p.n_group, " groups leaves fewer than top_k ", routed_k,
               " experts");
    }
  }
}

void check_experts(const MoeParams& p, MoeExpertsPath path) {
  DI_CHECK(p.x != nullptr && p.w_gate_up != nullptr && p.w_down != nullptr && p.out != nullptr,
           "moe: null expert tensor pointer");
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  DI_CHECK(aligned(p.x) && aligned(p.w_gate_up) && aligned(p.w_down) && aligned(p.out) && aligned(p.add),
           "moe: x, weights, add and out must be 16-byte aligned");
  DI_CHECK(p.hidden > 0 && p.hidden % 32 == 0 && p.inter > 0 && p.inter % 32 == 0, "moe: hidden ", p.hidden,
           " and inter ", p.inter, " must be positive multiples of 32");
  if (p.weight_format == MoeWeightFormat::kFp8) {
    DI_CHECK(p.hidden % 128 == 0 && p.inter % 128 == 0 && p.w_gate_up_scale != nullptr && p.w_down_scale != nullptr,
             "moe: FP8 weights need hidden (", p.hidden, ") and inter (", p.inter,
             ") in multiples of 128 and both block-scale arrays");
  }
  if (p.weight_format == MoeWeightFormat::kInt4 || p.weight_format == MoeWeightFormat::kFp4) {
    const bool fp4 = p.weight_format == MoeWeightFormat::kFp4;
    const int32_t multiple = fp4 ? kFp4GroupMultiple : kInt4GroupMultiple;
    const auto takes = [&](int32_t g, int32_t k) { return g > 0 && g % multiple == 0 && k % g == 0; };
    const auto aligned4 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; };
    DI_CHECK(takes(p.group_size, p.hidden) && takes(p.down_group_size, p.inter) && p.w_gate_up_scale != nullptr &&
                 p.w_down_scale != nullptr && aligned4(p.w_gate_up_zeros) && aligned4(p.w_down_zeros) &&
                 (!fp4 || (p.w_gate_up_zeros == nullptr && p.w_down_zeros == nullptr)),
             "moe: ", fp4 ? "FP4" : "INT4", " weights need group sizes (gate/up ", p.group_size, ", down ",
             p.down_group_size, ") that are multiples of ", multiple, " and divide their K (hidden ", p.hidden,
             ", inter ", p.inter, "), and both group-scale arrays", fp4 ? " (and no zero points)" : "");
  }
  if (path == MoeExpertsPath::kGrouped) {
    DI_CHECK(p.hidden % 256 == 0 && p.inter % 128 == 0, "moe: the grouped kernels need hidden % 256 == 0 (",
             p.hidden, ") and inter % 128 == 0 (", p.inter, ")");
  }
}

void launch_route(const MoeKernelParams& kp, LaunchStream stream) {
  const LaunchShape shape{.grid = dim3(kp.route_blocks), .block = dim3(kRouteThreads)};
  if (kp.fused_router) {  // one route block (moe_fused_router_supported): the scatter is fused
    const int routed = num_routed_experts(kp.p);
    const unsigned ctas = (routed + kRouteWarps - 1) / kRouteWarps;
    const LaunchShape router_shape{.grid = dim3(ctas), .block = dim3(kRouteThreads),
                                   .cluster_ctas = kp.router_cluster ? ctas : 1u};
    if (kp.p.hidden <= 8 * 256) {  // V2-Lite's 2048
      launch_pdl(moe_router_route_kernel<8>, router_shape, stream, kp);
    } else {
      launch_pdl(moe_router_route_kernel<kRouterPiecesMax>, router_shape, stream, kp);
    }
    return;
  }
  launch_pdl(moe_route_kernel, shape, stream, kp);
  if (!kp.fused_scatter) launch_pdl(moe_scatter_kernel, shape, stream, kp);
}

}  // namespace moe_detail

bool moe_fused_router_supported(int64_t num_tokens, int64_t hidden) {
  using namespace moe_detail;
  return num_tokens >= 1 && hidden >= 256 && hidden % 256 == 0 && hidden / 256 <= kRouterPiecesMax &&
         num_tokens * hidden * 2 <= kRouterXBytesMax && num_tokens <= kRouteTokensPerBlock;
}

size_t moe_workspace_bytes(const MoeParams& p) { return moe_detail::moe_workspace_layout(p).total_bytes; }

void moe_workspace_init(const MoeParams& p, cudaStream_t stream) {
  DI_CHECK(p.workspace != nullptr, "moe_workspace_init: null workspace");
  CUDA_TRY(cudaMemsetAsync(p.workspace, 0, moe_detail::moe_workspace_layout(p).zeroed_bytes, stream));
}

void moe_route_align(const MoeParams& p, LaunchStream stream) {
  moe_detail::check_common(p);
  if (p.num_tokens == 0) return;
  moe_detail::launch_route(moe_detail::make_kernel_params(p), stream);
}

}  // namespace deepinfer::cuda
