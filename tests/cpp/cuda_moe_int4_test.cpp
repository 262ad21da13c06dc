// The fused MoE CUDA kernels with INT4 expert weights (W4A16: core/weight.h's packed words, float32 group scales and
// optional packed zero points) against the CPU backend, which dequantizes the same host INT4 weights itself.
//
// The weights are random codes, random positive scales and random zero points (or none: symmetric), built on the host
// inside each case from its seed, so both backends get the same bytes. moe_experts runs three ways on the GPU: on the
// small-M (decode) kernels and on the grouped (prefill) kernels, each forced through the kernels' entry point
// (cuda::moe_experts with MoeParams::path), and through the backend (kAuto, the op's own parameter checks); moe
// (routing, then the experts) through the backend. The small-M kernels apply each row's group scale to exact fp32
// partial sums; the grouped ones round (q - z) * s to bf16 once, as the FP8 W8A16 ones round e4m3 * s: the bf16 cases'
// tolerance, as the FP8 W8A16 cases (cuda_backend_test.cpp). Group sizes the kernels do not take are declined
// (UnsupportedOp). Every test here needs a GPU, hence "Cuda" in its name (cuda_device_required.h).
//
// FP4 experts (e2m1 codes in the same packing, groups of 16 and 32, no zero points) run the same cases: every kernel
// rounds e2m1 * s to bf16 (registers or shared memory), the W8A16 cases' tolerance again.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "core/weight.h"
#include "cuda_device_required.h"
#include "device_memory.h"
#include "moe_cases.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {
namespace {

using cuda::MoeExpertsPath;

constexpr double kTolerance = 1e-2;  // the bf16 (and FP8 W8A16) MoE cases'

// x as each backend takes it: float32 on the CPU, bfloat16 on the GPU, the same (bf16-rounded) values.
HostTensor activations(const OpRunner& run, Shape shape, const std::vector<float>& values) {
  return run.device() == Device::kCpu ? HostTensor::f32(shape, values) : HostTensor::bf16(shape, values);
}
DType activation_dtype(const OpRunner& run) { return run.device() == Device::kCpu ? DType::kF32 : DType::kBF16; }

std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

// Stacked INT4 (or FP4) expert weights of logical shape [experts, rows, cols] as core/weight.h stores them.
struct Int4Experts {
  Shape shape;                 // [experts, rows, cols]
  int64_t group = 0;           // G
  bool fp4 = false;            // e2m1 codes (no zero points)
  std::vector<int32_t> words;  // [experts, rows, cols / 8]
  std::vector<float> scales;   // [experts, rows, cols / G]
  std::vector<int32_t> zeros;  // [experts, rows, int4_zero_words(cols / G)]; empty: symmetric

