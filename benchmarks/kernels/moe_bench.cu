// Fused MoE (routing + alignment + grouped SwiGLU experts + combine): correctness against a double-precision CPU
// reference written here (self-contained), then a microbenchmark beside the ceilings measured in the same run
// (device-to-device copy bandwidth; bf16 GEMM peak through cuBLAS when the library can be loaded).
//
// usage: moe_bench [--json PATH] [--quick | --prefill | --decode | --small] [--no-checks] [--probe] [--seed N] [--fp8]
//   --fp8: also times FP8 (e4m3, 128 x 128 block-scaled) expert weights of V2-Lite and V3 beside bf16 (tag "fp8";
//          "fp8-w8a8": prefill sizes with the activations quantized too, on FP8 tensor cores;
//   decode sizes in GB/s over the active experts' FP8 bytes, codes and scales; prefill sizes in TFLOP/s). Timing
//   only: the FP8 kernels' correctness is the op tests' (CudaBackend/CudaVsCpu.Case/*fp8*).
//   --quick: timings at 1 and 4096 tokens only; --prefill: the grouped path only (4096 tokens twice, V3 at 4096,
//   V2-Lite at 1024, the dense one-expert GEMM), to compare builds of the prefill kernels; --decode: 1 to 8 tokens,
//   the one-launch small-M FFN beside the two-kernel path, V2-Lite and V3; --small: the small-M path at 1, 8, 16, 32,
//   64 and 128 tokens, V2-Lite and V3, bf16, FP8 and INT4 (g128, symmetric) experts (tags "small", "fp8-small",
//   "int4-small"); --no-checks: no
//   correctness cases (under a profiler, so that the first kernels launched are the timed ones).
//   Environment (recorded in the JSON when set): BENCH_COMMIT, BENCH_DATE, BENCH_COMMAND.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/moe/moe_internal.h"
#include "bench_util.cuh"

namespace deepinfer::bench {
namespace {

using cuda::CudaStream;
using cuda::DeviceBuffer;
using cuda::MoeDownPrefetch;
using cuda::MoeExpertsPath;
using cuda::MoeNormalize;
using cuda::MoeParams;
using cuda::MoeScoring;
using cuda::MoeTopkMethod;

constexpr double kQuotedBf16PeakTflops = 790.0;  // used only when cuBLAS cannot be loaded on the machine

// ---------------------------------------------------------------------------------------------------------------
// Deterministic random bf16 values, bit-identical on host and device: value(seed, i) = u * 2^(-23 - scale_log2) with
// u a 24-bit integer from a hash of (seed, i), rounded to bf16 by integer arithmetic.

__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__host__ __device__ inline uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
__host__ __device__ inline float bits_float(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}
__host__ __device__ inline uint16_t rand_bf16(uint64_t seed, uint64_t i, int scale_log2) {
  const uint64_t z = mix64(seed * 0xD1B54A32D192ED03ull + i);
  const int32_t u = static_cast<int32_t>(z >> 40) - (1 << 23);
  const float f = static_cast<float>(u) * bits_float(static_cast<uint32_t>(127 - 23 - scale_log2) << 23);
  const uint32_t b = float_bits(f);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
inline float bf16_value(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

__global__ void fill_kernel(uint16_t* data, int64_t n, uint64_t seed, int scale_log2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = rand_bf16(seed, static_cast<uint64_t>(i), scale_log2);
  }
}
void fill(uint16_t* data, int64_t n, uint64_t seed, int scale_log2, cudaStream_t stream) {
  fill_kernel<<<2048, 256, 0, stream>>>(data, n, seed, scale_log2);
  CUDA_TRY(cudaGetLastError());
}


// ---------------------------------------------------------------------------------------------------------------
// Model shapes

struct Model {
  const char* name;
  int hidden, inter, experts, top_k, n_group, topk_group;
  MoeScoring scoring;
  MoeTopkMethod method;
  MoeNormalize normalize;
  float scale;
  bool bias;
};

const Model kV2Lite{"v2-lite", 2048, 1408, 64, 6, 1, 1, MoeScoring::kSoftmax, MoeTopkMethod::kGreedy,
                    MoeNormalize::kNo, 1.0f, false};
const Model kV3{"v3", 7168, 2048, 256, 8, 8, 4, MoeScoring::kSigmoid, MoeTopkMethod::kNoauxTc, MoeNormalize::kYes,
                2.5f, true};
const Model kV2Full{"v2", 5120, 1536, 160, 6, 8, 3, MoeScoring::kSoftmax, MoeTopkMethod::kGroupLimitedGreedy,
                    MoeNormalize::kNo, 16.0f, false};
const Model kV2LiteNorm{"v2-lite-norm", 2048, 1408, 64, 6, 1, 1, MoeScoring::kSoftmax, MoeTopkMethod::kGreedy,
                        MoeNormalize::kYes, 1.0f, false};
const Model kDense{"dense-1-expert", 7168, 2048, 1, 1, 1, 1, MoeScoring::kSoftmax, MoeTopkMethod::kGreedy,
                   MoeNormalize::kNo, 1.0f, false};

int scale_log2_for(int k_dim) { return static_cast<int>(std::floor(0.5 * std::log2(static_cast<double>(k_dim)))); }

// A model's weights on the device (filled once from the hash).
struct DeviceModel {
  const Model* m = nullptr;
  uint64_t seed_gate_up = 0, seed_down = 0;
  DeviceBuffer w_gate_up, w_down, bias;
  std::vector<float> bias_host;
  bool fp8 = false;  // w_gate_up / w_down hold e4m3 codes, with their block scales
  bool int4 = false;  // w_gate_up / w_down hold packed INT4 words (symmetric), with a scale per kInt4Group inputs
  DeviceBuffer gate_up_scale, down_scale;
};

constexpr int kInt4Group = 128;  // the INT4 twin's group size (the checkpoints' common g128)

// Random finite e4m3 codes (|value| <= 2^3: exponent field below 11) and positive block scales near 2^-scale_log2.
__global__ void fill_fp8_kernel(uint8_t* codes, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(i));
    codes[i] = static_cast<uint8_t>((h & 0x80u) | ((h >> 8) % 0x58u));
  }
}
__global__ void fill_scale_kernel(float* scales, int64_t n, uint64_t seed, int scale_log2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
    scales[i] = ldexpf(1.0f + static_cast<float>(h & 0xffu) / 256.0f, -scale_log2 - 3);
  }
}

// V3's e_score_correction_bias of the model's experts: small uniform values from `rng`, on the host and the device.
void upload_bias(DeviceModel& d, std::mt19937_64& rng, cudaStream_t stream) {
  const int experts = d.m->experts;
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  d.bias_host.resize(experts);
  for (auto& b : d.bias_host) b = u(rng);
  d.bias = DeviceBuffer(experts * 4, stream);
  CUDA_TRY(cudaMemcpyAsync(d.bias.data(), d.bias_host.data(), experts * 4, cudaMemcpyHostToDevice, stream));
}

