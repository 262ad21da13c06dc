// The mla_prepare op cases, shared by the CPU op tests (against the naive formula below) and the CUDA tests (against
// the CPU). The op is checked output by output: c_kv normalized and k_pe rotated in the latent rows, q_pe rotated in
// q, the latent rows in the cache at their slots, the decode tokens' rotated q_pe in q_abs; and everything it must not
// touch (q_nope, the rank columns of q_abs, the other cache rows) compared exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "op_test_harness.h"

namespace deepinfer::op_test {

struct MlaPrepareShape {
  int64_t tokens = 0;
  int64_t decode = 0;  // the first `decode` tokens also fill q_abs; 0: no q_abs at all (a prefill-only step)
  int64_t heads = 0, nope = 0, rope = 0, rank = 0;
  int64_t page_size = 0;
  bool interleaved = true;
  float attention_scaling = 1.0f;

  int64_t qk_dim() const { return nope + rope; }
  int64_t latent_dim() const { return rank + rope; }
  std::string str() const {
    return str_cat("t", tokens, "_d", decode, "_h", heads, "_n", nope, "_p", rope, "_r", rank, "_ps", page_size,
                   interleaved ? "_interleaved" : "_half", attention_scaling == 1.0f ? "" : "_yarn");
  }
};

// The case's values rounded to `dtype` (bfloat16 or float32), so that every backend starts from the same numbers.
inline std::vector<float> round_to(DType dtype, std::vector<float> values) {
  if (dtype == DType::kBF16) {
    for (float& v : values) v = bf16_to_float(float_to_bf16(v));
  }
  return values;
}

// Activations live in `device_dtype` on a device backend and in float32 on the CPU (the reference computes in fp32).
inline HostTensor activation_tensor(const OpRunner& run, DType device_dtype, Shape shape,
                                    const std::vector<float>& values) {
  const bool bf16 = run.device() != Device::kCpu && device_dtype == DType::kBF16;
  return bf16 ? HostTensor::bf16(shape, values) : HostTensor::f32(shape, values);
}

// The values of `all` at the flat indices where `mask` is true, or false (`want`).
inline std::vector<double> masked_values(const std::vector<double>& all, const std::vector<bool>& mask, bool want) {
  std::vector<double> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (mask[i] == want) out.push_back(all[i]);
  }
  return out;
}

// Rotates pair i of the rope slice at `x` (naive: double cos and sin of the fp32 angle, scaled).
inline void naive_rope_pair(double* x, int64_t i, int64_t half, bool interleaved, float angle, double scaling) {
  const double c = std::cos(double(angle)) * scaling, s = std::sin(double(angle)) * scaling;
  double& x0 = interleaved ? x[2 * i] : x[i];
  double& x1 = interleaved ? x[2 * i + 1] : x[i + half];
  const double r0 = x0 * c - x1 * s, r1 = x1 * c + x0 * s;
  x0 = r0;
  x1 = r1;
}

