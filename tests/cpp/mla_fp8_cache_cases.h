// The FP8 latent cache cases (kv_cache_dtype "fp8", the row layout of backend/ops/latent_fp8.h) of the CUDA tests
// against the CPU reference: the cache write, mla_prepare and mla_prefill with a cache of dtype kF8E4M3.
//
// A cache starts as 0xff bytes (NaN codes and NaN scales: a row read that no write reached shows up as NaN), and
// every case returns the whole cache as raw bytes, compared exactly: rows no token writes must keep the poison, and
// where both backends quantize the same values the rows are the same bytes. Written rows are also returned
// dequantized on the host (dequantize_latent_fp8_row), so that a mismatch reads as values.
//   - mla_cache_write: both sides quantize the same latents (rounded to the device dtype first; the CPU gets them
//     as float32), so the rows agree exactly, dequantized and raw.
//   - mla_prepare: the CPU normalizes c_kv in fp32 and keeps fp32, the GPU writes the norm's output rounded to bf16
//     (on bf16) and quantizes that, so a value near a rounding boundary between two e4m3 codes may get the other
//     code, and a group whose amax sits at a power-of-two boundary the other scale (see add_mla_prepare_fp8).
//   - mla_prefill: the cache is written through mla_cache_write on each side (the same bytes), so attention
//     compares as over a bf16 cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "backend/ops/latent_fp8.h"
#include "mla_prepare_cases.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {

// An FP8 latent cache of `num_pages` pages whose every byte is `byte`.
inline HostTensor fp8_cache_filled(int64_t num_pages, int64_t page_size, const LatentFp8Layout& layout,
                                   uint8_t byte) {
  const std::vector<uint8_t> bytes(static_cast<size_t>(num_pages * page_size * layout.row_bytes()), byte);
  return HostTensor::from_raw({num_pages, page_size, layout.row_bytes()}, DType::kF8E4M3, bytes.data());
}

