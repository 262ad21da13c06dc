// Parameters of the fused MoE kernels: routing on the device, token -> expert alignment, the routed experts' SwiGLU
// FFN as grouped GEMMs, and the weighted combine. Semantics are the CPU reference's (backend/cpu/moe.cpp):
//
//   routing (V3): s = sigmoid(logits); choice = s + correction_bias; group score = sum of the top-2 choices of the
//                 group; the best topk_group groups are kept (others -inf); top_k experts by choice
//   routing (V2): s = softmax(logits); greedy, or group-limited (group score = max choice)
//   weight[t, j] = s[t, id[t, j]] (divided by the sum of the k weights when normalized) * routed_scaling_factor
//   shared experts: pairs k .. k + S - 1 of every token are experts E .. E + S - 1 with weight 1
//   out[t] = add[t] + sum_j weight[t, j] * W_down[e] · (silu(W_gate[e] · x[t]) * (W_up[e] · x[t])),  e = id[t, j]
//
// Here E = num_experts - num_shared_experts experts are routed (the router logits' width; under a shard E =
// shard.num_routed, see MoeShard), k = top_k - num_shared_experts are chosen among them, and S = num_shared_experts
// follow: num_experts and top_k count every expert of the weights and every pair of a token, and everything after the
// routing (alignment, expert GEMMs, combine) sees only those totals.
//
// Ties between equal scores go to the lower index, as in the reference. All tensors are contiguous; bf16 values are
// stored as their 16-bit patterns (uint16_t).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

constexpr int32_t kMoeMaxRoutedExperts = 256;  // E: routing holds a token's scores in a warp, 8 a lane
constexpr int32_t kMoeMaxExperts = 264;        // E + S: V3's 256 + 1, V2's 160 + 2, with room for 8 shared
constexpr int32_t kMoeMaxPairs = 10;           // k + S pairs a token: V3's 8 + 1, V2's 6 + 2
constexpr int32_t kMoeInt4GroupMultiple = 32;  // INT4 weights: the group size is a multiple of this (group_size)
constexpr int32_t kMoeFp4GroupMultiple = 16;   // FP4 weights: the group size is a multiple of this

enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };
enum class MoeTopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class MoeNormalize : uint8_t { kNo, kYes };  // norm_topk_prob

// Which expert kernels run. kAuto picks by the average rows per expert; the others exist for tests and benchmarks.
enum class MoeExpertsPath : uint8_t {
  kAuto,
  kSmallM,   // few rows per expert: weights streamed once, split-K GEMV-style tiles on mma.sync (decode)
  kGrouped,  // many rows per expert: 128 x 256 tiles on warpgroup MMA, persistent over all experts (prefill)
};

// How the expert weights are stored. kFp8: e4m3 codes (one byte each) with one float32 scale_inv per 128 x 128 block
// of every expert matrix (DeepSeek's block-scaled FP8); dequantized w[e][r][c] = e4m3(code) * scale[e][r/128][c/128].
// The small-M kernels widen the codes to bf16 against bf16 activations (W8A16) exactly, the scale applied to each
// 128-wide K block's fp32 partial sums. The grouped kernels either round e4m3 * scale to bf16 once, in shared memory
// (W8A16), or, with MoeParams::fp8_activations, multiply e4m3 activations by e4m3 codes on FP8 tensor cores (W8A8).
// kInt4 (W4A16): core/weight.h's packed INT4 weights, unsigned 4-bit codes q, eight inputs a 32-bit word in AutoAWQ's
// interleaved nibble order, with a float32 scale s and a zero point z per group of group_size inputs of a row;
// dequantized w[e][r][c] = (q - z) * s[e][r][c / G]. The small-M kernels form (q - z) in bf16 registers exactly and
// apply each row's group scale to each 32-wide K chunk's fp32 partial sums (no rounding of the weight); the grouped
// kernels round (q - z) * s to bf16 once, in shared memory, as the FP8 W8A16 ones.
// kFp4 (weight-only NVFP4 / MXFP4): the same packing with e2m1 codes, no zero points, G a multiple of 16 (16 and 32 in
// practice): w[e][r][c] = e2m1(q) * s[e][r][c / G]. Groups narrower than a K chunk: every kernel rounds e2m1(q) * s to
// bf16 in registers (the small-M ones, a lane's word of 8 inputs inside one group) or in shared memory (grouped).
enum class MoeWeightFormat : uint8_t { kBf16, kFp8, kInt4, kFp4 };

// Whether the small-M gate/up kernel also pulls the active experts' down weights into L2 for the next kernel.
enum class MoeDownPrefetch : uint8_t { kAuto, kOff, kOn };