// Registers one case. `device_dtype`: the activation dtype a device backend runs it in; `tolerance`: its normalized
// error allowed.
inline void add_mla_prepare(CaseRegistry& r, const MlaPrepareShape& s, DType device_dtype, double tolerance,
                            uint64_t seed) {
  Rng rng(seed);
  const int64_t t = s.tokens, td = s.decode, h = s.heads, qk = s.qk_dim(), ld = s.latent_dim(), half = s.rope / 2;
  const int64_t num_pages = (t + s.page_size - 1) / s.page_size + 2;  // spare pages keep their prior rows
  const int64_t cache_rows = num_pages * s.page_size;
  const std::vector<float> latent = round_to(device_dtype, rng.uniform(t * ld, -3.0f, 3.0f));
  const std::vector<float> q = round_to(device_dtype, rng.uniform(t * h * qk));
  const std::vector<float> q_abs_prior = round_to(device_dtype, rng.uniform(td * h * ld, 5.0f, 6.0f));
  const std::vector<float> cache_prior = round_to(device_dtype, rng.uniform(cache_rows * ld, 7.0f, 8.0f));
  const std::vector<float> norm_weight = rng.uniform(s.rank, 0.5f, 1.5f);
  const std::vector<float> inv_freq = rope_inv_freq(s.rope);
  std::vector<int32_t> all_slots(static_cast<size_t>(cache_rows));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);  // scattered over the pages, not in token order
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + t);
  std::vector<int32_t> positions(static_cast<size_t>(t));
  for (int32_t& p : positions) p = rng.integer(0, 163839);
  if (t > 0) positions[0] = 0;
  const float eps = 1e-6f;

  // Which elements the op writes: the rope columns of q and q_abs, the cache rows at the slots.
  std::vector<bool> q_rope(static_cast<size_t>(t * h * qk)), abs_rope(static_cast<size_t>(td * h * ld));
  std::vector<bool> cached(static_cast<size_t>(cache_rows * ld), false);
  for (size_t i = 0; i < q_rope.size(); ++i) q_rope[i] = static_cast<int64_t>(i) % qk >= s.nope;
  for (size_t i = 0; i < abs_rope.size(); ++i) abs_rope[i] = static_cast<int64_t>(i) % ld >= s.rank;
  for (int32_t slot : slots) std::fill_n(cached.begin() + slot * ld, ld, true);
  std::vector<bool> c_kv_cols(static_cast<size_t>(t * ld));
  for (size_t i = 0; i < c_kv_cols.size(); ++i) c_kv_cols[i] = static_cast<int64_t>(i) % ld < s.rank;
  // Outputs in one order for both sides; the cache rows written are listed in token order.
  using Values = std::vector<double>;
  const auto outputs = [=](const Values& lat, const Values& qv, const Values& q_abs, const Values& cache) -> Outputs {
    Values written;
    for (int64_t i = 0; i < t; ++i) {
      written.insert(written.end(), cache.begin() + slots[i] * ld, cache.begin() + (slots[i] + 1) * ld);
    }
    return {{"c_kv", masked_values(lat, c_kv_cols, true)},
            {"k_pe", masked_values(lat, c_kv_cols, false)},
            {"q_pe", masked_values(qv, q_rope, true)},
            {"q_nope", masked_values(qv, q_rope, false), Compare::kExact},
            {"q_abs_pe", masked_values(q_abs, abs_rope, true)},
            {"q_abs_latent", masked_values(q_abs, abs_rope, false), Compare::kExact},
            {"cache_written", written},
            {"cache_other_rows", masked_values(cache, cached, false), Compare::kExact}};
  };
  r.add({.op = OpKind::kMlaPrepare,
         .name = str_cat("mla_prepare_", device_dtype == DType::kBF16 ? "bf16_" : "f32_", s.str()),
         .run = [=](OpRunner& run) -> Outputs {
           const auto act = [&](Shape shape, const std::vector<float>& v, Access access) {
             return run.upload(activation_tensor(run, device_dtype, shape, v), access);
           };
           const TensorView lat = act({t, ld}, latent, Access::kReadWrite);
           const TensorView qv = act({t, h, qk}, q, Access::kReadWrite);
           const TensorView q_abs = td > 0 ? act({td, h, ld}, q_abs_prior, Access::kReadWrite) : TensorView{};
           const TensorView cache = act({num_pages, s.page_size, ld}, cache_prior, Access::kReadWrite);
           run.backend().mla_prepare({.latent = lat, .q = qv, .q_abs = q_abs, .cache = cache,
                                      .slot_mapping = run.upload(HostTensor::i32({t}, slots)),
                                      .positions = run.upload(HostTensor::i32({t}, positions)),
                                      .kv_a_norm = run.upload(HostTensor::f32({s.rank}, norm_weight)),
                                      .inv_freq = run.upload(HostTensor::f32({half}, inv_freq)),
                                      .kv_lora_rank = s.rank, .eps = eps, .attention_scaling = s.attention_scaling,
                                      .interleaved = s.interleaved});
           return outputs(run.fetch(lat), run.fetch(qv), td > 0 ? run.fetch(q_abs) : std::vector<double>{},
                          run.fetch(cache));
         },
         .naive = [=]() -> Outputs {
           std::vector<double> lat(latent.begin(), latent.end()), qv(q.begin(), q.end());
           std::vector<double> q_abs(q_abs_prior.begin(), q_abs_prior.end());
           std::vector<double> cache(cache_prior.begin(), cache_prior.end());
           for (int64_t i = 0; i < t; ++i) {
             double* row = &lat[i * ld];
             double sum_sq = 0.0;
             for (int64_t c = 0; c < s.rank; ++c) sum_sq += row[c] * row[c];
             const double inv_rms = 1.0 / std::sqrt(sum_sq / double(s.rank) + eps);
             for (int64_t c = 0; c < s.rank; ++c) row[c] = double(norm_weight[c]) * row[c] * inv_rms;
             for (int64_t j = 0; j < half; ++j) {
               const float angle = static_cast<float>(positions[i]) * inv_freq[j];
               naive_rope_pair(row + s.rank, j, half, s.interleaved, angle, s.attention_scaling);
               for (int64_t head = 0; head < h; ++head) {
                 naive_rope_pair(&qv[(i * h + head) * qk + s.nope], j, half, s.interleaved, angle,
                                 s.attention_scaling);
               }
             }
             std::copy(row, row + ld, cache.begin() + slots[i] * ld);
             for (int64_t head = 0; head < h && i < td; ++head) {
               std::copy_n(&qv[(i * h + head) * qk + s.nope], s.rope, q_abs.begin() + (i * h + head) * ld + s.rank);
             }
           }
           return outputs(lat, qv, q_abs, cache);
         },
         .tolerance = tolerance});
}