  // Codes uniform in [0, 15], zero points uniform in [0, 15] (symmetric: none, z = 8), scales uniform in
  // [0.5, 1.5] * scale (positive).
  // fp4: codes are e2m1 (uniform over all 16), no zero points.
  static Int4Experts random(Rng& rng, const Shape& shape, int64_t group, bool symmetric, float scale,
                            bool fp4 = false) {
    Int4Experts w{.shape = shape, .group = group, .fp4 = fp4, .words = {}, .scales = {}, .zeros = {}};
    symmetric = symmetric || fp4;
    const int64_t experts = shape[0], rows = shape[1], cols = shape[2];
    const int64_t matrix_rows = experts * rows, groups = cols / group, zero_words = int4_zero_words(groups);
    w.words.assign(static_cast<size_t>(matrix_rows * cols / 8), 0);
    for (int64_t r = 0; r < matrix_rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto q = static_cast<uint32_t>(rng.integer(0, 15));
        auto& word = w.words[static_cast<size_t>(r * (cols / 8) + c / 8)];
        word = static_cast<int32_t>(static_cast<uint32_t>(word) | (q << (4 * kInt4NibbleOfInput[c % 8])));
      }
    }
    const std::vector<float> s = rng.uniform(matrix_rows * groups, 0.5f * scale, 1.5f * scale);
    w.scales.assign(s.begin(), s.end());
    if (!symmetric) {
      w.zeros.assign(static_cast<size_t>(matrix_rows * zero_words), 0);
      for (int64_t r = 0; r < matrix_rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          const auto z = static_cast<uint32_t>(rng.integer(0, 15));
          auto& word = w.zeros[static_cast<size_t>(r * zero_words + g / 8)];
          word = static_cast<int32_t>(static_cast<uint32_t>(word) | (z << (4 * (g % 8))));
        }
      }
    }
    return w;
  }

  // The words, scales and zero points in the runner's memory, as one INT4 WeightView (dtype kU4, logical shape).
  WeightView upload(OpRunner& run) const {
    const int64_t experts = shape[0], rows = shape[1], cols = shape[2], groups = cols / group;
    const TensorView packed = run.upload(HostTensor::i32({experts, rows, cols / 8}, words));
    const ConstTensorView codes(packed.data, fp4 ? DType::kE2M1 : DType::kU4, shape, packed.device);
    const ConstTensorView s = run.upload(HostTensor::f32({experts, rows, groups}, scales));
    const ConstTensorView z = zeros.empty() ? ConstTensorView()
                                            : ConstTensorView(run.upload(HostTensor::i32(
                                                  {experts, rows, int4_zero_words(groups)}, zeros)));
    return WeightView(codes, s, z);
  }
};

// The group sizes of a case's two weights (one for both, unless a case tests that the kernels decline two), and
// whether they have zero points.
struct Int4Format {
  int64_t gate_up_group = 128, down_group = 128;
  bool symmetric = false;
  bool fp4 = false;  // e2m1 codes, no zero points

  std::string str() const {
    const std::string g = gate_up_group == down_group ? str_cat("g", gate_up_group)
                                                      : str_cat("g", gate_up_group, "_", down_group);
    if (fp4) return str_cat("fp4_", g);
    return str_cat(g, symmetric ? "_sym" : "_asym");
  }
};

// The inputs of an experts case from its seed: bf16-rounded x, INT4 experts scaled like the bf16 cases' weights
// (uniform in +-sqrt(3 / K): the codes' q - z spread about 8 either way), random routing.
struct Int4ExpertsInputs {
  std::vector<float> x;
  Int4Experts w_gate_up, w_down;
  ExpertPairs routing;

  static Int4ExpertsInputs make(const ExpertsShape& s, const Int4Format& f, uint64_t seed) {
    Rng rng(seed);
    // e2m1 values spread up to 6 either way, INT4's q - z about 8.
    const double spread = f.fp4 ? 6.0 : 8.0;
    const float gate_up_scale = static_cast<float>(std::sqrt(3.0 / double(s.dim)) / spread);
    const float down_scale = static_cast<float>(std::sqrt(3.0 / double(s.inter)) / spread);
    std::vector<float> x = round_bf16(rng.uniform(s.tokens * s.dim, -1.0f, 1.0f));
    Int4Experts gate_up = Int4Experts::random(rng, {s.experts(), 2 * s.inter, s.dim}, f.gate_up_group, f.symmetric,
                                              gate_up_scale, f.fp4);
    Int4Experts down =
        Int4Experts::random(rng, {s.experts(), s.dim, s.inter}, f.down_group, f.symmetric, down_scale, f.fp4);
    ExpertPairs routing = random_expert_pairs(rng, s);
    return {std::move(x), std::move(gate_up), std::move(down), std::move(routing)};
  }
};

