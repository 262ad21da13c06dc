// MoE experts launcher: path choice (small-M or grouped), the weighted combine kernel, and the entry points.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda {
namespace moe_detail {
namespace {

// The small-M path while the average expert has at most this many rows. Measured on an H200 at V2-Lite's dims: the
// grouped kernels beat small-M at 256 tokens (24 rows an expert), and the engine's decode step at batch 128 (12 rows)
// took as long as at batch 256, so the switch moved from 16 to 8 rows. Far below one row an expert, small-M streams
// the weights near copy bandwidth, where the grouped kernel would compute 128-row blocks of padding.
constexpr int64_t kSmallMaxAverageRows = 8;
// Auto down prefetch when the active experts' W_down fits well inside L2 (50 MB on an H200).
constexpr int64_t kDownPrefetchMaxBytes = int64_t{36} << 20;

// out[t, :] = add[t, :] + sum_j weight[t, j] * y[t * top_k + j, :] in slot order (deterministic).
// Grid (tokens, column blocks of 8 * kCombineThreads).
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ float weight_s[kMaxTopK];
  const MoeParams& p = kp.p;
  griddep_wait();
  griddep_launch_dependents();
  const int token = blockIdx.x, top_k = p.top_k;
  if (threadIdx.x < top_k) {
    const int64_t pair = static_cast<int64_t>(token) * top_k + threadIdx.x;
    const int e = expert_slot(p, __ldcg(&p.topk_ids[pair]));
    weight_s[threadIdx.x] = (e >= 0 && e < p.num_experts) ? __ldcg(&p.topk_weights[pair]) : 0.0f;
  }
  __syncthreads();
  const int64_t row = static_cast<int64_t>(token) * p.hidden;
  for (int c = blockIdx.y * kCombineThreads + threadIdx.x; c < p.hidden / 8; c += gridDim.y * kCombineThreads) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < top_k; ++j) {
      const float w = weight_s[j];
      if (w == 0.0f) continue;  // an invalid id or one held elsewhere (no row), or a zero weight: nothing to add
      const uint4 v = ld_cg_16(kp.y + (static_cast<int64_t>(token) * top_k + j) * p.hidden + 8 * c);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = fmaf(w, bf16_lo(words[i]), acc[2 * i]);
        acc[2 * i + 1] = fmaf(w, bf16_hi(words[i]), acc[2 * i + 1]);
      }
    }
    if (p.add != nullptr) {
      const uint4 v = ld_cg_16(p.add + row + 8 * c);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] += bf16_lo(words[i]);
        acc[2 * i + 1] += bf16_hi(words[i]);
      }
    }
    uint4 out;
    out.x = pack_bf16x2(acc[0], acc[1]);
    out.y = pack_bf16x2(acc[2], acc[3]);
    out.z = pack_bf16x2(acc[4], acc[5]);
    out.w = pack_bf16x2(acc[6], acc[7]);
    *reinterpret_cast<uint4*>(p.out + row + 8 * c) = out;
  }
}

}  // namespace

void launch_combine(const MoeKernelParams& kp, LaunchStream stream) {
  const int chunks = kp.p.hidden / 8;
  const int column_blocks = (chunks + kCombineThreads - 1) / kCombineThreads;
  launch_pdl(moe_combine_kernel, {.grid = dim3(kp.p.num_tokens, column_blocks), .block = dim3(kCombineThreads)},
             stream, kp);
}

bool use_down_prefetch(const MoeParams& p, int32_t max_active) {
  // Bytes of weights (INT4, FP4: half a byte a weight, the scales aside).
  const int64_t half_bytes = p.weight_format == MoeWeightFormat::kInt4 || p.weight_format == MoeWeightFormat::kFp4 ? 1
                             : p.weight_format == MoeWeightFormat::kFp8 ? 2
                                                                        : 4;
  const int64_t down_bytes = static_cast<int64_t>(max_active) * p.hidden * p.inter * half_bytes / 2;
  return p.down_prefetch == MoeDownPrefetch::kOn ||
         (p.down_prefetch == MoeDownPrefetch::kAuto && down_bytes <= kDownPrefetchMaxBytes);
}

}  // namespace moe_detail

MoeExpertsPath moe_resolve_path(const MoeParams& p) {
  if (p.path != MoeExpertsPath::kAuto) return p.path;
  const int64_t pairs = static_cast<int64_t>(p.num_tokens) * p.top_k;
  const bool grouped_shapes = p.hidden % 256 == 0 && p.inter % 128 == 0;
  // Under a shard the pairs spread over the whole model's experts, of which the weights hold a share: rows per expert
  // are the pairs over the model's routed experts, not over the few held.
  const int64_t experts = p.shard.num_local_routed < 0 ? p.num_experts : p.shard.num_routed;
  return grouped_shapes && pairs > moe_detail::kSmallMaxAverageRows * experts ? MoeExpertsPath::kGrouped
                                                                              : MoeExpertsPath::kSmallM;
}

namespace {

// The expert kernels; `right_after_route`: the route kernel of the same call is the last kernel before them on the
// stream (moe_forward), which lets the shared experts' gate/up CTAs start before their wait (moe_small_gemm.cuh).
// The small-M path is one persistent launch up to kFusedFfnMaxTokens tokens at a hidden size of kFusedFfnMinHidden or
// more, and two kernels (gate/up, then down) otherwise.
void run_experts(const MoeParams& p, LaunchStream stream, bool right_after_route) {
  using namespace moe_detail;
  check_common(p);
  const MoeExpertsPath path = moe_resolve_path(p);
  check_experts(p, path);
  if (p.num_tokens == 0) return;
  MoeKernelParams kp = make_kernel_params(p);
  if (path == MoeExpertsPath::kSmallM) {
    kp.shared_prewait = right_after_route ? 1 : 0;
    kp.fused_combine = p.num_tokens <= kFusedCombineMaxTokens ? 1 : 0;
    if (p.num_tokens <= kFusedFfnMaxTokens && p.hidden >= kFusedFfnMinHidden) {
      launch_small_ffn(kp, stream);
      return;
    }
    kp.down_prefetch = use_down_prefetch(p, kp.max_active) ? 1 : 0;
    launch_small_gate_up(kp, stream);
    launch_small_down(kp, stream);
    if (!kp.fused_combine) launch_combine(kp, stream);
  } else {
    launch_grouped_gate_up(kp, stream);
    launch_grouped_down(kp, stream);
    launch_combine(kp, stream);
  }
}

}  // namespace

void moe_experts(const MoeParams& p, LaunchStream stream) { run_experts(p, stream, /*right_after_route=*/false); }

void moe_forward(const MoeParams& p, LaunchStream stream) {
  moe_route_align(p, stream);
  run_experts(p, stream, /*right_after_route=*/p.num_tokens > 0);
}

}  // namespace deepinfer::cuda