// Arguments mla_prepare must reject, each with an otherwise valid call.
enum class BadPrepare : uint8_t {
  kMoreDecodeThanTokens,  // q_abs [T + 1, H, rank + rope]
  kQAbsWidth,             // q_abs rows one column short
  kOddRope,               // a latent row leaves an odd number of rope columns
  kNormWeightSize,        // kv_a_norm of rank - 1 values
  kSlotOutsideCache,      // a slot past the last cache row (value check: host memory only)
};

inline void add_mla_prepare_rejects(CaseRegistry& r, BadPrepare bad) {
  const int64_t t = 3, h = 2, nope = 4, rope = 4, rank = 6, pages = 2, page_size = 4;
  const int64_t ld = rank + rope + (bad == BadPrepare::kOddRope ? 1 : 0), qk = nope + rope;
  const int64_t td = bad == BadPrepare::kMoreDecodeThanTokens ? t + 1 : 2;
  const int64_t abs_width = bad == BadPrepare::kQAbsWidth ? ld - 1 : ld;
  const int64_t norm_size = bad == BadPrepare::kNormWeightSize ? rank - 1 : rank;
  const std::vector<int32_t> slots = {0, 5, bad == BadPrepare::kSlotOutsideCache ? int32_t{pages * page_size} : 7};
  const char* names[] = {"more_decode_than_tokens", "q_abs_width", "odd_rope", "norm_weight_size",
                         "slot_outside_cache"};
  r.add({.op = OpKind::kMlaPrepare,
         .name = str_cat("mla_prepare_rejects_", names[static_cast<int>(bad)]),
         .run = [=](OpRunner& run) -> Outputs {
           const auto f32 = [&](Shape shape) {
             return run.upload(HostTensor::f32(shape, std::vector<float>(static_cast<size_t>(shape.numel()), 1.0f)),
                               Access::kReadWrite);
           };
           const std::vector<int32_t> positions = {0, 1, 2};
           const int64_t half = (ld - rank) / 2;
           run.backend().mla_prepare({.latent = f32({t, ld}), .q = f32({t, h, qk}), .q_abs = f32({td, h, abs_width}),
                                      .cache = f32({pages, page_size, ld}),
                                      .slot_mapping = run.upload(HostTensor::i32({t}, slots)),
                                      .positions = run.upload(HostTensor::i32({t}, positions)),
                                      .kv_a_norm = f32({norm_size}), .inv_freq = f32({half}), .kv_lora_rank = rank});
           return {};
         },
         .expect = bad == BadPrepare::kSlotOutsideCache ? Expect::kThrowsOnHost : Expect::kThrows});
}