// Expert parallelism (ops/moe.h, ExpertShard): the weights hold routed experts [first_routed, first_routed +
// num_local_routed) of num_routed, then, with holds_shared, the shared ones; num_experts counts those. Routing still
// chooses among all num_routed and writes global ids; every kernel that reads an id maps it to its weights' slot
// there (moe_internal.h, expert_slot), and a pair of an expert held elsewhere gets no row and adds nothing to the
// combine. num_local_routed < 0: every expert, ids are the slots (no mapping).
struct MoeShard {
  int32_t first_routed = 0;
  int32_t num_local_routed = -1;
  int32_t num_routed = 0;
  int32_t holds_shared = 1;
};

struct MoeParams {
  // Routing. With router_logits null, topk_ids / topk_weights are inputs and only the alignment runs.
  const float* router_logits = nullptr;    // [num_tokens, num_experts - num_shared_experts] fp32
  const float* correction_bias = nullptr;  // [num_experts - num_shared_experts] fp32, or null (V3's bias)
  // The router, optional (decode sizes, moe_fused_router_supported): with router_weight ([num_experts -
  // num_shared_experts, hidden] bf16) the route kernel computes the logits x · router_weight^T itself and writes
  // them to router_logits_out, which must be the buffer router_logits points at.
  const uint16_t* router_weight = nullptr;
  float* router_logits_out = nullptr;
  int32_t* topk_ids = nullptr;             // [num_tokens, top_k]: written by routing, in selection order, shared last
  float* topk_weights = nullptr;           // [num_tokens, top_k]: written by routing
  // Experts.
  const uint16_t* x = nullptr;          // [num_tokens, hidden] bf16
  // bf16 values, e4m3 codes (weight_format kFp8), or packed 4-bit words (kInt4, kFp4: int32 [.., K / 8], eight inputs
  // a word)
  const void* w_gate_up = nullptr;  // [num_experts, 2 * inter, hidden]: gate rows, then up rows
  const void* w_down = nullptr;     // [num_experts, hidden, inter]
  // kFp8: the block scales, [num_experts, 2 * inter / 128, hidden / 128] and [num_experts, hidden / 128,
  // inter / 128] fp32 (hidden and inter multiples of 128). kInt4, kFp4: the group scales, [num_experts, 2 * inter,
  // hidden / group_size] and [num_experts, hidden, inter / group_size] fp32.
  const float* w_gate_up_scale = nullptr;
  const float* w_down_scale = nullptr;
  // kInt4 only: the packed zero points (group g of a row in nibble g % 8 of word g / 8), [num_experts, 2 * inter,
  // ceil(hidden / group_size / 8)] and [num_experts, hidden, ceil(inter / group_size / 8)] int32; null: symmetric
  // (z = 8), each weight on its own.
  const int32_t* w_gate_up_zeros = nullptr;
  const int32_t* w_down_zeros = nullptr;
  // kInt4 and kFp4: G, the inputs a scale covers, of each weight (kFp4: a multiple of 16). The kernels take INT4's G a
  // multiple of 32 that
  // divides hidden and inter (a 32-wide K chunk, one packed word a lane, lies inside one group): the common 32, 64, 128
  // and G = K (one group a row).
  int32_t group_size = 0;       // w_gate_up's G (its K is hidden)
  int32_t down_group_size = 0;  // w_down's G (its K is inter): a group per row differs between the two
  MoeWeightFormat weight_format = MoeWeightFormat::kBf16;
  // kFp8 only. 1: W8A8 on the grouped (prefill) path where the sizes allow it (moe_grouped_w8a8_supported): x and the
  // SwiGLU output are quantized per row per 128 channels (scale amax / 448, as the dense W8A8 GEMMs) and multiplied
  // with the codes on FP8 tensor cores; DeepSeek's own inference recipe. The small-M (decode) kernels stay W8A16:
  // they stream the weights, and quantizing their few activation rows would save nothing. 0: W8A16 throughout.
  int32_t fp8_activations = 0;
  const uint16_t* add = nullptr;        // [num_tokens, hidden] bf16 or null: added to the output
  uint16_t* out = nullptr;              // [num_tokens, hidden] bf16, overwritten
  // moe_workspace_bytes(*this) bytes, 256-byte aligned; moe_workspace_init once before its first use.
  void* workspace = nullptr;
  int32_t num_tokens = 0;
  int32_t hidden = 0;  // D
  int32_t inter = 0;   // I (moe_intermediate_size)
  int32_t num_experts = 0;         // every expert of the weights: routed, then shared
  int32_t top_k = 0;               // pairs a token: routed, then shared
  int32_t num_shared_experts = 0;  // S; read by routing only (with given ids, the shared pairs are in the ids)
  int32_t n_group = 1;
  int32_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  MoeScoring scoring = MoeScoring::kSigmoid;
  MoeTopkMethod method = MoeTopkMethod::kNoauxTc;
  MoeNormalize normalize = MoeNormalize::kNo;
  MoeExpertsPath path = MoeExpertsPath::kAuto;
  MoeDownPrefetch down_prefetch = MoeDownPrefetch::kAuto;
  MoeShard shard;
  int32_t num_sms = 132;  // multiprocessors of the device (cudaDevAttrMultiProcessorCount)
};

}  // namespace deepinfer::cuda