// The experts of `a` on the CUDA kernels' entry point with `path` forced, the parameters filled as the op fills them
// (moe_op.cpp), a guarded workspace of the runner's memory.
void run_cuda_experts_on_path(OpRunner& run, const MoeExpertsArgs& a, MoeExpertsPath path) {
  a.validate();
  int device = 0, sms = 0;
  CUDA_TRY(cudaGetDevice(&device));
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  const WeightView& gu = a.w_gate_up;
  const WeightView& dn = a.w_down;
  cuda::MoeParams p{.topk_ids = const_cast<int32_t*>(a.topk_ids.as<int32_t>()),
                    .topk_weights = const_cast<float*>(a.topk_weights.as<float>()),
                    .x = a.x.as<uint16_t>(),
                    .w_gate_up = gu.data,
                    .w_down = dn.data,
                    .w_gate_up_scale = gu.scale_inv.as<float>(),
                    .w_down_scale = dn.scale_inv.as<float>(),
                    .w_gate_up_zeros = gu.symmetric() ? nullptr : gu.zeros.as<int32_t>(),
                    .w_down_zeros = dn.symmetric() ? nullptr : dn.zeros.as<int32_t>(),
                    .group_size = i32(gu.group_size()),
                    .down_group_size = i32(dn.group_size()),
                    .weight_format = gu.is_fp4() ? cuda::MoeWeightFormat::kFp4 : cuda::MoeWeightFormat::kInt4,
                    .out = a.out.as<uint16_t>(),
                    .num_tokens = i32(a.x.shape[0]),
                    .hidden = i32(a.x.shape[1]),
                    .inter = i32(dn.shape[2]),
                    .num_experts = i32(gu.shape[0]),
                    .top_k = i32(a.topk_ids.shape[1]),
                    .path = path,
                    .num_sms = sms};
  const auto bytes = static_cast<int64_t>(cuda::moe_workspace_bytes(p));
  p.workspace = run.output({(bytes + 3) / 4}, DType::kI32).data;
  const cuda::CudaStream stream;
  cuda::moe_workspace_init(p, stream.get());
  cuda::moe_forward(p, cuda::LaunchStream{.handle = stream.get()});  // the given ids aligned, then the experts
  stream.synchronize();
}

std::string path_name(MoeExpertsPath path) {
  switch (path) {
    case MoeExpertsPath::kSmallM: return "small_m";
    case MoeExpertsPath::kGrouped: return "grouped";
    case MoeExpertsPath::kAuto: return "auto";
  }
  return "unknown";
}

// moe_experts with INT4 weights: on the GPU through `path` (kAuto: the backend op), on the CPU its op.
void add_int4_experts(CaseRegistry& r, const ExpertsShape& s, const Int4Format& f, MoeExpertsPath path,
                      uint64_t seed) {
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_int4_", f.str(), "_", path_name(path), "_", s.str()),
         .run = [=](OpRunner& run) -> Outputs {
           const Int4ExpertsInputs in = Int4ExpertsInputs::make(s, f, seed);
           const TensorView out = run.output({s.tokens, s.dim}, activation_dtype(run));
           const MoeExpertsArgs args{.x = run.upload(activations(run, {s.tokens, s.dim}, in.x)),
                                     .w_gate_up = in.w_gate_up.upload(run),
                                     .w_down = in.w_down.upload(run),
                                     .topk_ids = run.upload(HostTensor::i32({s.tokens, s.pairs()}, in.routing.ids)),
                                     .topk_weights =
                                         run.upload(HostTensor::f32({s.tokens, s.pairs()}, in.routing.weights)),
                                     .out = out,
                                     .num_shared_experts = s.shared};
           if (run.device() == Device::kCuda && path != MoeExpertsPath::kAuto) {
             run_cuda_experts_on_path(run, args, path);
           } else {
             run.backend().moe_experts(args);
           }
           return {{"out", run.fetch(out)}};
         },
         .tolerance = kTolerance});
}

// A moe case: its routing, sizes and weights, and where the logits come from.
enum class Logits : uint8_t { kGiven, kRouter };  // random logits, or the op computes them from a router weight
struct Int4MoeCase {
  std::string tag;
  RouteConfig route;
  int64_t tokens = 0, dim = 0, inter = 0;
  Int4Format format;
  bool bias = false;  // V3's correction bias
  Logits logits = Logits::kGiven;
};

