// moe_route, moe_experts and moe: the argument checks, the fused kernels' parameters (route_params,
// set_experts_params), the workspace and the router's placement.
#include <climits>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/gemm/gemm_ops.h"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/op_checks.h"

namespace deepinfer::cuda {
namespace {

// Experts and pairs a token, routed and shared together.
void check_moe_sizes(int64_t experts, int64_t top_k, const char* op) {
  constexpr int64_t kMaxExperts = kMoeMaxExperts, kMaxTopK = kMoeMaxPairs;
  if (experts < 1 || experts > kMaxExperts || top_k < 1 || top_k > kMaxTopK) {
    throw UnsupportedOp(str_cat(op, ": the kernels take 1 to ", kMaxExperts, " experts and 1 to ", kMaxTopK,
                                " pairs a token (routed and shared); got ", experts, " experts, ", top_k, " pairs"));
  }
}

// The routing half of the fused MoE kernels' parameters (routed + shared experts and pairs), after the checks.
MoeParams route_params(const CudaContext& ctx, const MoeRouteArgs& a, const char* op) {
  check_on_device(a.logits, op, "logits");
  check_on_device(a.correction_bias, op, "correction_bias");
  check_on_device(a.topk_ids, op, "topk_ids");
  check_on_device(a.topk_weights, op, "topk_weights");
  const int64_t tokens = a.logits.shape[0], routed = a.logits.shape[1], shared = a.num_shared_experts;
  const int64_t experts = routed + shared, top_k = a.topk_ids.shape[1];  // routed + shared experts and pairs
  if (tokens > 0 && top_k > 0) {  // nothing to route: no limit applies (the call does nothing)
    if (routed > kMoeMaxRoutedExperts) {
      throw UnsupportedOp(str_cat(op, ": the kernels route among at most ", kMoeMaxRoutedExperts, " experts; got ",
                                  routed));
    }
    check_moe_sizes(experts, top_k, op);
  }
  DI_CHECK(tokens <= (int64_t{1} << 24), op, ": ", tokens, " tokens");
  return {.router_logits = a.logits.as<float>(),
          .correction_bias = a.correction_bias.numel() > 0 ? a.correction_bias.as<float>() : nullptr,
          .topk_ids = a.topk_ids.as<int32_t>(),
          .topk_weights = a.topk_weights.as<float>(),
          .num_tokens = static_cast<int32_t>(tokens),
          .num_experts = static_cast<int32_t>(experts),
          .top_k = static_cast<int32_t>(top_k),
          .num_shared_experts = static_cast<int32_t>(shared),
          .n_group = static_cast<int32_t>(a.n_group),
          .topk_group = static_cast<int32_t>(a.topk_group),
          .routed_scaling_factor = a.routed_scaling_factor,
          .scoring = a.scoring == ExpertScoring::kSoftmax ? MoeScoring::kSoftmax : MoeScoring::kSigmoid,
          .method = a.method == TopkMethod::kGreedy               ? MoeTopkMethod::kGreedy
                    : a.method == TopkMethod::kGroupLimitedGreedy ? MoeTopkMethod::kGroupLimitedGreedy
                                                                  : MoeTopkMethod::kNoauxTc,
          .normalize = a.norm_topk_prob ? MoeNormalize::kYes : MoeNormalize::kNo,
          .num_sms = ctx.num_sms()};
}

// Packed 4-bit experts (core/weight.h; the caller has checked that both weights are INT4, or both FP4): group sizes
// the kernels take (MoeParams::group_size, down_group_size), and the float32 scales and int32 zero points (each
// optional; FP4 has none) of the packed layout.
void set_int4_experts_params(const MoeExpertsArgs& a, const char* op, int64_t hidden, int64_t inter, MoeParams& p) {
  const WeightView& gu = a.w_gate_up;
  const WeightView& dn = a.w_down;
  const bool fp4 = gu.is_fp4();
  const char* const kind = fp4 ? "FP4" : "INT4";
  const int64_t multiple = fp4 ? kMoeFp4GroupMultiple : kMoeInt4GroupMultiple;
  check_on_device(gu.scale_inv, op, "w_gate_up scale_inv");
  check_on_device(dn.scale_inv, op, "w_down scale_inv");
  check_on_device(gu.zeros, op, "w_gate_up zeros");
  check_on_device(dn.zeros, op, "w_down zeros");
  const int64_t experts = gu.shape[0];
  const auto expect = [&](const ConstTensorView& t, DType dtype, const Shape& shape, const char* what) {
    DI_CHECK(t.dtype == dtype && t.shape == shape, op, ": ", kind, " ", what, " must be ", dtype_name(dtype), " ",
             shape.str(), "; got ", dtype_name(t.dtype), " ", t.shape.str());
  };
  DI_CHECK(gu.scale_inv.shape.ndim() == 3 && dn.scale_inv.shape.ndim() == 3 && gu.scale_inv.shape[2] > 0 &&
               dn.scale_inv.shape[2] > 0,
           op, ": ", kind, " expert weights need 3-D group scales; got ", gu.scale_inv.shape.str(), " and ",
           dn.scale_inv.shape.str());
  const int64_t g = gu.group_size(), g_down = dn.group_size();
  const auto takes = [&](int64_t group, int64_t k) { return group > 0 && group % multiple == 0 && k % group == 0; };
  if (!takes(g, hidden) || !takes(g_down, inter) || hidden / g != gu.scale_inv.shape[2] ||
      inter / g_down != dn.scale_inv.shape[2]) {
    throw UnsupportedOp(str_cat(op, ": ", kind, " expert weights need group sizes in multiples of ", multiple,
                                " that divide their K (gate/up: hidden ", hidden, ", down: intermediate ", inter,
                                "); got ", gu.scale_inv.shape[2], " groups a gate/up row and ", dn.scale_inv.shape[2],
                                " a down row"));
  }
  expect(gu.scale_inv, DType::kF32, {experts, 2 * inter, hidden / g}, "w_gate_up scales");
  expect(dn.scale_inv, DType::kF32, {experts, hidden, inter / g_down}, "w_down scales");
  if (!gu.symmetric()) {
    expect(gu.zeros, DType::kI32, {experts, 2 * inter, int4_zero_words(hidden / g)}, "w_gate_up zero points");
  }
  if (!dn.symmetric()) {
    expect(dn.zeros, DType::kI32, {experts, hidden, int4_zero_words(inter / g_down)}, "w_down zero points");
  }
  p.w_gate_up_scale = gu.scale_inv.as<float>();
  p.w_down_scale = dn.scale_inv.as<float>();
  p.w_gate_up_zeros = gu.symmetric() ? nullptr : gu.zeros.as<int32_t>();
  p.w_down_zeros = dn.symmetric() ? nullptr : dn.zeros.as<int32_t>();
  DI_CHECK(!fp4 || (gu.symmetric() && dn.symmetric()), op, ": FP4 expert weights have no zero points");
  p.group_size = static_cast<int32_t>(g);
  p.down_group_size = static_cast<int32_t>(g_down);
  p.weight_format = fp4 ? MoeWeightFormat::kFp4 : MoeWeightFormat::kInt4;
}

// The experts half: operands, sizes, and the ids and weights (read, never written, when given as inputs).
void set_experts_params(const CudaContext& ctx, const MoeExpertsArgs& a, const char* op, MoeParams& p) {
  check_on_device(a.x, op, "x");
  check_on_device(a.w_gate_up, op, "w_gate_up");
  check_on_device(a.w_down, op, "w_down");
  check_on_device(a.topk_ids, op, "topk_ids");
  check_on_device(a.topk_weights, op, "topk_weights");
  check_on_device(a.out, op, "out");
  const int64_t tokens = a.x.shape[0], hidden = a.x.shape[1], experts = a.w_gate_up.shape[0];
  const int64_t inter = a.w_down.shape[2], top_k = a.topk_ids.shape[1];
  p.num_tokens = static_cast<int32_t>(tokens);
  p.num_sms = ctx.num_sms();
  if (tokens == 0) return;
  const bool fp8 = a.w_gate_up.is_fp8(), packed4 = a.w_gate_up.is_packed4() || a.w_down.is_packed4();
  const DType w_dtype = fp8 ? DType::kF8E4M3 : packed4 ? a.w_gate_up.dtype : DType::kBF16;
  if (a.x.dtype != DType::kBF16 || a.w_gate_up.dtype != w_dtype || a.w_down.dtype != w_dtype ||
      hidden % 32 != 0 || inter % 32 != 0 || hidden == 0 || inter == 0 || top_k == 0) {
    throw UnsupportedOp(str_cat(op, ": the kernels take bfloat16 x and bfloat16 (or both FP8, INT4 or FP4) weights "
                                "with hidden and intermediate sizes in positive multiples of 32; got ",
                                dtype_name(a.x.dtype),
                                " x, ", dtype_name(a.w_gate_up.dtype), " gate/up and ", dtype_name(a.w_down.dtype),
                                " down weights, hidden ", hidden, ", intermediate ", inter, ", top_k ", top_k));
  }
  if (fp8) {
    // The kernels read one scale per 128 x 128 block and never a partial block: a row tile or K slice never straddles
    // two blocks.
    if (hidden % kFp8Block != 0 || inter % kFp8Block != 0) {
      throw UnsupportedOp(str_cat(op, ": FP8 expert weights need hidden and intermediate sizes in multiples of ",
                                  kFp8Block, " (the scale blocks); got hidden ", hidden, ", intermediate ", inter));
    }
    check_on_device(a.w_gate_up.scale_inv, op, "w_gate_up scale_inv");
    check_on_device(a.w_down.scale_inv, op, "w_down scale_inv");
    DI_CHECK(a.w_gate_up.scale_inv.dtype == DType::kF32 && a.w_down.scale_inv.dtype == DType::kF32 &&
                 a.w_gate_up.scale_inv.shape == fp8_scale_shape(a.w_gate_up.shape) &&
                 a.w_down.scale_inv.shape == fp8_scale_shape(a.w_down.shape),
             op, ": FP8 scales must be float32 ", fp8_scale_shape(a.w_gate_up.shape).str(), " and ",
             fp8_scale_shape(a.w_down.shape).str(), "; got ", dtype_name(a.w_gate_up.scale_inv.dtype), " ",
             a.w_gate_up.scale_inv.shape.str(), " and ", dtype_name(a.w_down.scale_inv.dtype), " ",
             a.w_down.scale_inv.shape.str());
    p.w_gate_up_scale = a.w_gate_up.scale_inv.as<float>();
    p.w_down_scale = a.w_down.scale_inv.as<float>();
    // fp8_activations allows, and does not require, FP8 activations (weight.h): the grouped (prefill) kernels take
    // it where the sizes allow (moe_grouped_w8a8_supported), decode sizes stay W8A16.
    p.fp8_activations = a.w_gate_up.fp8_activations && a.w_down.fp8_activations ? 1 : 0;
  }
  if (packed4) {
    set_int4_experts_params(a, op, hidden, inter, p);
  } else {
    p.weight_format = fp8 ? MoeWeightFormat::kFp8 : MoeWeightFormat::kBf16;
  }
  check_moe_sizes(experts, top_k, op);
  DI_CHECK(tokens <= (int64_t{1} << 24) && hidden <= INT32_MAX && inter <= INT32_MAX, op, ": ", tokens,
           " tokens, hidden ", hidden, ", intermediate ", inter);
  p.topk_ids = const_cast<int32_t*>(a.topk_ids.as<int32_t>());  // given ids: the kernels only read them
  p.topk_weights = const_cast<float*>(a.topk_weights.as<float>());
  p.x = a.x.as<uint16_t>();
  p.w_gate_up = a.w_gate_up.data;
  p.w_down = a.w_down.data;
  p.add = nullptr;
  p.out = a.out.as<uint16_t>();
  p.hidden = static_cast<int32_t>(hidden);
  p.inter = static_cast<int32_t>(inter);
  p.num_experts = static_cast<int32_t>(experts);
  p.top_k = static_cast<int32_t>(top_k);
  if (!a.shard.all()) {  // validate() has checked the ranges, which fit int32
    p.shard = {.first_routed = static_cast<int32_t>(a.shard.first_routed),
               .num_local_routed = static_cast<int32_t>(a.shard.num_local_routed),
               .num_routed = static_cast<int32_t>(a.shard.num_routed),
               .holds_shared = a.shard.holds_shared ? 1 : 0};
  }
}

// The fused kernels' workspace of `use`, 256-byte aligned (what the kernels want), for `p`. Its zeroed header
// (completion counter and count accumulators) is zeroed when the buffer is new or the header's layout (experts,
// hidden) changes; every call leaves it zero.
void* moe_workspace(CudaContext& ctx, WorkspaceUse use, const MoeParams& p) {
  constexpr size_t kAlign = 256;
  const uint64_t layout = (uint64_t{static_cast<uint32_t>(p.num_experts)} << 32) | static_cast<uint32_t>(p.hidden);
  const WorkspaceGrant ws =
      ctx.workspace(use, {.bytes = moe_workspace_bytes(p), .alignment = kAlign, .layout = layout});
  if (ws.fresh) {
    MoeParams init = p;
    init.workspace = ws.data;
    moe_workspace_init(init, ctx.stream());
    ctx.ledger().serialized();  // a memset: it waits for the work before it, and the work after waits for it
  }
  return ws.data;
}

}  // namespace

// Routing runs the fused route + alignment kernels (moe_route_align): the alignment it also leaves in its workspace is
// unused here, since moe_experts takes the ids as an input and aligns them itself (the moe op below does not). The
// kernels count the shared experts in num_experts and top_k (moe_params.h).
void moe_route(CudaContext& ctx, const MoeRouteArgs& a) {
  const auto timing = ctx.timed("moe_route");
  a.validate();  // shapes and dtypes only
  MoeParams p = route_params(ctx, a, "cuda moe_route");
  if (p.num_tokens == 0 || p.top_k == 0) return;
  p.workspace = moe_workspace(ctx, WorkspaceUse::kMoeRoute, p);
  moe_route_align(p, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

// The experts take the given ids (the "given ids" mode of the fused kernels: with no router logits, the first kernel
// only aligns the (token, slot) pairs by expert), then the grouped SwiGLU GEMMs and the weighted combine. Under a
// shard the kernels map each global id to its slot where they read it and drop the pairs held elsewhere.
void moe_experts(CudaContext& ctx, const MoeExpertsArgs& a) {
  const auto timing = ctx.timed("moe_experts");
  a.validate();  // shapes and dtypes; the ids are device memory, checked on the host before their upload
  MoeParams p;
  set_experts_params(ctx, a, "cuda moe_experts", p);
  if (p.num_tokens == 0) return;
  p.workspace = moe_workspace(ctx, WorkspaceUse::kMoeExperts, p);
  moe_forward(p, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

// Routing and experts with one alignment: the route kernel groups the pairs by expert as it routes, and the expert
// kernels read that grouping (moe_forward with router logits), one kernel fewer than moe_route + moe_experts. With the
// router given, the route kernel also computes the logits at decode sizes (one kernel fewer again); otherwise linear
// computes them first.
void moe(CudaContext& ctx, const MoeArgs& a) {
  const auto timing = ctx.timed("moe");
  constexpr const char* kOp = "cuda moe";
  a.validate();
  check_on_device(a.router, kOp, "router");
  const int64_t tokens = a.x.shape[0];
  if (tokens == 0) return;
  const bool fuse_router =
      a.router.data != nullptr && a.x.dtype == DType::kBF16 && moe_fused_router_supported(tokens, a.x.shape[1]);
  if (a.router.data != nullptr && !fuse_router) linear(ctx, {.x = a.x, .w = a.router, .out = a.router_logits});
  MoeParams p = route_params(ctx, a.route, kOp);
  set_experts_params(ctx, a.experts(), kOp, p);
  if (fuse_router) {
    p.router_weight = static_cast<const uint16_t*>(a.router.data);
    p.router_logits_out = a.router_logits.as<float>();
  }
  p.workspace = moe_workspace(ctx, WorkspaceUse::kMoeExperts, p);
  moe_forward(p, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