// The shapes every backend runs: V2-Lite (16 heads) and V3 (128 heads) at DeepSeek's dims (nope 128, rope 64, rank
// 512); decode only, mixed decode and prefill, prefill only (no q_abs); no tokens, one token, a few hundred; both
// rope layouts; YaRN's attention scaling; 64-token and odd (7, 3) pages; odd dims whose pairs are not 4-byte aligned
// in bfloat16; a rope wider than a block (lanes loop over pairs), a rank past 1024 (the 512-thread reduction) and one
// past the values a thread keeps in registers.
inline void add_mla_prepare_cases(CaseRegistry& r, DType device_dtype, double tolerance, uint64_t seed) {
  const MlaPrepareShape v2_lite{.heads = 16, .nope = 128, .rope = 64, .rank = 512, .page_size = 64};
  MlaPrepareShape v3 = v2_lite;
  v3.heads = 128;
  const auto with = [](MlaPrepareShape s, int64_t tokens, int64_t decode, int64_t page_size, bool interleaved,
                       float scaling) {
    s.tokens = tokens;
    s.decode = decode;
    s.page_size = page_size;
    s.interleaved = interleaved;
    s.attention_scaling = scaling;
    return s;
  };
  const auto add = [&](const MlaPrepareShape& s) { add_mla_prepare(r, s, device_dtype, tolerance, seed++); };
  for (const bool interleaved : {true, false}) {
    add(with(v2_lite, 4, 4, 64, interleaved, 1.0f));     // decode only
    add(with(v2_lite, 9, 3, 7, interleaved, 1.0f));      // mixed, odd pages
    add(with(v3, 6, 2, 7, interleaved, 1.3f));           // mixed, YaRN scaling
    add(with(v3, 5, 5, 64, interleaved, 1.0f));          // decode only
  }
  add(with(v2_lite, 70, 0, 64, true, 1.0f));             // prefill only: no q_abs
  add(with(v2_lite, 300, 100, 64, true, 1.3f));          // many tokens
  add(with(v3, 0, 0, 64, true, 1.0f));                   // no tokens
  add(with(v3, 1, 1, 64, true, 1.0f));                   // one decode token
  add(with(v2_lite, 1, 0, 7, false, 1.0f));              // one prefill token
  add({.tokens = 5, .decode = 2, .heads = 3, .nope = 5, .rope = 4, .rank = 9, .page_size = 3});       // unaligned
  add({.tokens = 5, .decode = 2, .heads = 3, .nope = 5, .rope = 4, .rank = 9, .page_size = 3, .interleaved = false});
  add({.tokens = 3, .decode = 1, .heads = 5, .nope = 4, .rope = 512, .rank = 16, .page_size = 4});    // wide rope
  add({.tokens = 3, .decode = 2, .heads = 2, .nope = 8, .rope = 16, .rank = 1536, .page_size = 64});  // wide rank
  // 1000 at 128 threads: each thread keeps 4 c_kv values with weights loaded ahead and reads its others again
  add({.tokens = 2, .decode = 2, .heads = 2, .nope = 8, .rope = 16, .rank = 1000, .page_size = 64});
}

}  // namespace deepinfer::op_test