// moe (routing from random logits, or from the router weight, then the experts) with INT4 experts, through the
// backends' op: routing outputs compared as the route cases do (moe_outputs), and the layer output.
void add_int4_moe(CaseRegistry& r, const Int4MoeCase& m, uint64_t seed) {
  const RouteConfig& c = m.route;
  const int64_t tokens = m.tokens, dim = m.dim;
  const bool bias = m.bias, router = m.logits == Logits::kRouter;
  const Int4Format f = m.format;
  const ExpertsShape s{.tokens = tokens, .dim = dim, .inter = m.inter, .routed = c.experts, .top_k = c.top_k,
                       .shared = c.num_shared};
  r.add({.op = OpKind::kMoe,
         .name = str_cat("moe_int4_", m.tag, "_", f.str(), "_", s.str(), router ? "_router" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const Int4ExpertsInputs in = Int4ExpertsInputs::make(s, f, seed);
           Rng rng(seed + 1);
           const float router_range = static_cast<float>(std::sqrt(3.0 / double(dim)));
           const std::vector<float> logits = rng.uniform(tokens * c.experts, -4.0f, 4.0f);
           const std::vector<float> router_w = round_bf16(rng.uniform(c.experts * dim, -router_range, router_range));
           const std::vector<float> bias_values = rng.uniform(c.experts, -0.5f, 0.5f);
           const TensorView ids = run.output({tokens, s.pairs()}, DType::kI32);
           const TensorView weights = run.output({tokens, s.pairs()}, DType::kF32);
           const TensorView out = run.output({tokens, dim}, activation_dtype(run));
           const TensorView logits_out = router ? run.output({tokens, c.experts}, DType::kF32) : TensorView{};
           run.backend().moe(
               {.route = {.logits = router ? ConstTensorView(logits_out)
                                           : ConstTensorView(run.upload(HostTensor::f32({tokens, c.experts}, logits))),
                          .correction_bias = bias ? ConstTensorView(run.upload(
                                                        HostTensor::f32({c.experts}, bias_values)))
                                                  : ConstTensorView{},
                          .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring, .method = c.method,
                          .n_group = c.n_group, .topk_group = c.topk_group, .norm_topk_prob = c.norm_topk_prob,
                          .routed_scaling_factor = c.routed_scaling_factor, .num_shared_experts = c.num_shared},
                .x = run.upload(activations(run, {tokens, dim}, in.x)),
                .w_gate_up = in.w_gate_up.upload(run),
                .w_down = in.w_down.upload(run),
                .out = out,
                .router = router ? ConstTensorView(run.upload(activations(run, {c.experts, dim}, router_w)))
                                 : ConstTensorView{},
                .router_logits = logits_out});
           return moe_outputs(run, ids, weights, out, logits_out, c.top_k, c.num_shared);
         },
         .tolerance = kTolerance});
}

