// Between the MoE launchers (moe_route.cu, moe_experts.cu) and the expert GEMM instantiations
// (instantiations/moe_*.cu). Not part of the op's interface; the benchmark uses it to time single stages.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/moe/moe_params.h"

namespace deepinfer::cuda::moe_detail {

constexpr int kMaxRoutedExperts = kMoeMaxRoutedExperts;  // routing: a token's scores across a warp
constexpr int kMaxExperts = kMoeMaxExperts;              // routed + shared: histograms, scans, alignment
constexpr int kMaxTopK = kMoeMaxPairs;                   // pairs a token, routed + shared
constexpr int kMaxGroups = 32;          // one lane a group
constexpr int kRouteThreads = 256;      // 8 warps
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kRouteTokensPerBlock = 32;  // 4 tokens a warp; the scatter places kRouteThreads pairs a round (one
                                          // round up to 8 pairs a token, two up to kMaxTopK)
constexpr int kFusedScatterMaxBlocks = 4;  // up to this many route blocks, the last one also scatters
constexpr int kRowAlign = 128;          // each expert's row range is padded to the grouped kernel's M tile
constexpr int kRouterPiecesMax = 28;          // fused router: 16 bytes of every 512 of a row a lane holds (hidden up
                                             // to 28 * 256 = 7168, V3's)
constexpr int kRouterXBytesMax = 32 * 1024;  // fused router: every token's x in shared memory
constexpr int kRouterClusterMax = 8;         // fused router: the most CTAs one (portable) cluster takes
constexpr int kRouterClusterLogits = 1024;   // fused router cluster path: tokens x routed experts rank 0 receives
constexpr int kCombineThreads = 256;
constexpr int kDownColsPerCta = 32;        // output columns of a small-M down CTA
constexpr int kFusedCombineMaxTokens = 32;  // up to this many tokens the small-M down kernel also combines
// The small-M FFN runs as one persistent launch (launch_small_ffn) up to kFusedFfnMaxTokens tokens at a hidden size
// of at least kFusedFfnMinHidden, where it measured faster than two kernels (moe_bench --decode on an H200): at V3's
// hidden size (7168) up to 4 tokens, not at 8, and not at V2-Lite's (2048) even for 1 token. Long items (K = 7168) amortize the tickets and the slot
// handoff; at 2048 the two grids' one round each is shorter.
constexpr int kFusedFfnMaxTokens = 4;
constexpr int kFusedFfnMinHidden = 4096;
// The W8A8 grouped kernels (moe_grouped_w8a8.cuh) take 128-wide K blocks (one scale block each) and keep four of them
// in flight, and a tile's row -> pair table arrives with the first K block of the tile before it: a tile must be at
// least that many K blocks long (K >= 512). Smaller problems run the W8A16 grouped kernels.
constexpr int kW8A8BlockK = 128;
constexpr int kW8A8MinKBlocks = 4;
// INT4 weights (MoeWeightFormat::kInt4): the group size is a multiple of this, so a 32-wide K chunk (one packed word
// a lane in the small-M kernels, half a 64-wide K block in the grouped ones) lies inside one group.
constexpr int kInt4GroupMultiple = kMoeInt4GroupMultiple;
constexpr int kFp4GroupMultiple = kMoeFp4GroupMultiple;  // FP4: a lane's word of 8 inputs, a half of 32, in one group

static_assert(kMaxRoutedExperts % 32 == 0 && kMaxRoutedExperts <= 32 * 32, "routing: a lane's experts in 32 bits");
static_assert(kMaxRoutedExperts <= kMaxExperts, "the routed experts come first");
static_assert(kMaxTopK <= 32, "routing: one lane a pair");
static_assert(kRouteTokensPerBlock % kRouteWarps == 0, "whole tokens a warp");

// The routed experts routing chooses among (the router logits' width): the weights' experts but the shared ones, or
// under a shard the whole model's.
__host__ __device__ __forceinline__ int32_t num_routed_experts(const MoeParams& p) {
  return p.shard.num_local_routed < 0 ? p.num_experts - p.num_shared_experts : p.shard.num_routed;
}

// The weights' slot of global expert `id` (MoeShard), or -1 when they do not hold it; every expert: `id` itself. A
// caller drops the pair unless the slot is in [0, num_experts).
__host__ __device__ __forceinline__ int expert_slot(const MoeParams& p, int id) {
  const MoeShard& s = p.shard;
  if (s.num_local_routed < 0) return id;
  if (id < s.num_routed) {
    const int local = id - s.first_routed;
    return local >= 0 && local < s.num_local_routed ? local : -1;
  }
  return s.holds_shared ? s.num_local_routed + (id - s.num_routed) : -1;
}

// Which product of the expert FFN a kernel computes.
enum class GemmKind : uint8_t { kGateUp, kDown };

// What the kernels get: the caller's parameters plus the workspace carved into arrays.
struct MoeKernelParams {
  MoeParams p;
  int32_t* counter = nullptr;         // [1]: route blocks finished; zero between calls
  int32_t* count_accum = nullptr;     // [E]: rows per expert summed over route blocks; zero between calls
  int32_t* col_done = nullptr;        // [hidden / 32]: small-M down CTAs finished per column block; zero between calls
  // [2 + E]: the fused small-M FFN kernel's next ticket, CTAs finished, and per slot its gate/up items finished; zero
  // between calls (the last CTA out resets them).
  int32_t* ffn_sync = nullptr;
  int32_t* block_counts = nullptr;    // [route_blocks, E]: each route block's histogram
  int32_t* expert_counts = nullptr;   // [E]: rows (pairs) per expert
  int32_t* expert_offsets = nullptr;  // [E + 1]: first padded row of each expert; [E] = padded total (x kRowAlign)
  int32_t* active_experts = nullptr;  // [E + 1]: experts with rows, ascending; [E] = their number
  // [max_active]: per small-M grid slot, {expert, its rows, its first row, active experts} for the active experts in
  // order, then expert -1: what a small-M CTA needs to start, in one load (instead of the count and the expert, then
  // the expert's rows).
  ::int4* slot_info = nullptr;  // (::int4, the CUDA vector type: gemm/int4_unpack.cuh has a namespace int4)
  int32_t* row_pair = nullptr;        // [max_rows]: pair t * top_k + j of each row; padding rows undefined
  uint16_t* act = nullptr;            // [num_tokens * top_k, inter] bf16, by pair
  uint16_t* y = nullptr;              // [num_tokens * top_k, hidden] bf16, by pair
  // W8A8 grouped path only (moe_grouped_w8a8_supported), else null: x and act quantized per row per 128 channels
  // (quantize_fp8_activations), codes row-major and scales row-contiguous ([channels / 128][rows]).
  uint8_t* x_codes = nullptr;         // [num_tokens, hidden]
  float* x_scales = nullptr;          // [hidden / 128, num_tokens]
  uint8_t* act_codes = nullptr;       // [num_tokens * top_k, inter]
  float* act_scales = nullptr;        // [inter / 128, num_tokens * top_k]
  int32_t route_blocks = 0;
  int32_t fused_scatter = 0;          // 1: the last route block scatters all pairs (no scatter kernel)
  int32_t max_rows = 0;               // padded rows the workspace holds
  int32_t max_active = 0;             // min(E, num_tokens * top_k): the grid's expert dimension (small-M path)
  int32_t fused_router = 0;           // 1: the route kernel computes the logits (p.router_weight), one route block
  // 1: the fused router's CTAs are one thread-block cluster (grid <= kRouterClusterMax): they hand their logits to
  // rank 0's shared memory and meet at a cluster barrier, instead of a fence, a completion counter and a reload of
  // the logits through L2 (three round trips, slow while the shared experts' loads fill the memory system).
  int32_t router_cluster = 0;
  int32_t down_prefetch = 0;          // 1: the small-M gate/up kernel prefetches W_down of its expert into L2
  int32_t fused_combine = 0;          // 1: the last small-M down CTA of each column block combines it (no combine
                                      // kernel)
  // S when the routing computes the ids (router logits given) and appends S shared experts to every token: then the
  // route kernel gives them small-M slots 0 .. S - 1 (expert E + j, every token's pair k + j), the routed experts
  // follow. 0: slots in expert order.
  int32_t shared_slots = 0;
  // 1: the small-M gate/up CTAs of the shared slots do all their work before their grid dependency wait (moe_forward
  // only: its route kernel runs right before, so x, an input of the router, is complete; moe_small_gemm.cuh).
  int32_t shared_prewait = 0;
};

// Byte offsets of the workspace arrays (256-byte aligned). The zeroed header (counter, count_accum, col_done,
// ffn_sync) comes first and depends only on the expert count and hidden size, so a workspace serves any token count up
// to the one it was sized for.
struct MoeWorkspaceLayout {
  size_t counter = 0, count_accum = 0, col_done = 0, ffn_sync = 0, block_counts = 0, expert_counts = 0,
         expert_offsets = 0, active_experts = 0, slot_info = 0, row_pair = 0, act = 0, y = 0;
  size_t x_codes = 0, x_scales = 0, act_codes = 0, act_scales = 0;  // W8A8 grouped path only (0: none)
  size_t zeroed_bytes = 0;  // [0, zeroed_bytes) must be zero between calls
  size_t total_bytes = 0;
  int32_t route_blocks = 0, max_rows = 0;
};

MoeWorkspaceLayout moe_workspace_layout(const MoeParams& p);

// Whether the grouped kernels run W8A8 for `p` (FP8 weights with fp8_activations, K blocks of 128, every K at least
// kW8A8MinKBlocks blocks long); otherwise FP8 weights run W8A16.
inline bool moe_grouped_w8a8_supported(const MoeParams& p) {
  const auto k_ok = [](int32_t k) { return k % kW8A8BlockK == 0 && k / kW8A8BlockK >= kW8A8MinKBlocks; };
  return p.weight_format == MoeWeightFormat::kFp8 && p.fp8_activations != 0 && k_ok(p.hidden) && k_ok(p.inter);
}

// Resolves the workspace pointers and derived values (no checks).
MoeKernelParams make_kernel_params(const MoeParams& p);

// Parameter checks shared by the entry points (throws deepinfer::Error).
void check_common(const MoeParams& p);
void check_experts(const MoeParams& p, MoeExpertsPath path);

// Whether the small-M gate/up kernel prefetches W_down into L2 (p.down_prefetch, kAuto: when the active experts'
// W_down fits well inside L2).
bool use_down_prefetch(const MoeParams& p, int32_t max_active);

// Stage launchers: programmatic dependent launches on `stream` (launch_pdl, launch.h).
void launch_route(const MoeKernelParams& kp, LaunchStream stream);  // route (+ scatter)
void launch_small_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_small_down(const MoeKernelParams& kp, LaunchStream stream);
// Gate/up, down and the combine of the small-M path in one persistent launch (up to 8 tokens: one token tile; the
// auto choice is narrower, see kFusedFfnMaxTokens).
void launch_small_ffn(const MoeKernelParams& kp, LaunchStream stream);
// The INT4 instantiations the two launchers above hand INT4 weights to (instantiations/moe_small_int4_*.cu).
void launch_small_int4_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_small_int4_down(const MoeKernelParams& kp, LaunchStream stream);
// The FP4 ones (instantiations/moe_small_fp4_*.cu).
void launch_small_fp4_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_small_fp4_down(const MoeKernelParams& kp, LaunchStream stream);
// The grouped kernels: bf16, W8A16 or (moe_grouped_w8a8_supported) W8A8, which quantizes its input first.
void launch_grouped_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_grouped_down(const MoeKernelParams& kp, LaunchStream stream);
void launch_grouped_w8a8_gate_up(const MoeKernelParams& kp, LaunchStream stream);  // the kernel alone
void launch_grouped_w8a8_down(const MoeKernelParams& kp, LaunchStream stream);
// W4A16 (INT4 weights), what the two grouped launchers above hand INT4 weights to (instantiations/
// moe_grouped_int4_*.cu).
void launch_grouped_int4_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_grouped_int4_down(const MoeKernelParams& kp, LaunchStream stream);
// FP4 weights, weight-only (instantiations/moe_grouped_fp4_*.cu).
void launch_grouped_fp4_gate_up(const MoeKernelParams& kp, LaunchStream stream);
void launch_grouped_fp4_down(const MoeKernelParams& kp, LaunchStream stream);
void launch_combine(const MoeKernelParams& kp, LaunchStream stream);

}  // namespace deepinfer::cuda::moe_detail
