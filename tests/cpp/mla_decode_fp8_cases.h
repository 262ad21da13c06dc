// MLA decode over the FP8 latent cache (backend/ops/latent_fp8.h): the paged cache built on the host, and the op
// cases a device backend runs against the CPU reference (registered from cuda_backend_test.cpp).
//
// The cache bytes are made on the host by quantize_latent_fp8_row from random latents whose 128-value groups span
// several binades (so the scales differ from group to group and from row to row) and hold zeros and values small
// enough to get subnormal codes. Every byte no context row owns is 0xff: NaN as an e4m3 code, as a bf16 and as a
// float32, so a read of an unused page, of a slot past the context or of a row not written yet shows as NaN. Both
// backends get the same bytes as a kF8E4M3 tensor [pages, page_size, 656] and so decode the same values; they differ
// only as the bf16 cases do (the GPU's bf16 probabilities and output, the fp32 summation order), hence the bf16
// cases' tolerance of 1e-2. The queries (and W_UV) are bf16-rounded; the CPU gets them in float32, as in every
// harness case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "backend/ops/latent_fp8.h"
#include "core/half.h"
#include "mla_prepare_cases.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {

inline constexpr int64_t kFp8DecodeRank = 512, kFp8DecodeRope = 64, kFp8DecodeDim = kFp8DecodeRank + kFp8DecodeRope;

// One latent row (c_kv | k_pe) to quantize: each c_kv group of 128 is uniform in +-2^e with e in [-6, 3] drawn per
// group, with a zero every 31 values and a value 10^-4 of the group's range every 29 (a subnormal code); k_pe is
// uniform in [-1, 1] and bf16-rounded (the layout keeps it in bf16).
inline std::vector<float> random_fp8_latent(Rng& rng) {
  std::vector<float> row = rng.uniform(kFp8DecodeDim);
  for (int64_t g = 0; g < kFp8DecodeRank / LatentFp8Layout::kGroup; ++g) {
    const float range = std::ldexp(1.0f, rng.integer(-6, 3));
    for (int64_t i = g * LatentFp8Layout::kGroup; i < (g + 1) * LatentFp8Layout::kGroup; ++i) {
      float& v = row[static_cast<size_t>(i)];
      v *= range;
      if (i % 31 == 7) v = 0.0f;
      if (i % 29 == 3) v *= 1e-4f;
    }
  }
  for (int64_t i = kFp8DecodeRank; i < kFp8DecodeDim; ++i) {
    row[static_cast<size_t>(i)] = bf16_to_float(float_to_bf16(row[static_cast<size_t>(i)]));
  }
  return row;
}

// A paged FP8 cache: the sequences' contexts on shuffled pages (3 spare pages stay unused); page-table entries past
// a sequence's pages hold -1 or an out-of-range id.
struct Fp8PagedCache {
  LatentFp8Layout layout{.rank = kFp8DecodeRank, .rope_dim = kFp8DecodeRope};
  int64_t num_pages = 0, page_size = 0;
  int32_t max_pages = 0, max_context = 0;
  std::vector<int32_t> context_lens, page_table;  // page_table: [seqs, max_pages]
  std::vector<int32_t> slots;    // the cache slot of every context position, sequence after sequence
  std::vector<bool> written;     // per position: quantized into `bytes` (false: left to the step's write)
  std::vector<uint8_t> bytes;    // [num_pages, page_size, row_bytes]

  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  int64_t row_bytes() const { return layout.row_bytes(); }
  Shape shape() const { return {num_pages, page_size, row_bytes()}; }
  HostTensor tensor() const { return HostTensor::from_raw(shape(), DType::kF8E4M3, bytes.data()); }
  std::vector<int32_t> query_start() const {
    std::vector<int32_t> starts(static_cast<size_t>(num_seqs()) + 1);
    std::iota(starts.begin(), starts.end(), 0);
    return starts;
  }

  // The same cache in bfloat16 ([num_pages, page_size, 576] bit patterns): each written row dequantized, which is
  // exact (every value of the layout is a bf16), every other row NaN.
  std::vector<uint16_t> dequantized_bf16() const {
    std::vector<uint16_t> out(static_cast<size_t>(num_pages * page_size * kFp8DecodeDim), 0xffff);
    std::vector<float> row(kFp8DecodeDim);
    for (size_t j = 0; j < slots.size(); ++j) {
      if (!written[j]) continue;
      const auto slot = static_cast<size_t>(slots[j]);
      dequantize_latent_fp8_row({bytes.data() + slot * row_bytes(), static_cast<size_t>(row_bytes())}, layout, row);
      for (size_t i = 0; i < row.size(); ++i) out[slot * kFp8DecodeDim + i] = float_to_bf16(row[i]);
    }
    return out;
  }
};