// The cases. V3-like small experts (hidden 512, inter 256, 16 routed + 1 shared, top-4) at every group size the
// kernels are meant for (32, 64, 128), symmetric and not, at 1, 3, 8, 64 and 300 tokens on every path; G = K (a
// group a row: 512 for gate/up, 256 for down); V2-Lite's widths (2048 x 1408 = 11 x 128, top-6 + 2 shared) at decode and
// prefill sizes; hidden 4096 at 1 and 3 tokens (the persistent small-M FFN); small odd sizes (96, 160: multiples of
// 32 only) on the small-M kernels, which take them; moe with V3-like routing (groups, bias) and V2-like (softmax,
// greedy) with the router at 1 token.
CaseRegistry build_registry() {
  CaseRegistry r;
  constexpr MoeExpertsPath kPaths[] = {MoeExpertsPath::kSmallM, MoeExpertsPath::kGrouped, MoeExpertsPath::kAuto};
  constexpr int64_t kTokens[] = {1, 3, 8, 64, 300};
  uint64_t seed = 5000;
  const ExpertsShape v3_small{.tokens = 1, .dim = 512, .inter = 256, .routed = 16, .top_k = 4, .shared = 1};
  for (const int64_t group : {int64_t{32}, int64_t{64}, int64_t{128}}) {
    for (const bool symmetric : {false, true}) {
      for (const MoeExpertsPath path : kPaths) {
        for (const int64_t tokens : kTokens) {
          ExpertsShape s = v3_small;
          s.tokens = tokens;
          add_int4_experts(r, s, {.gate_up_group = group, .down_group = group, .symmetric = symmetric}, path, ++seed);
        }
      }
    }
  }
  // A group a row (compressed-tensors' "channel" strategy): each weight's G is its own K.
  const ExpertsShape one_group{.tokens = 1, .dim = 512, .inter = 256, .routed = 8, .top_k = 2, .shared = 1};
  for (const bool symmetric : {false, true}) {
    for (const MoeExpertsPath path : kPaths) {
      for (const int64_t tokens : kTokens) {
        ExpertsShape s = one_group;
        s.tokens = tokens;
        add_int4_experts(r, s, {.gate_up_group = 512, .down_group = 256, .symmetric = symmetric}, path, ++seed);
      }
    }
  }
  const ExpertsShape v2_lite{.tokens = 1, .dim = 2048, .inter = 1408, .routed = 12, .top_k = 6, .shared = 2};
  for (const MoeExpertsPath path : kPaths) {
    for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{80}}) {
      ExpertsShape s = v2_lite;
      s.tokens = tokens;
      add_int4_experts(r, s, {.gate_up_group = 128, .down_group = 128, .symmetric = false}, path, ++seed);
      add_int4_experts(r, s, {.gate_up_group = 64, .down_group = 64, .symmetric = true}, path, ++seed);
    }
  }
  const ExpertsShape wide{.tokens = 1, .dim = 4096, .inter = 256, .routed = 16, .top_k = 4, .shared = 1};
  for (const MoeExpertsPath path : {MoeExpertsPath::kSmallM, MoeExpertsPath::kAuto}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{3}}) {
      ExpertsShape s = wide;
      s.tokens = tokens;
      add_int4_experts(r, s, {.gate_up_group = 64, .down_group = 64, .symmetric = false}, path, ++seed);
    }
  }
  for (const MoeExpertsPath path : {MoeExpertsPath::kSmallM, MoeExpertsPath::kAuto}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      add_int4_experts(r, {.tokens = tokens, .dim = 96, .inter = 96, .routed = 8, .top_k = 3, .shared = 1},
                       {.gate_up_group = 96, .down_group = 96, .symmetric = false}, path, ++seed);
      add_int4_experts(r, {.tokens = tokens, .dim = 160, .inter = 96, .routed = 8, .top_k = 3, .shared = 0},
                       {.gate_up_group = 32, .down_group = 32, .symmetric = false}, path, ++seed);
    }
  }
  // FP4: NVFP4's groups of 16 and MXFP4's of 32 on every path, V2-Lite's widths, the persistent small-M FFN (hidden
  // 4096 at 1 and 3 tokens).
  for (const int64_t group : {int64_t{16}, int64_t{32}}) {
    const Int4Format fp4{.gate_up_group = group, .down_group = group, .fp4 = true};
    for (const MoeExpertsPath path : kPaths) {
      for (const int64_t tokens : kTokens) {
        ExpertsShape s = v3_small;
        s.tokens = tokens;
        add_int4_experts(r, s, fp4, path, ++seed);
      }
      for (const int64_t tokens : {int64_t{1}, int64_t{80}}) {
        ExpertsShape s = v2_lite;
        s.tokens = tokens;
        add_int4_experts(r, s, fp4, path, ++seed);
      }
    }
    for (const int64_t tokens : {int64_t{1}, int64_t{3}}) {
      ExpertsShape s = wide;
      s.tokens = tokens;
      add_int4_experts(r, s, fp4, MoeExpertsPath::kAuto, ++seed);
    }
  }
  const RouteConfig v3_route{.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc, .experts = 32,
                             .n_group = 4, .topk_group = 2, .top_k = 8, .norm_topk_prob = true,
                             .routed_scaling_factor = 2.5f, .num_shared = 1};
  for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{300}}) {
    add_int4_moe(r,
                 {.tag = "v3_like", .route = v3_route, .tokens = tokens, .dim = 1024, .inter = 256,
                  .format = {.gate_up_group = 128, .down_group = 128}, .bias = true},
                 ++seed);
  }
  const RouteConfig v2_route{.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .experts = 12,
                             .top_k = 6, .num_shared = 2};
  for (const int64_t tokens : {int64_t{1}, int64_t{80}}) {
    add_int4_moe(r,
                 {.tag = "v2_like", .route = v2_route, .tokens = tokens, .dim = 2048, .inter = 1408,
                  .format = {.gate_up_group = 64, .down_group = 64, .symmetric = true},
                  .logits = tokens == 1 ? Logits::kRouter : Logits::kGiven},
                 ++seed);
  }
  for (const int64_t tokens : {int64_t{1}, int64_t{300}}) {
    add_int4_moe(r,
                 {.tag = "v3_like", .route = v3_route, .tokens = tokens, .dim = 1024, .inter = 256,
                  .format = {.gate_up_group = 16, .down_group = 16, .fp4 = true}, .bias = true},
                 ++seed);
  }
  return r;
}