// Every byte of `t` as a value (compared exactly).
inline std::vector<double> byte_values(const HostTensor& t) {
  std::vector<double> v(t.bytes.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(std::to_integer<uint8_t>(t.bytes[i]));
  return v;
}

// Row `slot` of an FP8 cache tensor fetched to the host.
inline std::span<const uint8_t> fp8_row(const HostTensor& cache, const LatentFp8Layout& layout, int64_t slot) {
  const auto bytes = static_cast<size_t>(layout.row_bytes());
  return {reinterpret_cast<const uint8_t*>(cache.bytes.data()) + static_cast<size_t>(slot) * bytes, bytes};
}

// Rows `slots` of an FP8 cache, dequantized (c_kv | k_pe per row), in the order of `slots`.
inline std::vector<double> dequantized_rows(const HostTensor& cache, const LatentFp8Layout& layout,
                                            std::span<const int32_t> slots) {
  const auto dim = static_cast<size_t>(layout.rank + layout.rope_dim);
  std::vector<float> row(dim);
  std::vector<double> out;
  out.reserve(slots.size() * dim);
  for (const int32_t slot : slots) {
    dequantize_latent_fp8_row(fp8_row(cache, layout, slot), layout, row);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Latent rows for an FP8 cache: each 128-value group of c_kv at its own magnitude (uniform times 2^e, e in
// [-8, 4]: the groups of a row get different scales), every seventh group all zero (scale 1), k_pe in [-2, 2].
inline std::vector<float> fp8_test_latents(Rng& rng, int64_t tokens, const LatentFp8Layout& layout) {
  const int64_t dim = layout.rank + layout.rope_dim;
  std::vector<float> v = rng.uniform(tokens * dim);
  int64_t group_index = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = v.data() + t * dim;
    for (int64_t g = 0; g < layout.num_groups(); ++g, ++group_index) {
      const float factor = group_index % 7 == 6 ? 0.0f : std::ldexp(1.0f, rng.integer(-8, 4));
      const int64_t end = std::min(layout.rank, (g + 1) * LatentFp8Layout::kGroup);
      for (int64_t i = g * LatentFp8Layout::kGroup; i < end; ++i) row[i] *= factor;
    }
    for (int64_t i = layout.rank; i < dim; ++i) row[i] *= 2.0f;
  }
  return v;
}

inline const char* dtype_tag(DType device_dtype) { return device_dtype == DType::kBF16 ? "bf16" : "f32"; }

// Latent rows of `rank` + `rope` values written into an FP8 cache of `num_pages` pages at shuffled slots.
inline void add_mla_cache_write_fp8(CaseRegistry& r, DType device_dtype, int64_t num_pages, int64_t page_size,
                                    int64_t rank, int64_t rope, int64_t tokens, uint64_t seed) {
  const LatentFp8Layout layout{.rank = rank, .rope_dim = rope};
  Rng rng(seed);
  const int64_t dim = rank + rope;
  const std::vector<float> latent = round_to(device_dtype, fp8_test_latents(rng, tokens, layout));
  std::vector<int32_t> all_slots(static_cast<size_t>(num_pages * page_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + tokens);
  r.add({.op = OpKind::kMlaCacheWrite,
         .name = str_cat("mla_cache_write_fp8_", dtype_tag(device_dtype), "_", tokens, "_tokens_", num_pages, "x",
                         page_size, "_rank", rank, "_rope", rope),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView cache =
               run.upload(fp8_cache_filled(num_pages, page_size, layout, 0xff), Access::kReadWrite);
           run.backend().mla_cache_write(
               {.latent = run.upload(activation_tensor(run, device_dtype, {tokens, dim}, latent)),
                .cache = cache,
                .slot_mapping = run.upload(HostTensor::i32({tokens}, slots)),
                .kv_lora_rank = rank});
           const HostTensor got = run.download(cache);
           return {{"rows_dequantized", dequantized_rows(got, layout, slots), Compare::kExact},
                   {"cache_bytes", byte_values(got), Compare::kExact}};
         }});
}

// What one mla_prepare run into an FP8 cache left, fetched to the host.
struct Fp8PrepareResult {
  std::vector<double> latent, q, q_abs;
  HostTensor cache;
};

// mla_prepare of MlaPrepareShape `s` into an FP8 cache (0xff everywhere before), as two cases over the same inputs:
//   mla_prepare_fp8_*: the latent and query outputs at `tolerance` (as with a bf16 cache), the untouched parts and
//     the unwritten cache rows exactly; per written row, whether it is exactly quantize_latent_fp8_row of the latent
//     row the same backend returned (1 on both sides: each backend caches the quantization of its own output); and
//     on bf16 the cached k_pe at `tolerance`. (On float32 both sides round k_pe to bf16 from values that agree to
//     1e-5, so a value near a bf16 rounding boundary may differ by a bf16 step, past the float32 tolerance; the
//     exact check against each side's own k_pe covers it.)
//   mla_prepare_fp8_cache_*: the cached c_kv dequantized, at 0.15. Where both sides' values v_gpu and v_cpu (within
//     the bf16 tolerance of each other) fall on either side of a rounding boundary, the codes differ by one step;
//     one e4m3 step is 1/8 of the lower end of its binade, so at most |v| / 8 (a different scale at a power-of-two
//     boundary of amax moves the values the same way: each side's error stays within half a step, |v| / 16).
//     Adding the bf16 difference and normalizing by the largest reference value, which may itself be 1/16 below
//     its v, gives at most about 0.14.
inline void add_mla_prepare_fp8(CaseRegistry& r, const MlaPrepareShape& s, DType device_dtype, double tolerance,
                                uint64_t seed) {
  Rng rng(seed);
  const int64_t t = s.tokens, td = s.decode, h = s.heads, qk = s.qk_dim(), ld = s.latent_dim(), half = s.rope / 2;
  const LatentFp8Layout layout{.rank = s.rank, .rope_dim = s.rope};
  const int64_t num_pages = (t + s.page_size - 1) / s.page_size + 2;  // spare pages keep their poison
  const std::vector<float> latent = round_to(device_dtype, rng.uniform(t * ld, -3.0f, 3.0f));
  const std::vector<float> q = round_to(device_dtype, rng.uniform(t * h * qk));
  const std::vector<float> q_abs_prior = round_to(device_dtype, rng.uniform(td * h * ld, 5.0f, 6.0f));
  const std::vector<float> norm_weight = rng.uniform(s.rank, 0.5f, 1.5f);
  const std::vector<float> inv_freq = rope_inv_freq(s.rope);
  std::vector<int32_t> all_slots(static_cast<size_t>(num_pages * s.page_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + t);
  std::vector<int32_t> positions(static_cast<size_t>(t));
  for (int32_t& p : positions) p = rng.integer(0, 163839);
  const auto prepare = [=](OpRunner& run) -> Fp8PrepareResult {
    const auto act = [&](Shape shape, const std::vector<float>& v) {
      return run.upload(activation_tensor(run, device_dtype, shape, v), Access::kReadWrite);
    };
    const TensorView lat = act({t, ld}, latent), qv = act({t, h, qk}, q);
    const TensorView q_abs = td > 0 ? act({td, h, ld}, q_abs_prior) : TensorView{};
    const TensorView cache = run.upload(fp8_cache_filled(num_pages, s.page_size, layout, 0xff), Access::kReadWrite);
    run.backend().mla_prepare({.latent = lat, .q = qv, .q_abs = q_abs, .cache = cache,
                               .slot_mapping = run.upload(HostTensor::i32({t}, slots)),
                               .positions = run.upload(HostTensor::i32({t}, positions)),
                               .kv_a_norm = run.upload(HostTensor::f32({s.rank}, norm_weight)),
                               .inv_freq = run.upload(HostTensor::f32({half}, inv_freq)),
                               .kv_lora_rank = s.rank, .eps = 1e-6f, .attention_scaling = s.attention_scaling,
                               .interleaved = s.interleaved});
    return {.latent = run.fetch(lat), .q = run.fetch(qv),
            .q_abs = td > 0 ? run.fetch(q_abs) : std::vector<double>{}, .cache = run.download(cache)};
  };
  std::vector<bool> q_rope(static_cast<size_t>(t * h * qk)), abs_rope(static_cast<size_t>(td * h * ld));
  std::vector<bool> c_kv_cols(static_cast<size_t>(t * ld));
  std::vector<bool> written_bytes(static_cast<size_t>(num_pages * s.page_size * layout.row_bytes()), false);
  for (size_t i = 0; i < q_rope.size(); ++i) q_rope[i] = static_cast<int64_t>(i) % qk >= s.nope;
  for (size_t i = 0; i < abs_rope.size(); ++i) abs_rope[i] = static_cast<int64_t>(i) % ld >= s.rank;
  for (size_t i = 0; i < c_kv_cols.size(); ++i) c_kv_cols[i] = static_cast<int64_t>(i) % ld < s.rank;
  for (const int32_t slot : slots) {
    std::fill_n(written_bytes.begin() + slot * layout.row_bytes(), layout.row_bytes(), true);
  }
  const std::string shape = str_cat(dtype_tag(device_dtype), "_", s.str());
  r.add({.op = OpKind::kMlaPrepare,
         .name = str_cat("mla_prepare_fp8_", shape),
         .run = [=](OpRunner& run) -> Outputs {
           const Fp8PrepareResult got = prepare(run);
           // Per written row: 1 when it is the quantization of the latent row this backend returned.
           std::vector<double> own_quantization;
           std::vector<float> row_values(static_cast<size_t>(ld));
           std::vector<uint8_t> expected(static_cast<size_t>(layout.row_bytes()));
           for (int64_t i = 0; i < t; ++i) {
             std::copy_n(got.latent.begin() + i * ld, ld, row_values.begin());
             quantize_latent_fp8_row(row_values, layout, expected);
             const std::span<const uint8_t> cached = fp8_row(got.cache, layout, slots[i]);
             own_quantization.push_back(std::equal(cached.begin(), cached.end(), expected.begin()) ? 1.0 : 0.0);
           }
           Outputs outputs = {{"c_kv", masked_values(got.latent, c_kv_cols, true)},
                              {"k_pe", masked_values(got.latent, c_kv_cols, false)},
                              {"q_pe", masked_values(got.q, q_rope, true)},
                              {"q_nope", masked_values(got.q, q_rope, false), Compare::kExact},
                              {"q_abs_pe", masked_values(got.q_abs, abs_rope, true)},
                              {"q_abs_latent", masked_values(got.q_abs, abs_rope, false), Compare::kExact},
                              {"cache_rows_quantize_their_latent", own_quantization, Compare::kExact},
                              {"cache_other_rows", masked_values(byte_values(got.cache), written_bytes, false),
                               Compare::kExact}};
           if (device_dtype == DType::kBF16) {
             outputs.push_back({"cache_k_pe",
                                masked_values(dequantized_rows(got.cache, layout, slots), c_kv_cols, false)});
           }
           return outputs;
         },
         .tolerance = tolerance});
  r.add({.op = OpKind::kMlaPrepare,
         .name = str_cat("mla_prepare_fp8_cache_", shape),
         .run = [=](OpRunner& run) -> Outputs {
           const Fp8PrepareResult got = prepare(run);
           return {{"cache_c_kv", masked_values(dequantized_rows(got.cache, layout, slots), c_kv_cols, true)}};
         },
         .tolerance = 0.15});
}

// The mla_prepare shapes over an FP8 cache: V2-Lite's and V3's heads at DeepSeek's dims, decode only, mixed, prefill
// only, many tokens, none, one; odd pages; odd dims (a rank of 9: one partial group, rows with padding); a rank of
// 1000 (8 groups, the last partial) and one past 1024 (the 512-thread block).
inline void add_mla_prepare_fp8_cases(CaseRegistry& r, DType device_dtype, double tolerance, uint64_t seed) {
  const MlaPrepareShape v2_lite{.heads = 16, .nope = 128, .rope = 64, .rank = 512, .page_size = 64};
  MlaPrepareShape v3 = v2_lite;
  v3.heads = 128;
  const auto with = [](MlaPrepareShape s, int64_t tokens, int64_t decode, int64_t page_size, bool interleaved) {
    s.tokens = tokens;
    s.decode = decode;
    s.page_size = page_size;
    s.interleaved = interleaved;
    return s;
  };
  const auto add = [&](const MlaPrepareShape& s) { add_mla_prepare_fp8(r, s, device_dtype, tolerance, seed++); };
  add(with(v2_lite, 4, 4, 64, true));     // decode only
  add(with(v2_lite, 9, 3, 7, false));     // mixed, odd pages
  add(with(v3, 6, 2, 7, true));           // mixed, 128 heads
  add(with(v3, 5, 5, 64, false));         // decode only, 128 heads
  add(with(v2_lite, 70, 0, 64, true));    // prefill only: no q_abs
  add(with(v2_lite, 300, 100, 64, true)); // many tokens
  add(with(v3, 0, 0, 64, true));          // no tokens
  add(with(v3, 1, 1, 64, true));          // one decode token
  add({.tokens = 5, .decode = 2, .heads = 3, .nope = 5, .rope = 4, .rank = 9, .page_size = 3});
  add({.tokens = 2, .decode = 2, .heads = 2, .nope = 8, .rope = 16, .rank = 1000, .page_size = 64});
  add({.tokens = 3, .decode = 2, .heads = 2, .nope = 8, .rope = 16, .rank = 1536, .page_size = 64});
}

// Sequences' contexts on shuffled pages (2 spare pages): the page table [seqs, max_pages] (entries past a sequence's
// pages -1 or out of range) and the slot of every context position, sequence after sequence.
struct Fp8ScatteredPages {
  int64_t num_pages = 0;
  int32_t max_pages = 0;
  std::vector<int32_t> page_table, slots;
};

inline Fp8ScatteredPages fp8_scatter_pages(Rng& rng, const std::vector<int32_t>& context_lens, int64_t page_size) {
  int64_t used = 0, most = 0;
  for (const int32_t ctx : context_lens) {
    used += (ctx + page_size - 1) / page_size;
    most = std::max<int64_t>(most, (ctx + page_size - 1) / page_size);
  }
  Fp8ScatteredPages l{.num_pages = used + 2, .max_pages = static_cast<int32_t>(most + 1)};
  std::vector<int32_t> pool(static_cast<size_t>(l.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  size_t next = 0;
  for (const int32_t ctx : context_lens) {
    const int64_t pages = (ctx + page_size - 1) / page_size;
    const size_t first = l.page_table.size();
    for (int32_t p = 0; p < l.max_pages; ++p) {
      l.page_table.push_back(p < pages ? pool[next++] : (p % 2 == 0 ? -1 : static_cast<int32_t>(l.num_pages + 5)));
    }
    for (int32_t j = 0; j < ctx; ++j) {
      l.slots.push_back(static_cast<int32_t>(l.page_table[first + j / page_size] * page_size + j % page_size));
    }
  }
  return l;
}

// MLA prefill over an FP8 cache at DeepSeek's dims (rank 512, rope 64, q/k head 128 + 64, v head 128), bfloat16:
// sequence s has queries[s] new tokens at the end of context_lens[s] cached ones (chunked prefill over a cached
// prefix when fewer). Every context's latents go into the 0xff-poisoned cache through mla_cache_write.
inline void add_mla_prefill_fp8(CaseRegistry& r, int64_t heads, int64_t page_size, std::vector<int32_t> context_lens,
                                std::vector<int32_t> queries, uint64_t seed) {
  constexpr int64_t kRank = 512, kRope = 64, kDim = kRank + kRope, kNope = 128, kQk = 192, kV = 128;
  const LatentFp8Layout layout{.rank = kRank, .rope_dim = kRope};
  Rng rng(seed);
  const auto seqs = static_cast<int32_t>(context_lens.size());
  const Fp8ScatteredPages pages = fp8_scatter_pages(rng, context_lens, page_size);
  std::vector<int32_t> query_start(1, 0);
  for (int32_t s = 0; s < seqs; ++s) query_start.push_back(query_start.back() + queries[s]);
  const auto cached = static_cast<int64_t>(pages.slots.size());
  const int64_t tokens = query_start.back();
  const std::vector<float> latents = round_to(DType::kBF16, rng.uniform(cached * kDim));
  const std::vector<float> q = round_to(DType::kBF16, rng.uniform(tokens * heads * kQk));
  const float w_range = static_cast<float>(std::sqrt(3.0 / double(kRank)));
  const std::vector<float> kv_b = round_to(DType::kBF16, rng.uniform(heads * (kNope + kV) * kRank, -w_range, w_range));
  const int32_t max_context = context_lens.empty() ? 0 : *std::max_element(context_lens.begin(), context_lens.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(kQk));
  std::string lens;
  for (int32_t s = 0; s < seqs; ++s) lens += str_cat("_", queries[s], "of", context_lens[s]);
  r.add({.op = OpKind::kMlaPrefill,
         .name = str_cat("mla_prefill_fp8_h", heads, "_ps", page_size, "_q", lens),
         .run = [=](OpRunner& run) -> Outputs {
           const auto bf16 = [&](Shape shape, const std::vector<float>& v) {
             return run.upload(activation_tensor(run, DType::kBF16, shape, v));
           };
           const TensorView cache =
               run.upload(fp8_cache_filled(pages.num_pages, page_size, layout, 0xff), Access::kReadWrite);
           run.backend().mla_cache_write({.latent = bf16({cached, kDim}, latents), .cache = cache,
                                          .slot_mapping = run.upload(HostTensor::i32({cached}, pages.slots)),
                                          .kv_lora_rank = kRank});
           const AttentionMetadata meta{
               .query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)),
               .context_lens = run.upload(HostTensor::i32({seqs}, context_lens)),
               .page_table = run.upload(HostTensor::i32({seqs, pages.max_pages}, pages.page_table)),
               .num_seqs = seqs, .max_pages_per_seq = pages.max_pages, .max_context_len = max_context,
               .total_context_len = std::accumulate(context_lens.begin(), context_lens.end(), int64_t{0})};
           const TensorView out =
               run.output({tokens, heads, kV}, run.device() == Device::kCpu ? DType::kF32 : DType::kBF16);
           run.backend().mla_prefill({.q = bf16({tokens, heads, kQk}, q), .cache = cache,
                                      .kv_b = bf16({heads * (kNope + kV), kRank}, kv_b), .out = out, .meta = meta,
                                      .kv_lora_rank = kRank, .qk_nope_head_dim = kNope, .v_head_dim = kV,
                                      .softmax_scale = scale});
           return {{"out", run.fetch(out)}, {"cache_bytes", byte_values(run.download(cache)), Compare::kExact}};
         },
         .tolerance = 1e-2});
}

// Every FP8 cache case, for the CUDA backend against the CPU: the cache write and mla_prepare in both activation
// dtypes, mla_prefill in bfloat16 (its kernels' type).
inline void add_mla_fp8_cache_cases(CaseRegistry& r, uint64_t seed) {
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    // odd token counts; one-token, odd and 64-token pages; DeepSeek's rows (656 bytes, no padding), a partial
    // group with padded rows, two groups the second partial, none
    add_mla_cache_write_fp8(r, dtype, 3, 64, 512, 64, 101, seed++);
    add_mla_cache_write_fp8(r, dtype, 9, 7, 512, 64, 37, seed++);
    add_mla_cache_write_fp8(r, dtype, 11, 1, 512, 64, 5, seed++);
    add_mla_cache_write_fp8(r, dtype, 4, 7, 9, 4, 13, seed++);
    add_mla_cache_write_fp8(r, dtype, 2, 64, 200, 8, 33, seed++);
    add_mla_cache_write_fp8(r, dtype, 2, 7, 512, 64, 0, seed++);
    add_mla_prepare_fp8_cases(r, dtype, dtype == DType::kBF16 ? 1e-2 : 1e-5, seed);
    seed += 100;
  }
  // V2-Lite's 16 heads and V3's 128; full prompts and chunked prefill over a cached prefix, a sequence without
  // queries, context 1; pages of 64 and 7.
  add_mla_prefill_fp8(r, 16, 64, {70, 65, 1, 200}, {70, 9, 1, 130}, seed++);
  add_mla_prefill_fp8(r, 16, 7, {100, 33}, {100, 17}, seed++);
  add_mla_prefill_fp8(r, 128, 64, {300, 64}, {300, 1}, seed++);
  add_mla_prefill_fp8(r, 128, 7, {130, 9}, {40, 9}, seed++);
  add_mla_prefill_fp8(r, 16, 64, {50, 20, 130}, {0, 20, 65}, seed++);
}

}  // namespace deepinfer::op_test