// The FP8 twin of a model (hidden and inter multiples of 128): codes and one scale per 128 x 128 block.
DeviceModel make_fp8_device_model(const Model& m, uint64_t seed, cudaStream_t stream) {
  DeviceModel d;
  d.m = &m;
  d.fp8 = true;
  d.seed_gate_up = seed * 3 + 1;
  d.seed_down = seed * 3 + 2;
  const int64_t gu = static_cast<int64_t>(m.experts) * 2 * m.inter * m.hidden;
  const int64_t dn = static_cast<int64_t>(m.experts) * m.hidden * m.inter;
  const int64_t gu_blocks = static_cast<int64_t>(m.experts) * (2 * m.inter / 128) * (m.hidden / 128);
  const int64_t dn_blocks = static_cast<int64_t>(m.experts) * (m.hidden / 128) * (m.inter / 128);
  d.w_gate_up = DeviceBuffer(gu, stream);
  d.w_down = DeviceBuffer(dn, stream);
  d.gate_up_scale = DeviceBuffer(gu_blocks * 4, stream);
  d.down_scale = DeviceBuffer(dn_blocks * 4, stream);
  fill_fp8_kernel<<<2048, 256, 0, stream>>>(d.w_gate_up.as<uint8_t>(), gu, d.seed_gate_up);
  fill_fp8_kernel<<<2048, 256, 0, stream>>>(d.w_down.as<uint8_t>(), dn, d.seed_down);
  fill_scale_kernel<<<64, 256, 0, stream>>>(d.gate_up_scale.as<float>(), gu_blocks, seed + 5, scale_log2_for(m.hidden));
  fill_scale_kernel<<<64, 256, 0, stream>>>(d.down_scale.as<float>(), dn_blocks, seed + 6, scale_log2_for(m.inter));
  CUDA_TRY(cudaGetLastError());
  std::mt19937_64 rng(seed);
  if (m.bias) upload_bias(d, rng, stream);
  return d;
}

// Random packed words: every 32-bit pattern is eight valid INT4 codes.
__global__ void fill_words_kernel(uint32_t* words, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    words[i] = static_cast<uint32_t>(mix64(seed * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(i)));
  }
}

// The INT4 twin of a model (symmetric, groups of kInt4Group inputs): a byte holds two weights, a float32 scale a
// group.
DeviceModel make_int4_device_model(const Model& m, uint64_t seed, cudaStream_t stream) {
  DeviceModel d;
  d.m = &m;
  d.int4 = true;
  d.seed_gate_up = seed * 3 + 1;
  d.seed_down = seed * 3 + 2;
  const int64_t gu = static_cast<int64_t>(m.experts) * 2 * m.inter * m.hidden;
  const int64_t dn = static_cast<int64_t>(m.experts) * m.hidden * m.inter;
  d.w_gate_up = DeviceBuffer(gu / 2, stream);
  d.w_down = DeviceBuffer(dn / 2, stream);
  d.gate_up_scale = DeviceBuffer(gu / kInt4Group * 4, stream);
  d.down_scale = DeviceBuffer(dn / kInt4Group * 4, stream);
  fill_words_kernel<<<2048, 256, 0, stream>>>(d.w_gate_up.as<uint32_t>(), gu / 8, d.seed_gate_up);
  fill_words_kernel<<<2048, 256, 0, stream>>>(d.w_down.as<uint32_t>(), dn / 8, d.seed_down);
  fill_scale_kernel<<<64, 256, 0, stream>>>(d.gate_up_scale.as<float>(), gu / kInt4Group, seed + 5,
                                            scale_log2_for(m.hidden));
  fill_scale_kernel<<<64, 256, 0, stream>>>(d.down_scale.as<float>(), dn / kInt4Group, seed + 6,
                                            scale_log2_for(m.inter));
  CUDA_TRY(cudaGetLastError());
  std::mt19937_64 rng(seed);
  if (m.bias) upload_bias(d, rng, stream);
  return d;
}

DeviceModel make_device_model(const Model& m, uint64_t seed, std::mt19937_64& rng, cudaStream_t stream) {
  DeviceModel d;
  d.m = &m;
  d.seed_gate_up = seed * 3 + 1;
  d.seed_down = seed * 3 + 2;
  const int64_t gu = static_cast<int64_t>(m.experts) * 2 * m.inter * m.hidden;
  const int64_t dn = static_cast<int64_t>(m.experts) * m.hidden * m.inter;
  d.w_gate_up = DeviceBuffer(gu * 2, stream);
  d.w_down = DeviceBuffer(dn * 2, stream);
  fill(d.w_gate_up.as<uint16_t>(), gu, d.seed_gate_up, scale_log2_for(m.hidden), stream);
  fill(d.w_down.as<uint16_t>(), dn, d.seed_down, scale_log2_for(m.inter), stream);
  if (m.bias) upload_bias(d, rng, stream);
  return d;
}

// ---------------------------------------------------------------------------------------------------------------
// Double-precision reference

enum class Routing { kRandom, kSkewed, kGivenIds };

// Ties-free logits: each token's experts get a random permutation of values spaced 4/E apart, plus jitter below
// half the spacing. Skewed: experts in the upper part get -20 (few experts receive tokens, many none).
std::vector<float> make_logits(const Model& m, int tokens, Routing routing, std::mt19937_64& rng) {
  std::vector<float> logits(static_cast<size_t>(tokens) * m.experts);
  std::vector<int> perm(m.experts);
  std::uniform_real_distribution<double> jitter(0.0, 0.45);
  const double spacing = 4.0 / m.experts;
  const int skew_from = m.n_group > 1 ? m.experts / 2 : m.experts / 4;
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < m.experts; ++e) {
      double v = (perm[e] - m.experts / 2 + jitter(rng)) * spacing;
      if (routing == Routing::kSkewed && e >= skew_from) v -= 20.0;
      logits[static_cast<size_t>(t) * m.experts + e] = static_cast<float>(v);
    }
  }
  return logits;
}

struct RefRoute {
  std::vector<int> ids;        // [T, k] selection order
  std::vector<double> weights;  // [T, k]
  std::vector<char> near_tie;   // [T]: a selection margin under 1e-5 (ids not compared)
};

// Indices sorted by value descending, ties to the lower index.
std::vector<int> ranked(const std::vector<double>& v) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  return idx;
}

RefRoute route_ref(const Model& m, const std::vector<float>& logits, const std::vector<float>& bias, int tokens) {
  RefRoute r;
  const int E = m.experts, k = m.top_k;
  r.ids.resize(static_cast<size_t>(tokens) * k);
  r.weights.resize(static_cast<size_t>(tokens) * k);
  r.near_tie.assign(tokens, 0);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < tokens; ++t) {
    const float* l = &logits[static_cast<size_t>(t) * E];
    std::vector<double> score(E), choice(E);
    if (m.scoring == MoeScoring::kSigmoid) {
      for (int e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
    } else {
      double mx = -INFINITY, sum = 0.0;
      for (int e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
      for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
      for (int e = 0; e < E; ++e) score[e] = std::exp(l[e] - mx) / sum;
    }
    for (int e = 0; e < E; ++e) choice[e] = score[e] + (bias.empty() ? 0.0 : static_cast<double>(bias[e]));
    double margin = INFINITY;
    if (m.method != MoeTopkMethod::kGreedy && m.n_group > 1) {
      const int per_group = E / m.n_group;
      std::vector<double> group_score(m.n_group);
      for (int g = 0; g < m.n_group; ++g) {
        std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
        std::sort(members.rbegin(), members.rend());
        group_score[g] = m.method == MoeTopkMethod::kNoauxTc ? members[0] + members[1] : members[0];
      }
      const auto order = ranked(group_score);
      if (m.topk_group < m.n_group) {
        margin = std::min(margin, group_score[order[m.topk_group - 1]] - group_score[order[m.topk_group]]);
      }
      std::vector<char> keep(m.n_group, 0);
      for (int i = 0; i < m.topk_group; ++i) keep[order[i]] = 1;
      for (int e = 0; e < E; ++e) {
        if (!keep[e / per_group]) choice[e] = -INFINITY;
      }
    }
    const auto order = ranked(choice);
    if (k < E && std::isfinite(choice[order[k]])) margin = std::min(margin, choice[order[k - 1]] - choice[order[k]]);
    r.near_tie[t] = margin < 1e-5 ? 1 : 0;
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      r.ids[static_cast<size_t>(t) * k + j] = order[j];
      sum += score[order[j]];
    }
    const double norm = m.normalize == MoeNormalize::kYes ? 1.0 / (sum + 1e-20) : 1.0;
    for (int j = 0; j < k; ++j) {
      r.weights[static_cast<size_t>(t) * k + j] = score[order[j]] * norm * m.scale;
    }
  }
  return r;
}