const CaseRegistry& registry() {
  static const CaseRegistry r = build_registry();
  return r;
}

class CudaMoeInt4 : public ::testing::TestWithParam<size_t> {
 public:
  static void SetUpTestSuite() {
    if (!cuda_device_available()) return;
    cuda_ = make_cuda_backend();
    cpu_ = make_cpu_backend();
  }
  static void TearDownTestSuite() {
    cuda_.reset();
    cpu_.reset();
  }

 protected:
  static inline std::unique_ptr<Backend> cuda_;
  static inline std::unique_ptr<Backend> cpu_;
};

TEST_P(CudaMoeInt4, Case) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  DeviceMemory device_memory;
  HostMemory host_memory;
  expect_matches_reference(registry().cases()[GetParam()], *cuda_, device_memory, *cpu_, host_memory);
}

// No prefix: the tests are CudaMoeInt4.Case/<case name>, so --gtest_filter='CudaMoeInt4.*' selects them.
INSTANTIATE_TEST_SUITE_P(, CudaMoeInt4, ::testing::Range<size_t>(0, registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return registry().cases()[info.param].name;
                         });

// Group sizes the kernels do not take, which the op's own checks accept (a multiple of 8 dividing K): 16, and 48 for
// the down weight. The CUDA backend declines them (UnsupportedOp), so a caller can fall back; the CPU takes them.
TEST(CudaMoeInt4Sizes, DeclinesGroupSizesTheKernelsDoNotTake) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  DeviceMemory device_memory;
  const ExpertsShape s{.tokens = 4, .dim = 256, .inter = 128, .routed = 8, .top_k = 2, .shared = 0};
  for (const Int4Format f : {Int4Format{.gate_up_group = 16, .down_group = 16},
                             Int4Format{.gate_up_group = 64, .down_group = 16, .symmetric = true}}) {
    SCOPED_TRACE(f.str());
    OpRunner run(*cuda, device_memory);
    const Int4ExpertsInputs in = Int4ExpertsInputs::make(s, f, 77);
    const MoeExpertsArgs args{.x = run.upload(activations(run, {s.tokens, s.dim}, in.x)),
                              .w_gate_up = in.w_gate_up.upload(run),
                              .w_down = in.w_down.upload(run),
                              .topk_ids = run.upload(HostTensor::i32({s.tokens, s.pairs()}, in.routing.ids)),
                              .topk_weights = run.upload(HostTensor::f32({s.tokens, s.pairs()}, in.routing.weights)),
                              .out = run.output({s.tokens, s.dim}, DType::kBF16)};
    EXPECT_THROW(cuda->moe_experts(args), UnsupportedOp);
  }
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