// The contexts' rows quantized at scattered pages, but the newest `unwritten` of each sequence (left as poison).
inline Fp8PagedCache make_fp8_paged_cache(Rng& rng, const std::vector<int32_t>& context_lens, int64_t page_size,
                                          int32_t unwritten = 0) {
  Fp8PagedCache c{.num_pages = 0, .page_size = page_size, .context_lens = context_lens};
  int64_t used_pages = 0, max_needed = 0;
  for (const int32_t ctx : context_lens) {
    used_pages += (ctx + page_size - 1) / page_size;
    max_needed = std::max<int64_t>(max_needed, (ctx + page_size - 1) / page_size);
    c.max_context = std::max(c.max_context, ctx);
  }
  c.num_pages = used_pages + 3;
  c.max_pages = static_cast<int32_t>(max_needed + 2);
  std::vector<int32_t> pool(static_cast<size_t>(c.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  c.page_table.resize(context_lens.size() * static_cast<size_t>(c.max_pages));
  c.bytes.assign(static_cast<size_t>(c.num_pages * page_size * c.row_bytes()), uint8_t{0xff});
  size_t next_page = 0;
  for (size_t s = 0; s < context_lens.size(); ++s) {
    const int64_t pages = (context_lens[s] + page_size - 1) / page_size;
    int32_t* table = &c.page_table[s * static_cast<size_t>(c.max_pages)];
    for (int32_t p = 0; p < c.max_pages; ++p) {
      table[p] = p < pages ? pool[next_page++] : (p % 2 == 0 ? -1 : static_cast<int32_t>(c.num_pages + 7));
    }
    for (int32_t j = 0; j < context_lens[s]; ++j) {
      const auto slot = static_cast<int32_t>(table[j / page_size] * page_size + j % page_size);
      const bool write = j < context_lens[s] - unwritten;
      const std::vector<float> latent = random_fp8_latent(rng);
      c.slots.push_back(slot);
      c.written.push_back(write);
      if (write) {
        quantize_latent_fp8_row(latent, c.layout,
                                {c.bytes.data() + static_cast<size_t>(slot) * c.row_bytes(),
                                 static_cast<size_t>(c.row_bytes())});
      }
    }
  }
  return c;
}

// How an FP8 decode case runs.
struct MlaDecodeFp8Case {
  // A decode step's order: the cache holds every row but each sequence's newest, which mla_prepare writes (the
  // step's token, normalized, rotated and quantized) right before mla_decode, so the backend's launch ledger lets
  // the decode copy the other rows before its wait (fresh_rows 1): a kernel that read the newest row before its wait
  // would see the poison. The newest rows' c_kv are +-1 and the norm weights e4m3 values, so that every backend's
  // normalized value, float32 or bf16-rounded, quantizes to the same code.
  bool step_write = false;
  // Between mla_prepare and mla_decode, an op that lets the decode start early beside mla_prepare (the model's W_UK:
  // a head_linear at decode sizes).
  bool early_op_between = false;
  // The op applies the value projection (MlaDecodeArgs::w_uv, random [H, 128, 512]) and returns its output: at batch
  // 1 with splits the combine runs inside W_UV's kernel (the decode defers it).
  bool project = false;
};

// Absorbed MLA decode over the FP8 cache at DeepSeek's dims; q [S, H, 576] is given directly (q_latent | q_pe). The
// inputs are made inside `run`, from the seed: every backend gets the same, and registering the cases costs nothing.
inline void add_mla_decode_fp8(CaseRegistry& r, int64_t heads, int64_t page_size, std::vector<int32_t> context_lens,
                               uint64_t seed, MlaDecodeFp8Case how = {}) {
  std::string lens;
  for (const int32_t ctx : context_lens) lens += str_cat("_", ctx);
  r.add({.op = OpKind::kMlaDecode,
         .name = str_cat("mla_decode_fp8_h", heads, "_ps", page_size, "_ctx", lens, how.step_write ? "_step_write" : "",
                         how.early_op_between ? "_early_op_between" : "", how.project ? "_w_uv" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           constexpr int64_t kV = 128;
           Rng rng(seed);
           const Fp8PagedCache c = make_fp8_paged_cache(rng, context_lens, page_size, how.step_write ? 1 : 0);
           const int32_t seqs = c.num_seqs();
           const std::vector<float> q = round_to(DType::kBF16, rng.uniform(seqs * heads * kFp8DecodeDim));
           const float w_range = std::sqrt(3.0f / static_cast<float>(kFp8DecodeRank));
           const std::vector<float> w_uv =
               how.project ? round_to(DType::kBF16, rng.uniform(heads * kV * kFp8DecodeRank, -w_range, w_range))
                           : std::vector<float>();
           // The step write's operands: each sequence's newest row (c_kv +-1, k_pe random), slot and position, q_pe
           // for q_abs's rope columns, norm weights among the e4m3 values of [0.5, 1.5].
           std::vector<float> step_rows, step_norm;
           std::vector<int32_t> step_slots, positions;
           for (int32_t s = 0, j0 = 0; s < seqs; j0 += context_lens[static_cast<size_t>(s)], ++s) {
             step_slots.push_back(c.slots[static_cast<size_t>(j0 + context_lens[static_cast<size_t>(s)] - 1)]);
             positions.push_back(context_lens[static_cast<size_t>(s)] - 1);
             for (int64_t i = 0; i < kFp8DecodeRank; ++i) step_rows.push_back(rng.integer(0, 1) == 0 ? -1.0f : 1.0f);
             const std::vector<float> k_pe = round_to(DType::kBF16, rng.uniform(kFp8DecodeRope));
             step_rows.insert(step_rows.end(), k_pe.begin(), k_pe.end());
           }
           for (int64_t i = 0; i < kFp8DecodeRank; ++i) {
             const int32_t k = rng.integer(0, 12);  // 0.5 + k / 16 below 1, 1 + (k - 8) / 8 from 1: e4m3 values
             const float w = k < 8 ? 0.5f + static_cast<float>(k) / 16.0f : 1.0f + static_cast<float>(k - 8) / 8.0f;
             step_norm.push_back(w);
           }
           const std::vector<float> q_pe = round_to(DType::kBF16, rng.uniform(seqs * heads * kFp8DecodeRope));

           const auto act = [&](Shape shape, const std::vector<float>& v, Access access = Access::kReadOnly) {
             return run.upload(activation_tensor(run, DType::kBF16, shape, v), access);
           };
           const DType act_dtype = run.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
           const TensorView cache = run.upload(c.tensor(), how.step_write ? Access::kReadWrite : Access::kReadOnly);
           const AttentionMetadata meta{.query_start = run.upload(HostTensor::i32({seqs + 1}, c.query_start())),
                                        .context_lens = run.upload(HostTensor::i32({seqs}, context_lens)),
                                        .page_table = run.upload(HostTensor::i32({seqs, c.max_pages}, c.page_table)),
                                        .num_seqs = seqs, .max_pages_per_seq = c.max_pages,
                                        .max_context_len = c.max_context};
           // The step write puts q_pe's rotation into q's rope columns.
           const TensorView q_dev =
               act({seqs, heads, kFp8DecodeDim}, q, how.step_write ? Access::kReadWrite : Access::kReadOnly);
           const TensorView out = run.output({seqs, heads, kFp8DecodeRank}, act_dtype);
           ConstTensorView w_uv_dev;
           TensorView out_v;
           if (how.project) {
             w_uv_dev = act({heads, kV, kFp8DecodeRank}, w_uv);
             out_v = run.output({seqs, heads, kV}, act_dtype);
           }
           // Every input is uploaded before the first op: an upload waits for the device (DeviceMemory).
           TensorView step_latent, step_q_pe, early_x, early_w, early_out;
           ConstTensorView step_slot_mapping, step_positions, norm, freqs;
           if (how.step_write) {
             step_latent = act({seqs, kFp8DecodeDim}, step_rows, Access::kReadWrite);
             step_q_pe = act({seqs, heads, kFp8DecodeRope}, q_pe, Access::kReadWrite);
             step_slot_mapping = run.upload(HostTensor::i32({seqs}, step_slots));
             step_positions = run.upload(HostTensor::i32({seqs}, positions));
             norm = run.upload(HostTensor::f32({kFp8DecodeRank}, step_norm));
             freqs = run.upload(HostTensor::f32({kFp8DecodeRope / 2}, rope_inv_freq(kFp8DecodeRope)));
           }
           if (how.early_op_between) {
             early_x = act({1, 1, 64}, std::vector<float>(64, 0.5f));
             early_w = act({1, 16, 64}, std::vector<float>(16 * 64, 0.25f));
             early_out = run.output({1, 1, 16}, act_dtype);
           }
           if (how.step_write) {
             run.backend().mla_prepare({.latent = step_latent, .q = step_q_pe, .q_abs = q_dev, .cache = cache,
                                        .slot_mapping = step_slot_mapping, .positions = step_positions,
                                        .kv_a_norm = norm, .inv_freq = freqs, .kv_lora_rank = kFp8DecodeRank});
           }
           if (how.early_op_between) run.backend().head_linear({.x = early_x, .w = early_w, .out = early_out});
           run.backend().mla_decode({.q = q_dev, .cache = cache, .out_latent = out, .meta = meta,
                                     .kv_lora_rank = kFp8DecodeRank, .softmax_scale = 1.0f / std::sqrt(192.0f),
                                     .w_uv = w_uv_dev, .out = out_v});
           if (how.project) return {{"out", run.fetch(out_v)}};  // out_latent is the op's scratch then
           return {{"out_latent", run.fetch(out)}};
         },
         .tolerance = 1e-2});
}

// The FP8 cases: V2-Lite's 16 heads (one head block), 32, and V3's 128 (eight head blocks of the FP8 kernel); pages
// of 64, 16, 7 and 1 tokens; contexts of 1, page- and tile-aligned and not, and long ones that split (1000: one tile
// a split at batch 1; 5000); several sequences; the step's newest row written by mla_prepare right before (fresh_rows
// 1), also with an op between that lets the decode start early; W_UV at batch 1 with splits (the combine deferred
// into W_UV's kernel), many splits, several sequences (the combine kernel), one split.
inline void add_mla_decode_fp8_cases(CaseRegistry& r, uint64_t seed) {
  add_mla_decode_fp8(r, 16, 64, {1, 64, 65, 130, 1000}, seed + 0);
  add_mla_decode_fp8(r, 16, 16, {17, 33, 5}, seed + 1);
  add_mla_decode_fp8(r, 32, 7, {40, 3, 130}, seed + 2);
  add_mla_decode_fp8(r, 128, 64, {5, 300, 2049}, seed + 3);
  add_mla_decode_fp8(r, 16, 64, {5000}, seed + 4);
  add_mla_decode_fp8(r, 128, 64, {5000, 1}, seed + 5);
  add_mla_decode_fp8(r, 16, 1, {9, 2, 700}, seed + 6);
  add_mla_decode_fp8(r, 32, 16, {1000, 64, 1}, seed + 7);
  const MlaDecodeFp8Case step{.step_write = true};
  add_mla_decode_fp8(r, 16, 64, {1, 64, 65, 130, 1000}, seed + 10, step);
  add_mla_decode_fp8(r, 128, 64, {5, 300, 2049}, seed + 11, step);
  add_mla_decode_fp8(r, 16, 16, {17, 33, 5}, seed + 12, step);
  add_mla_decode_fp8(r, 16, 64, {64, 130, 5000}, seed + 13, step);
  add_mla_decode_fp8(r, 32, 7, {40, 3}, seed + 14, step);
  add_mla_decode_fp8(r, 16, 1, {9, 2}, seed + 15, step);
  const MlaDecodeFp8Case project{.project = true};
  add_mla_decode_fp8(r, 16, 64, {1000}, seed + 20, project);
  add_mla_decode_fp8(r, 16, 64, {5000}, seed + 21, project);
  add_mla_decode_fp8(r, 16, 64, {1, 64, 65, 130, 1000}, seed + 22, project);
  add_mla_decode_fp8(r, 16, 16, {17}, seed + 23, project);
  add_mla_decode_fp8(r, 128, 64, {5, 300, 2049}, seed + 24, project);
  add_mla_decode_fp8(r, 32, 7, {40, 3}, seed + 25, project);
  const MlaDecodeFp8Case model_order{.step_write = true, .early_op_between = true, .project = true};
  add_mla_decode_fp8(r, 16, 64, {1000}, seed + 30, model_order);
  add_mla_decode_fp8(r, 16, 64, {1, 64, 65, 130, 1000}, seed + 31, model_order);
  add_mla_decode_fp8(r, 128, 64, {5, 300, 2049}, seed + 32, {.step_write = true, .early_op_between = true});
}

}  // namespace deepinfer::op_test