// y[pair] (pairs of the checked tokens) and act[pair] in double, weights regenerated row by row from the hash.
struct RefExperts {
  std::vector<std::vector<double>> act, y;  // indexed like `pairs`
};

RefExperts experts_ref(const DeviceModel& dm, uint64_t seed_x, const std::vector<int>& pair_token,
                       const std::vector<int>& pair_expert) {
  const Model& m = *dm.m;
  const int D = m.hidden, I = m.inter, P = static_cast<int>(pair_token.size());
  const int s_gu = scale_log2_for(D), s_dn = scale_log2_for(I);
  RefExperts r;
  r.act.assign(P, std::vector<double>(I));
  r.y.assign(P, std::vector<double>(D));
  std::vector<std::vector<double>> x(P, std::vector<double>(D));
  for (int i = 0; i < P; ++i) {
    for (int d = 0; d < D; ++d) {
      x[i][d] = bf16_value(rand_bf16(seed_x, static_cast<uint64_t>(pair_token[i]) * D + d, 0));
    }
  }
  for (int e = 0; e < m.experts; ++e) {
    std::vector<int> mine;
    for (int i = 0; i < P; ++i) {
      if (pair_expert[i] == e) mine.push_back(i);
    }
    if (mine.empty()) continue;
    std::vector<std::vector<double>> h(mine.size(), std::vector<double>(2 * I));
#pragma omp parallel for schedule(static)
    for (int j = 0; j < 2 * I; ++j) {
      std::vector<double> w(D);
      const uint64_t base = (static_cast<uint64_t>(e) * 2 * I + j) * D;
      for (int d = 0; d < D; ++d) w[d] = bf16_value(rand_bf16(dm.seed_gate_up, base + d, s_gu));
      for (size_t q = 0; q < mine.size(); ++q) {
        double s = 0.0;
        for (int d = 0; d < D; ++d) s += x[mine[q]][d] * w[d];
        h[q][j] = s;
      }
    }
    for (size_t q = 0; q < mine.size(); ++q) {
      for (int i = 0; i < I; ++i) {
        const double g = h[q][i];
        r.act[mine[q]][i] = g / (1.0 + std::exp(-g)) * h[q][I + i];
      }
    }
#pragma omp parallel for schedule(static)
    for (int d = 0; d < D; ++d) {
      std::vector<double> w(I);
      const uint64_t base = (static_cast<uint64_t>(e) * D + d) * I;
      for (int i = 0; i < I; ++i) w[i] = bf16_value(rand_bf16(dm.seed_down, base + i, s_dn));
      for (size_t q = 0; q < mine.size(); ++q) {
        double s = 0.0;
        for (int i = 0; i < I; ++i) s += r.act[mine[q]][i] * w[i];
        r.y[mine[q]][d] = s;
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Correctness

struct CheckCase {
  const Model* model = nullptr;
  int tokens = 1;
  Routing routing = Routing::kRandom;
  MoeExpertsPath path = MoeExpertsPath::kAuto;
  bool add = false;
  int check_tokens = 64;  // tokens whose outputs are compared (all when fewer); 0: routing + alignment only
};

struct CheckResult {
  std::string name, path;
  int tokens = 0, active = 0, near_ties = 0;
  int id_mismatches = 0, align_errors = 0;
  double weight_error = 0.0, act_error = 0.0, out_error = 0.0, out_rel_l2 = 0.0;
  int64_t nan_count = 0;
  bool pass = false;
};

const char* path_name(MoeExpertsPath p) {
  switch (p) {
    case MoeExpertsPath::kAuto: return "auto";
    case MoeExpertsPath::kSmallM: return "small-m";
    case MoeExpertsPath::kGrouped: return "grouped";
  }
  return "?";
}
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kRandom: return "random";
    case Routing::kSkewed: return "skewed";
    case Routing::kGivenIds: return "given-ids";
  }
  return "?";
}

template <typename T>
std::vector<T> to_host(const void* src, size_t count, cudaStream_t stream) {
  std::vector<T> v(count);
  if (count > 0) CUDA_TRY(cudaMemcpyAsync(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  CUDA_TRY(cudaStreamSynchronize(stream));
  return v;
}

MoeParams model_params(const DeviceModel& dm, int tokens, int num_sms) {
  const Model& m = *dm.m;
  return MoeParams{.correction_bias = m.bias ? dm.bias.as<float>() : nullptr,
                   .w_gate_up = dm.w_gate_up.data(),
                   .w_down = dm.w_down.data(),
                   .w_gate_up_scale = dm.fp8 || dm.int4 ? dm.gate_up_scale.as<float>() : nullptr,
                   .w_down_scale = dm.fp8 || dm.int4 ? dm.down_scale.as<float>() : nullptr,
                   .group_size = dm.int4 ? kInt4Group : 0,
                   .down_group_size = dm.int4 ? kInt4Group : 0,
                   .weight_format = dm.fp8    ? cuda::MoeWeightFormat::kFp8
                                    : dm.int4 ? cuda::MoeWeightFormat::kInt4
                                              : cuda::MoeWeightFormat::kBf16,
                   .num_tokens = tokens,
                   .hidden = m.hidden,
                   .inter = m.inter,
                   .num_experts = m.experts,
                   .top_k = m.top_k,
                   .n_group = m.n_group,
                   .topk_group = m.topk_group,
                   .routed_scaling_factor = m.scale,
                   .scoring = m.scoring,
                   .method = m.method,
                   .normalize = m.normalize,
                   .num_sms = num_sms};
}

CheckResult run_check(const CheckCase& c, const DeviceModel& dm, std::mt19937_64& rng, cudaStream_t stream,
                      int num_sms) {
  const Model& m = *dm.m;
  const int T = c.tokens, E = m.experts, k = m.top_k, D = m.hidden, I = m.inter;
  const bool experts = c.check_tokens > 0;
  CheckResult r;
  r.name = std::string(m.name) + " T=" + std::to_string(T) + " " + routing_name(c.routing) + (c.add ? " +add" : "");
  std::printf("case %s (%s) ...\n", r.name.c_str(), path_name(c.path));
  std::fflush(stdout);
  r.tokens = T;
  const uint64_t seed_x = rng(), seed_add = rng();

  // Inputs.
  std::vector<float> logits;
  std::vector<int> given_ids;
  std::vector<float> given_weights;
  if (c.routing == Routing::kGivenIds) {  // all tokens on experts 0..k (k + 1 experts), rotating, random weights
    std::uniform_real_distribution<float> u(0.1f, 1.0f);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        given_ids.push_back((t + j) % (k + 1));
        given_weights.push_back(u(rng));
      }
    }
  } else {
    logits = make_logits(m, T, c.routing, rng);
  }
  MoeParams p = model_params(dm, T, num_sms);
  p.path = c.path;
  DeviceBuffer d_logits(std::max<size_t>(logits.size() * 4, 4), stream), d_ids(static_cast<size_t>(T) * k * 4, stream),
      d_weights(static_cast<size_t>(T) * k * 4, stream), d_x(static_cast<size_t>(T) * D * 2, stream),
      d_add(c.add ? static_cast<size_t>(T) * D * 2 : 0, stream), d_out(static_cast<size_t>(T) * D * 2, stream);
  if (c.routing == Routing::kGivenIds) {
    CUDA_TRY(cudaMemcpyAsync(d_ids.data(), given_ids.data(), d_ids.bytes(), cudaMemcpyHostToDevice, stream));
    CUDA_TRY(cudaMemcpyAsync(d_weights.data(), given_weights.data(), d_weights.bytes(), cudaMemcpyHostToDevice, stream));
  } else {
    CUDA_TRY(cudaMemcpyAsync(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice, stream));
    CUDA_TRY(cudaMemsetAsync(d_ids.data(), 0xff, d_ids.bytes(), stream));
    CUDA_TRY(cudaMemsetAsync(d_weights.data(), 0xff, d_weights.bytes(), stream));
    p.router_logits = d_logits.as<float>();
  }
  fill(d_x.as<uint16_t>(), static_cast<int64_t>(T) * D, seed_x, 0, stream);
  if (c.add) fill(d_add.as<uint16_t>(), static_cast<int64_t>(T) * D, seed_add, 0, stream);
  CUDA_TRY(cudaMemsetAsync(d_out.data(), 0xff, d_out.bytes(), stream));  // NaN: unwritten outputs show
  p.topk_ids = d_ids.as<int32_t>();
  p.topk_weights = d_weights.as<float>();
  p.x = d_x.as<uint16_t>();
  p.add = c.add ? d_add.as<uint16_t>() : nullptr;
  p.out = d_out.as<uint16_t>();
  DeviceBuffer workspace(cuda::moe_workspace_bytes(p), stream);
  CUDA_TRY(cudaMemsetAsync(workspace.data(), 0xff, workspace.bytes(), stream));  // poison, then the zeroed header
  p.workspace = workspace.data();
  cuda::moe_workspace_init(p, stream);
  r.path = experts ? path_name(cuda::moe_resolve_path(p)) : "route-only";

  if (experts) {
    cuda::moe_forward(p, {stream});
  } else {
    cuda::moe_route_align(p, {stream});
  }
  CUDA_TRY(cudaGetLastError());
  CUDA_TRY(cudaStreamSynchronize(stream));

  // Routing against the reference.
  const auto dev_ids = to_host<int32_t>(d_ids.data(), static_cast<size_t>(T) * k, stream);
  const auto dev_w = to_host<float>(d_weights.data(), static_cast<size_t>(T) * k, stream);
  RefRoute ref;
  if (c.routing == Routing::kGivenIds) {
    ref.ids = given_ids;
    ref.weights.assign(given_weights.begin(), given_weights.end());
    ref.near_tie.assign(T, 0);
  } else {
    ref = route_ref(m, logits, dm.bias_host, T);
  }
  for (int t = 0; t < T; ++t) {
    if (ref.near_tie[t]) {
      ++r.near_ties;
      continue;
    }
    std::vector<std::pair<int, double>> a, b;
    for (int j = 0; j < k; ++j) {
      a.emplace_back(dev_ids[t * k + j], dev_w[t * k + j]);
      b.emplace_back(ref.ids[t * k + j], ref.weights[t * k + j]);
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    for (int j = 0; j < k; ++j) {
      if (a[j].first != b[j].first) {
        ++r.id_mismatches;
        break;
      }
      r.weight_error = std::max(r.weight_error, std::fabs(a[j].second - b[j].second) / std::max(1.0, std::fabs(b[j].second)));
    }
  }

  // Alignment: exact expectation from the device's own ids.
  const auto l = cuda::moe_detail::moe_workspace_layout(p);
  const uint8_t* ws = static_cast<const uint8_t*>(workspace.data());
  const auto counts = to_host<int32_t>(ws + l.expert_counts, E, stream);
  const auto offsets = to_host<int32_t>(ws + l.expert_offsets, E + 1, stream);
  const auto active = to_host<int32_t>(ws + l.active_experts, E + 1, stream);
  const auto header = to_host<int32_t>(ws, l.zeroed_bytes / 4, stream);
  std::vector<std::vector<int>> expect(E);
  for (int i = 0; i < T * k; ++i) {
    if (dev_ids[i] >= 0 && dev_ids[i] < E) expect[dev_ids[i]].push_back(i);
  }
  int at = 0, num_active = 0;
  for (int e = 0; e < E; ++e) {
    const int n = static_cast<int>(expect[e].size());
    r.align_errors += counts[e] != n;
    r.align_errors += offsets[e] != at;
    if (n > 0) r.align_errors += active[num_active++] != e;
    at += (n + 127) / 128 * 128;
  }
  r.active = num_active;
  r.align_errors += offsets[E] != at;
  r.align_errors += active[E] != num_active;
  for (int32_t v : header) r.align_errors += v != 0;  // counters left zero for the next call
  if (r.align_errors == 0) {  // each expert's rows hold its pairs in pair order (padding rows are undefined)
    const auto row_pair = to_host<int32_t>(ws + l.row_pair, at, stream);
    for (int e = 0; e < E; ++e) {
      for (size_t q = 0; q < expect[e].size(); ++q) r.align_errors += row_pair[offsets[e] + q] != expect[e][q];
    }
  }

  // Expert outputs of the checked tokens.
  if (experts) {
    std::vector<int> tokens_checked;
    if (T <= c.check_tokens) {
      tokens_checked.resize(T);
      std::iota(tokens_checked.begin(), tokens_checked.end(), 0);
    } else {
      std::vector<int> all(T);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      tokens_checked.assign(all.begin(), all.begin() + c.check_tokens);
      std::sort(tokens_checked.begin(), tokens_checked.end());
    }
    std::vector<int> pair_token, pair_expert, pair_dev;  // reference pairs and the device pair of the same expert
    std::vector<int> checked;
    for (int t : tokens_checked) {
      if (ref.near_tie[t]) continue;
      bool ok = true;
      std::vector<int> dev_slot(k, -1);
      for (int j = 0; j < k; ++j) {
        for (int j2 = 0; j2 < k; ++j2) {
          if (dev_ids[t * k + j2] == ref.ids[t * k + j]) dev_slot[j] = j2;
        }
        ok = ok && dev_slot[j] >= 0;
      }
      if (!ok) continue;  // counted as an id mismatch above
      checked.push_back(t);
      for (int j = 0; j < k; ++j) {
        pair_token.push_back(t);
        pair_expert.push_back(ref.ids[t * k + j]);
        pair_dev.push_back(t * k + dev_slot[j]);
      }
    }
    const RefExperts re = experts_ref(dm, seed_x, pair_token, pair_expert);
    const auto out = to_host<uint16_t>(d_out.data(), static_cast<size_t>(T) * D, stream);
    for (uint16_t v : out) r.nan_count += !std::isfinite(bf16_value(v));
    double act_max = 0.0, act_diff = 0.0;
    for (size_t q = 0; q < pair_dev.size(); ++q) {
      const auto act = to_host<uint16_t>(ws + l.act + static_cast<size_t>(pair_dev[q]) * I * 2, I, stream);
      for (int i = 0; i < I; ++i) {
        act_max = std::max(act_max, std::fabs(re.act[q][i]));
        const double v = bf16_value(act[i]);
        act_diff = std::max(act_diff, std::isfinite(v) ? std::fabs(v - re.act[q][i]) : 1e30);
      }
    }
    r.act_error = act_diff / std::max(act_max, 1e-30);
    double out_max = 0.0, out_diff = 0.0, sq_diff = 0.0, sq_ref = 0.0;
    size_t q = 0;
    for (int t : checked) {
      std::vector<double> ref_out(D, 0.0);
      for (int j = 0; j < k; ++j, ++q) {
        for (int d = 0; d < D; ++d) ref_out[d] += ref.weights[t * k + j] * re.y[q][d];
      }
      for (int d = 0; d < D; ++d) {
        if (c.add) ref_out[d] += bf16_value(rand_bf16(seed_add, static_cast<uint64_t>(t) * D + d, 0));
        const double v = bf16_value(out[static_cast<size_t>(t) * D + d]);
        out_max = std::max(out_max, std::fabs(ref_out[d]));
        const double diff = std::isfinite(v) ? std::fabs(v - ref_out[d]) : 1e30;
        out_diff = std::max(out_diff, diff);
        sq_diff += diff * diff;
        sq_ref += ref_out[d] * ref_out[d];
      }
    }
    r.out_error = out_diff / std::max(out_max, 1e-30);
    r.out_rel_l2 = std::sqrt(sq_diff / std::max(sq_ref, 1e-300));
  }
  r.pass = r.id_mismatches == 0 && r.align_errors == 0 && r.weight_error <= 1e-5 && r.nan_count == 0 &&
           r.act_error <= 2e-2 && r.out_error <= 2e-2;
  std::printf("check %-34s %-10s active %3d  ids-mismatch %d (near-ties %d)  w-err %.1e  align-err %d  act-err %.2e  "
              "out-err %.2e (rel-l2 %.2e)  nan %lld  %s\n",
              r.name.c_str(), r.path.c_str(), r.active, r.id_mismatches, r.near_ties, r.weight_error, r.align_errors,
              r.act_error, r.out_error, r.out_rel_l2, static_cast<long long>(r.nan_count), r.pass ? "ok" : "FAIL");
  std::fflush(stdout);
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Timing


class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  // Captures fn on `stream`; false (and a message) when capture fails.
  template <typename Fn>
  bool capture(cudaStream_t stream, Fn fn) {
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) return false;
    try {
      fn();
    } catch (const std::exception& e) {
      std::printf("graph capture: %s\n", e.what());
    }
    const cudaError_t end = cudaStreamEndCapture(stream, &graph_);
    if (end != cudaSuccess || graph_ == nullptr) {
      std::printf("graph capture failed: %s\n", cudaGetErrorString(end));
      cudaGetLastError();
      return false;
    }
    if (cudaGraphInstantiate(&exec_, graph_, 0) != cudaSuccess) {
      std::printf("graph instantiate failed\n");
      cudaGetLastError();
      return false;
    }
    return true;
  }
  void launch(cudaStream_t stream) const { CUDA_TRY(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};


// cuBLAS, loaded at run time when present (the benchmark links no library beyond the CUDA runtime).
struct Cublas {
  using CreateFn = int (*)(void**);
  using DestroyFn = int (*)(void*);
  using SetStreamFn = int (*)(void*, cudaStream_t);
  using GemmExFn = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                           const void*, void*, int, int, int, int);
  void* lib = nullptr;
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;
  std::string name;
  bool load() {
    for (const char* n : {"libcublas.so.13", "libcublas.so", "libcublas.so.12"}) {
      lib = dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) {
        name = n;
        break;
      }
    }
    if (lib == nullptr) return false;
    create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    destroy = reinterpret_cast<DestroyFn>(dlsym(lib, "cublasDestroy_v2"));
    set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    gemm_ex = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    return create != nullptr && destroy != nullptr && set_stream != nullptr && gemm_ex != nullptr;
  }
};

// bf16 8192^3 GEMM through cuBLAS (random data): TFLOP/s, or 0 when unavailable.
double cublas_peak_tflops(cudaStream_t stream, uint64_t seed, std::string& how) {
  Cublas cb;
  if (!cb.load()) {
    how = "cuBLAS not loadable";
    return 0.0;
  }
  constexpr int n = 8192;
  DeviceBuffer a(static_cast<size_t>(n) * n * 2, stream), b(static_cast<size_t>(n) * n * 2, stream),
      c(static_cast<size_t>(n) * n * 2, stream);
  fill(a.as<uint16_t>(), static_cast<int64_t>(n) * n, seed + 11, 0, stream);
  fill(b.as<uint16_t>(), static_cast<int64_t>(n) * n, seed + 12, 0, stream);
  void* handle = nullptr;
  if (cb.create(&handle) != 0) {
    how = "cublasCreate failed";
    return 0.0;
  }
  cb.set_stream(handle, stream);
  constexpr int kOpN = 0, kOpT = 1, kBf16 = 14, kCompute32F = 68, kAlgoDefault = -1;
  const float alpha = 1.0f, beta = 0.0f;
  int status = 0;
  const double ms = time_ms(stream, 3, 10, [&] {
    status |= cb.gemm_ex(handle, kOpT, kOpN, n, n, n, &alpha, a.data(), kBf16, n, b.data(), kBf16, n, &beta,
                         c.data(), kBf16, n, kCompute32F, kAlgoDefault);
  }, [] {});
  cb.destroy(handle);
  if (status != 0) {
    how = "cublasGemmEx failed";
    return 0.0;
  }
  how = "cuBLAS (" + cb.name + ") bf16 GemmEx 8192x8192x8192, fp32 compute, median of 10";
  return 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3) / 1e12;
}

__global__ void empty_kernel() {}

struct PerfResult {
  std::string model, tag, path;
  int tokens = 0, active = 0;
  double us_graph = 0.0, us_eager = 0.0, us_route = 0.0, us_gate_up = 0.0, us_down = 0.0, us_combine = 0.0;
  double us_ffn = 0.0;  // the one-launch small-M FFN alone (up to 8 tokens, whichever path the layer takes)
  double bytes = 0.0, flops = 0.0, gbps = 0.0, bw_fraction = 0.0, tflops = 0.0, peak_fraction = 0.0;
  double gate_up_tflops = 0.0, down_tflops = 0.0;
};

struct PerfCase {
  const DeviceModel* dm = nullptr;
  int tokens = 1;
  MoeExpertsPath path = MoeExpertsPath::kAuto;
  MoeDownPrefetch prefetch = MoeDownPrefetch::kAuto;
  const char* tag = "main";
  bool stages = true;
  bool separate_combine = false;  // small-M path with the combine kernel instead of the fused combine
  bool two_kernels = false;       // small-M gate/up and down kernels (fused combine) where one launch would run
  bool w8a8 = false;              // FP8 weights: the grouped kernels quantize the activations (fp8_activations)
};

struct Ceilings {
  double copy_gbps = 0.0, peak_tflops = 0.0;
};

PerfResult run_perf(const PerfCase& c, std::mt19937_64& rng, cudaStream_t stream, int num_sms, const Ceilings& ceil,
                    const DeviceBuffer& flush_buf) {
  const Model& m = *c.dm->m;
  const int T = c.tokens, D = m.hidden, E = m.experts, k = m.top_k;
  std::vector<float> logits(static_cast<size_t>(T) * E);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (auto& v : logits) v = u(rng);
  DeviceBuffer d_logits(logits.size() * 4, stream), d_ids(static_cast<size_t>(T) * k * 4, stream),
      d_weights(static_cast<size_t>(T) * k * 4, stream), d_x(static_cast<size_t>(T) * D * 2, stream),
      d_out(static_cast<size_t>(T) * D * 2, stream);
  CUDA_TRY(cudaMemcpyAsync(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice, stream));
  fill(d_x.as<uint16_t>(), static_cast<int64_t>(T) * D, rng(), 0, stream);
  MoeParams p = model_params(*c.dm, T, num_sms);
  p.router_logits = d_logits.as<float>();
  p.topk_ids = d_ids.as<int32_t>();
  p.topk_weights = d_weights.as<float>();
  p.x = d_x.as<uint16_t>();
  p.out = d_out.as<uint16_t>();
  p.path = c.path;
  p.down_prefetch = c.prefetch;
  p.fp8_activations = c.w8a8 ? 1 : 0;
  DeviceBuffer workspace(cuda::moe_workspace_bytes(p), stream);
  p.workspace = workspace.data();
  cuda::moe_workspace_init(p, stream);
  const auto flush = [&] {
    read_flush<<<4 * num_sms, 512, 0, stream>>>(flush_buf.as<int4>(), static_cast<int64_t>(flush_buf.bytes() / 16),
                                                 flush_buf.as<int>());
  };
  PerfResult r;
  r.model = m.name;
  r.tag = c.tag;
  r.tokens = T;
  const MoeExpertsPath path = cuda::moe_resolve_path(p);
  r.path = path_name(path);
  const auto forward = [&] {
    if (!c.separate_combine && !c.two_kernels) {
      cuda::moe_forward(p, {stream});
      return;
    }
    using namespace cuda::moe_detail;  // the launches moe_forward made before the one-launch FFN (no shared experts)
    MoeKernelParams kp = make_kernel_params(p);
    kp.down_prefetch = use_down_prefetch(p, kp.max_active) ? 1 : 0;
    kp.fused_combine = c.two_kernels ? 1 : 0;
    launch_route(kp, {stream});
    launch_small_gate_up(kp, {stream});
    launch_small_down(kp, {stream});
    if (!kp.fused_combine) launch_combine(kp, {stream});
  };
  r.us_eager = 1e3 * time_ms(stream, 3, 20, forward, flush);
  CUDA_TRY(cudaGetLastError());
  {
    Graph graph;
    if (graph.capture(stream, forward)) {
      r.us_graph = 1e3 * time_ms(stream, 3, 20, [&] { graph.launch(stream); }, flush);
    }
    CUDA_TRY(cudaGetLastError());
  }
  if (c.stages) {  // each stage alone (eager, L2 flushed before each), on the alignment of the last full run
    using namespace cuda::moe_detail;
    MoeKernelParams kp = make_kernel_params(p);
    kp.down_prefetch = path == MoeExpertsPath::kSmallM && use_down_prefetch(p, kp.max_active) ? 1 : 0;
    kp.fused_combine = path == MoeExpertsPath::kSmallM && T <= kFusedCombineMaxTokens ? 1 : 0;  // in "down"
    r.us_route = 1e3 * time_ms(stream, 2, 10, [&] { launch_route(kp, {stream}); }, flush);
    if (path == MoeExpertsPath::kSmallM) {
      r.us_gate_up = 1e3 * time_ms(stream, 2, 10, [&] { launch_small_gate_up(kp, {stream}); }, flush);
      r.us_down = 1e3 * time_ms(stream, 2, 10, [&] { launch_small_down(kp, {stream}); }, flush);
      if (T <= 8) r.us_ffn = 1e3 * time_ms(stream, 2, 10, [&] { launch_small_ffn(kp, {stream}); }, flush);
    } else {
      r.us_gate_up = 1e3 * time_ms(stream, 2, 10, [&] { launch_grouped_gate_up(kp, {stream}); }, flush);
      r.us_down = 1e3 * time_ms(stream, 2, 10, [&] { launch_grouped_down(kp, {stream}); }, flush);
    }
    r.us_combine = 1e3 * time_ms(stream, 2, 10, [&] { launch_combine(kp, {stream}); }, flush);
    CUDA_TRY(cudaGetLastError());
  }
  const auto l = cuda::moe_detail::moe_workspace_layout(p);
  const auto counts = to_host<int32_t>(static_cast<const uint8_t*>(workspace.data()) + l.expert_counts, E, stream);
  for (int v : counts) r.active += v > 0;
  // FP8: a byte a weight plus a float32 scale per 128 x 128 block; INT4: half a byte plus a scale per group.
  const double expert_bytes = c.dm->fp8    ? 3.0 * D * m.inter * (1.0 + 4.0 / (128.0 * 128.0))
                              : c.dm->int4 ? 3.0 * D * m.inter * (0.5 + 4.0 / kInt4Group)
                                           : 3.0 * D * m.inter * 2.0;
  r.bytes = r.active * expert_bytes + 2.0 * T * D * 2.0 + static_cast<double>(T) * E * 4.0;
  r.flops = 2.0 * T * k * 3.0 * D * static_cast<double>(m.inter);
  const double us = r.us_graph > 0.0 ? r.us_graph : r.us_eager;
  r.gbps = r.bytes / (us * 1e-6) / 1e9;
  r.bw_fraction = r.gbps / ceil.copy_gbps;
  r.tflops = r.flops / (us * 1e-6) / 1e12;
  r.peak_fraction = r.tflops / ceil.peak_tflops;
  if (r.us_gate_up > 0.0) r.gate_up_tflops = 2.0 * T * k * 2.0 * D * m.inter / (r.us_gate_up * 1e-6) / 1e12;
  if (r.us_down > 0.0) r.down_tflops = 2.0 * T * k * static_cast<double>(D) * m.inter / (r.us_down * 1e-6) / 1e12;
  std::printf("perf %-14s %-12s T=%-5d %-8s active %3d  graph %9.1f us  eager %9.1f us  [route %.1f, gate/up %.1f, "
              "down %.1f, combine %.1f, one-launch ffn %.1f]  %7.0f GB/s (%5.1f%% copy)  %6.1f TFLOP/s (%5.1f%% peak)\n",
              r.model.c_str(), r.tag.c_str(), T, r.path.c_str(), r.active, r.us_graph, r.us_eager, r.us_route,
              r.us_gate_up, r.us_down, r.us_combine, r.us_ffn, r.gbps, 100.0 * r.bw_fraction, r.tflops,
              100.0 * r.peak_fraction);
  std::fflush(stdout);
  return r;
}


int run(int argc, char** argv) {
  std::string json_path = "moe_h200.json";
  bool quick = false, prefill = false, decode = false, small = false, run_checks = true, probe = false, fp8 = false;
  uint64_t seed = std::random_device{}();  // --seed N: the same weights and routing in every run (an A/B of builds)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--prefill") prefill = true;
    if (a == "--decode") decode = true;
    if (a == "--small") small = true;
    if (a == "--no-checks") run_checks = false;
    if (a == "--probe") probe = true;
    if (a == "--fp8") fp8 = true;
    if (a == "--seed" && i + 1 < argc) seed = std::stoull(argv[++i]);
  }
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  int num_sms = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, num_sms, prop.l2CacheSize >> 20);
  if (probe) return 0;  // the binary starts and sees the GPU
  CudaStream stream_owner;
  const cudaStream_t stream = stream_owner.get();
  std::mt19937_64 rng(seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));

  DeviceModel v2lite = make_device_model(kV2Lite, seed + 100, rng, stream);
  DeviceModel v3 = make_device_model(kV3, seed + 200, rng, stream);
  DeviceModel v2full = make_device_model(kV2Full, seed + 300, rng, stream);
  DeviceModel v2lite_norm = make_device_model(kV2LiteNorm, seed + 400, rng, stream);
  CUDA_TRY(cudaStreamSynchronize(stream));

  // 1. Correctness.
  struct Named {
    const DeviceModel* dm;
    CheckCase c;
  };
  const std::vector<Named> cases = {
      {&v2lite, {.tokens = 1}},
      {&v2lite, {.tokens = 3, .add = true}},
      {&v2lite, {.tokens = 64, .path = MoeExpertsPath::kSmallM}},
      {&v2lite, {.tokens = 64, .path = MoeExpertsPath::kGrouped}},
      {&v2lite, {.tokens = 1000, .check_tokens = 48}},
      {&v2lite, {.tokens = 1000, .routing = Routing::kSkewed, .path = MoeExpertsPath::kGrouped, .check_tokens = 48}},
      {&v2lite, {.tokens = 200, .routing = Routing::kSkewed, .path = MoeExpertsPath::kSmallM, .check_tokens = 32}},
      {&v2lite, {.tokens = 37, .routing = Routing::kGivenIds, .path = MoeExpertsPath::kSmallM, .check_tokens = 37}},
      {&v2lite, {.tokens = 300, .routing = Routing::kGivenIds, .path = MoeExpertsPath::kGrouped, .add = true,
                 .check_tokens = 32}},
      {&v3, {.tokens = 1, .check_tokens = 1}},
      {&v3, {.tokens = 3, .check_tokens = 3}},
      {&v3, {.tokens = 64, .path = MoeExpertsPath::kSmallM, .check_tokens = 12}},
      {&v3, {.tokens = 64, .path = MoeExpertsPath::kGrouped, .check_tokens = 12}},
      {&v3, {.tokens = 1000, .path = MoeExpertsPath::kGrouped, .check_tokens = 6}},
      {&v3, {.tokens = 1000, .routing = Routing::kSkewed, .path = MoeExpertsPath::kGrouped, .check_tokens = 6}},
      {&v3, {.tokens = 4096, .check_tokens = 0}},
      {&v2full, {.tokens = 1000, .check_tokens = 0}},
      {&v2full, {.tokens = 100, .routing = Routing::kSkewed, .check_tokens = 0}},
      {&v2lite_norm, {.tokens = 257, .check_tokens = 0}},
  };
  std::vector<CheckResult> checks;
  bool all_pass = true;
  for (const auto& nc : run_checks ? cases : std::vector<Named>{}) {
    CheckCase c = nc.c;
    c.model = nc.dm->m;
    auto r = run_check(c, *nc.dm, rng, stream, num_sms);
    all_pass = all_pass && r.pass;
    checks.push_back(std::move(r));
  }
  std::printf("correctness: %s\n", !run_checks ? "not checked" : all_pass ? "all pass" : "FAILURES");

  // 2. Ceilings.
  Ceilings ceil;
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer src(bytes, stream), dst(bytes, stream);
    fill(src.as<uint16_t>(), static_cast<int64_t>(bytes / 2), seed + 7, 0, stream);
    const double ms = time_ms(stream, 2, 10, [&] {
      CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    }, [] {});
    ceil.copy_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
    std::printf("copy bandwidth: %.0f GB/s (2 GiB device-to-device, %.3f ms)\n", ceil.copy_gbps, ms);
  }
  std::string peak_how;
  const double cublas_tflops = cublas_peak_tflops(stream, seed, peak_how);
  ceil.peak_tflops = cublas_tflops > 0.0 ? cublas_tflops : kQuotedBf16PeakTflops;
  std::printf("bf16 GEMM peak: %.0f TFLOP/s (%s)\n", ceil.peak_tflops,
              cublas_tflops > 0.0 ? peak_how.c_str() : (peak_how + "; quoted value used").c_str());
  CUDA_TRY(cudaGetLastError());

  // 3. Timings.
  std::vector<PerfResult> perf;
  double empty_kernel_us = 0.0;
  {
    DeviceBuffer flush_buf(size_t{256} << 20, stream);
    CUDA_TRY(cudaMemsetAsync(flush_buf.data(), 0, flush_buf.bytes(), stream));
    {  // what a lone kernel costs between two events after the flush: the floor under every stage timing
      const auto flush = [&] {
        read_flush<<<4 * num_sms, 512, 0, stream>>>(flush_buf.as<int4>(),
                                                     static_cast<int64_t>(flush_buf.bytes() / 16), flush_buf.as<int>());
      };
      empty_kernel_us = 1e3 * time_ms(stream, 3, 20, [&] { empty_kernel<<<1, 32, 0, stream>>>(); }, flush);
      std::printf("empty kernel between events: %.1f us\n", empty_kernel_us);
    }
    const auto add = [&](const PerfCase& c) { perf.push_back(run_perf(c, rng, stream, num_sms, ceil, flush_buf)); };
    if (prefill) {
      add({.dm = &v2lite, .tokens = 4096});
      add({.dm = &v3, .tokens = 4096});
      add({.dm = &v2lite, .tokens = 1024, .path = MoeExpertsPath::kGrouped, .tag = "other-path"});
      add({.dm = &v2lite, .tokens = 4096, .tag = "repeat"});
      DeviceModel dense = make_device_model(kDense, seed + 500, rng, stream);
      add({.dm = &dense, .tokens = 8192, .path = MoeExpertsPath::kGrouped, .tag = "dense"});
    }
    if (decode) {
      for (int round = 0; round < 2; ++round) {
        for (const DeviceModel* dm : {&v2lite, &v3}) {
          for (int t : {1, 2, 4, 8}) {
            add({.dm = dm, .tokens = t, .tag = round == 0 ? "main" : "repeat"});
            add({.dm = dm, .tokens = t, .tag = "two-kernel", .stages = false, .two_kernels = true});
          }
        }
      }
    }
    if (small) {  // the small-M path at decode batch sizes, bf16 and FP8 experts, to compare builds of its kernels
      DeviceModel v2lite_fp8 = make_fp8_device_model(kV2Lite, seed + 600, stream);
      DeviceModel v3_fp8 = make_fp8_device_model(kV3, seed + 700, stream);
      DeviceModel v2lite_int4 = make_int4_device_model(kV2Lite, seed + 800, stream);
      DeviceModel v3_int4 = make_int4_device_model(kV3, seed + 900, stream);
      for (const DeviceModel* dm : {&v2lite, &v3, &v2lite_fp8, &v3_fp8, &v2lite_int4, &v3_int4}) {
        const char* tag = dm->fp8 ? "fp8-small" : dm->int4 ? "int4-small" : "small";
        for (int t : {1, 8, 16, 32, 64, 128}) add({.dm = dm, .tokens = t, .path = MoeExpertsPath::kSmallM, .tag = tag});
      }
    }
    const bool only_listed = prefill || decode || small;
    const std::vector<int> token_counts = only_listed ? std::vector<int>{}
                                          : quick ? std::vector<int>{1, 4096}
                                                  : std::vector<int>{1, 32, 256, 4096};
    for (const DeviceModel* dm : {&v2lite, &v3}) {
      for (int t : token_counts) add({.dm = dm, .tokens = t});
    }
    if (fp8 && !small) {  // FP8 expert weights beside the bf16 cases above: decode (GB/s) and prefill (TFLOP/s) sizes
      DeviceModel v2lite_fp8 = make_fp8_device_model(kV2Lite, seed + 600, stream);
      DeviceModel v3_fp8 = make_fp8_device_model(kV3, seed + 700, stream);
      for (const DeviceModel* dm : {&v2lite_fp8, &v3_fp8}) {
        for (int t : {1, 2, 4, 8, 32, 4096}) add({.dm = dm, .tokens = t, .tag = "fp8"});
        add({.dm = dm, .tokens = 4096, .tag = "fp8-w8a8", .w8a8 = true});
      }
      for (const DeviceModel* dm : {&v2lite, &v3}) add({.dm = dm, .tokens = 32768, .tag = "bf16-32k", .stages = false});
      for (const DeviceModel* dm : {&v2lite_fp8, &v3_fp8}) {
        add({.dm = dm, .tokens = 32768, .tag = "fp8", .stages = false});
        add({.dm = dm, .tokens = 32768, .tag = "fp8-w8a8", .stages = false, .w8a8 = true});
      }
    }
    if (!quick && !only_listed) {
      add({.dm = &v2lite, .tokens = 1, .prefetch = MoeDownPrefetch::kOff, .tag = "prefetch-off", .stages = false});
      add({.dm = &v2lite, .tokens = 1, .tag = "sep-combine", .stages = false, .separate_combine = true});
      add({.dm = &v2lite, .tokens = 1, .tag = "two-kernel", .stages = false, .two_kernels = true});
      add({.dm = &v3, .tokens = 1, .tag = "two-kernel", .stages = false, .two_kernels = true});
      add({.dm = &v2lite, .tokens = 32, .tag = "sep-combine", .stages = false, .separate_combine = true});
      add({.dm = &v2lite, .tokens = 8, .tag = "main"});
      add({.dm = &v2lite, .tokens = 128, .tag = "main"});
      add({.dm = &v2lite, .tokens = 256, .path = MoeExpertsPath::kGrouped, .tag = "other-path"});
      add({.dm = &v2lite, .tokens = 1024, .path = MoeExpertsPath::kSmallM, .tag = "other-path"});
      add({.dm = &v2lite, .tokens = 1024, .path = MoeExpertsPath::kGrouped, .tag = "other-path"});
      add({.dm = &v3, .tokens = 1024, .path = MoeExpertsPath::kGrouped, .tag = "other-path"});
      add({.dm = &v2lite, .tokens = 4096, .tag = "repeat"});
      add({.dm = &v2lite, .tokens = 1, .tag = "repeat"});
      DeviceModel dense = make_device_model(kDense, seed + 500, rng, stream);
      add({.dm = &dense, .tokens = 8192, .path = MoeExpertsPath::kGrouped, .tag = "dense"});
    }
    CUDA_TRY(cudaStreamSynchronize(stream));
  }

  // 4. JSON.
  if (FILE* f = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(f, "{\n  \"benchmark\": \"moe\",\n");
    std::fprintf(f, "  \"gpu\": \"%s\",\n  \"num_sms\": %d,\n  \"l2_bytes\": %d,\n", json_escape(prop.name).c_str(),
                 num_sms, prop.l2CacheSize);
    std::fprintf(f, "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"command\": \"%s\",\n",
                 json_escape(env_or("BENCH_COMMIT", "unknown")).c_str(),
                 json_escape(env_or("BENCH_DATE", "unknown")).c_str(),
                 json_escape(env_or("BENCH_COMMAND", "moe_bench")).c_str());
    std::fprintf(f, "  \"seed\": %llu,\n", static_cast<unsigned long long>(seed));
    std::fprintf(f, "  \"empty_kernel_us\": %.2f,\n", empty_kernel_us);
    std::fprintf(f, "  \"copy_bandwidth_gbps\": %.1f,\n  \"bf16_peak_tflops\": %.1f,\n  \"bf16_peak_source\": \"%s\",\n",
                 ceil.copy_gbps, ceil.peak_tflops,
                 json_escape(cublas_tflops > 0.0 ? peak_how : peak_how + "; quoted value").c_str());
    std::fprintf(f, "  \"correctness_pass\": %s,\n  \"correctness\": [\n", all_pass ? "true" : "false");
    for (size_t i = 0; i < checks.size(); ++i) {
      const auto& r = checks[i];
      std::fprintf(f,
                   "    {\"case\": \"%s\", \"path\": \"%s\", \"tokens\": %d, \"active_experts\": %d, "
                   "\"id_mismatches\": %d, \"near_ties\": %d, \"weight_error\": %.3e, \"align_errors\": %d, "
                   "\"act_error\": %.3e, \"out_error\": %.3e, \"out_rel_l2\": %.3e, \"nan\": %lld, \"pass\": %s}%s\n",
                   r.name.c_str(), r.path.c_str(), r.tokens, r.active, r.id_mismatches, r.near_ties, r.weight_error,
                   r.align_errors, r.act_error, r.out_error, r.out_rel_l2, static_cast<long long>(r.nan_count),
                   r.pass ? "true" : "false", i + 1 < checks.size() ? "," : "");
    }
    std::fprintf(f, "  ],\n  \"perf\": [\n");
    for (size_t i = 0; i < perf.size(); ++i) {
      const auto& r = perf[i];
      std::fprintf(f,
                   "    {\"model\": \"%s\", \"tag\": \"%s\", \"tokens\": %d, \"path\": \"%s\", \"active_experts\": %d, "
                   "\"time_us_graph\": %.2f, \"time_us_eager\": %.2f, \"route_us\": %.2f, \"gate_up_us\": %.2f, "
                   "\"down_us\": %.2f, \"combine_us\": %.2f, \"bytes\": %.0f, \"flops\": %.0f, \"gbps\": %.1f, "
                   "\"copy_bw_fraction\": %.4f, \"tflops\": %.2f, \"bf16_peak_fraction\": %.4f, "
                   "\"gate_up_tflops\": %.1f, \"down_tflops\": %.1f, \"ffn_us\": %.2f}%s\n",
                   r.model.c_str(), r.tag.c_str(), r.tokens, r.path.c_str(), r.active, r.us_graph, r.us_eager,
                   r.us_route, r.us_gate_up, r.us_down, r.us_combine, r.bytes, r.flops, r.gbps, r.bw_fraction,
                   r.tflops, r.peak_fraction, r.gate_up_tflops, r.down_tflops, r.us_ffn, i + 1 < perf.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }

  std::printf("\n%-8s %-12s %-6s %-8s %6s %10s %10s %9s %7s %9s %7s\n", "model", "tag", "tokens", "path", "active",
              "graph_us", "eager_us", "GB/s", "%copy", "TFLOP/s", "%peak");
  for (const auto& r : perf) {
    std::printf("%-8s %-12s %-6d %-8s %6d %10.1f %10.1f %9.0f %6.1f%% %9.1f %6.1f%%\n", r.model.c_str(),
                r.tag.c_str(), r.tokens, r.path.c_str(), r.active, r.us_graph, r.us_eager, r.gbps,
                100.0 * r.bw_fraction, r.tflops, 100.0 * r.peak_fraction);
  }
  return all_pass ? 0 : 1;
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  try {
    return deepinfer::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
