// The FP8 MLA decode kernel (backend/cuda/mla/mla_decode_fp8_kernel.cuh) on its own, without the CPU reference.
//   On a GPU (the *Cuda* tests): the FP8 kernel on an FP8 cache against the bf16 narrow kernel on the same cache
//   dequantized. The widening is exact, so the two differ only by the order of their fp32 sums (the k-halves split the
//   dims differently, and the FP8 QK step visits a block's dims in another order): an output may differ by one bf16
//   rounding, and nearly all are bit-equal. Both run with the same split count, with and without the early start
//   (fresh_rows), and with the combine deferred (the partials the next kernel would read).
//   On the host: the widening's bit arithmetic against core/fp8.h's table for every code, the test cache's builder,
//   the split count and the workspace (the op sizes the workspace with the count the launcher then uses), and the
//   launcher's checks.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/mla/mla_decode.cuh"
#include "backend/cuda/mla/mla_decode_fp8_widen.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "cuda_device_required.h"
#include "device_memory.h"
#include "mla_decode_fp8_cases.h"

namespace deepinfer::op_test {
namespace {

using cuda::MlaDecodeKernel;
using cuda::MlaDecodeParams;
namespace md = cuda::mla_detail;

// ---------------------------------------------------------------------------------------------------------------
// Host: the widening

// Half `half` (0 low, 1 high) of a bf16x2 word as a float.
float half_value(uint32_t word, int half) { return bf16_to_float(static_cast<uint16_t>(word >> (16 * half))); }

// The value widen_e4m3x4 gives the code in byte `byte` of `word`, times 2^120.
float widened(uint32_t word, int byte) {
  const md::WidenedE4m3x4 w = md::widen_e4m3x4(word);
  return half_value(byte % 2 == 0 ? w.even : w.odd, byte / 2) * md::kE4m3WidenScale;
}

TEST(MlaDecodeFp8Widen, EveryCodeInEveryByteGivesItsValue) {
  const uint32_t filler = 0x5a3c91e4u;  // other codes beside it, which must not leak into its bits
  for (uint32_t code = 0; code < 256; ++code) {
    for (int byte = 0; byte < 4; ++byte) {
      const uint32_t word = (filler & ~(0xffu << (8 * byte))) | (code << (8 * byte));
      const float got = widened(word, byte);
      if ((code & 0x7fu) == 0x7fu) {  // the NaN codes come out as +-480 (documented in the header)
        EXPECT_EQ(got, code == 0x7fu ? 480.0f : -480.0f) << "code " << code;
        continue;
      }
      const float want = e4m3_to_float(static_cast<uint8_t>(code));
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))  // -0 and subnormals included
          << "code 0x" << std::hex << code << " in byte " << byte << ": got " << got << ", want " << want;
    }
  }
}

// The kernel multiplies the widened codes by 2^120 * scale in bf16, which is exact when the product is a bf16 value:
// for every finite code and every scale from 2^-124 (a subnormal code times it still has its bits in bf16) to 2^7
// (2^127, the largest bf16 power of two, is the factor then). latent_fp8_scale goes below 2^-124 only for groups
// whose largest magnitude is under 448 * 2^-125.
TEST(MlaDecodeFp8Widen, PowerOfTwoScalesKeepEveryCodeExact) {
  for (int e = -124; e <= 7; ++e) {
    const float scale = std::ldexp(1.0f, e);
    const float factor = scale * md::kE4m3WidenScale;
    ASSERT_EQ(bf16_to_float(float_to_bf16(factor)), factor) << "2^120 * 2^" << e << " is no bf16";
    for (uint32_t code = 0; code < 256; ++code) {
      if ((code & 0x7fu) == 0x7fu) continue;
      const float product = (widened(code, 0) / md::kE4m3WidenScale) * factor;  // exact in float32
      EXPECT_EQ(product, e4m3_to_float(static_cast<uint8_t>(code)) * scale) << "code " << code << ", 2^" << e;
      EXPECT_EQ(bf16_to_float(float_to_bf16(product)), product) << "code " << code << " * 2^" << e << " is no bf16";
    }
  }
  EXPECT_EQ(latent_fp8_scale(448.0f * std::ldexp(1.0f, -124)), std::ldexp(1.0f, -124));
}

// QK's k permutation: the query's A registers (pack_low_halves / pack_high_halves of its two dimension-order words)
// meet the codes' even and odd words dim by dim, so the mma's sum over its k positions is the four dims' dot
// product. And V's words, stored as widened (even, odd), hold the columns in the order 0 2 1 3 that store_output's
// exchange expects.
TEST(MlaDecodeFp8Widen, QueryPairsMeetTheirCodesAndVIsInWidenOrder) {
  const float qv[4] = {1.0f, -2.0f, 3.0f, 0.5f};
  const uint8_t codes[4] = {float_to_e4m3(1.5f), float_to_e4m3(-0.25f), float_to_e4m3(6.0f), float_to_e4m3(-3.0f)};
  const uint32_t q01 = float_to_bf16(qv[0]) | (uint32_t{float_to_bf16(qv[1])} << 16);
  const uint32_t q23 = float_to_bf16(qv[2]) | (uint32_t{float_to_bf16(qv[3])} << 16);
  const uint32_t a_even = md::pack_low_halves(q01, q23), a_odd = md::pack_high_halves(q01, q23);
  const uint32_t word = codes[0] | (uint32_t{codes[1]} << 8) | (uint32_t{codes[2]} << 16) | (uint32_t{codes[3]} << 24);
  const md::WidenedE4m3x4 w = md::widen_e4m3x4(word);
  float mma_sum = 0.0f, dot = 0.0f;
  for (int h = 0; h < 2; ++h) {
    mma_sum += half_value(a_even, h) * half_value(w.even, h) + half_value(a_odd, h) * half_value(w.odd, h);
  }
  for (int i = 0; i < 4; ++i) dot += qv[i] * e4m3_to_float(codes[i]);
  EXPECT_EQ(mma_sum * md::kE4m3WidenScale, dot);
  const float stored[4] = {half_value(w.even, 0), half_value(w.even, 1), half_value(w.odd, 0), half_value(w.odd, 1)};
  const int column[4] = {0, 2, 1, 3};  // V's bf16 positions 0..3 hold these columns
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(stored[i] * md::kE4m3WidenScale, e4m3_to_float(codes[column[i]])) << "position " << i;
  }
}

// The test cache (mla_decode_fp8_cases.h): written rows hold varied scales and subnormal codes and widen to finite
// values; a row left to the step's write, the slots past a context and the spare pages are all 0xff (NaN).
TEST(MlaDecodeFp8Cache, HostBuilderWritesTheContextsAndPoisonsTheRest) {
  Rng rng(7);
  const Fp8PagedCache c = make_fp8_paged_cache(rng, {5, 70, 1}, 16, /*unwritten=*/1);
  const auto row_bytes = static_cast<size_t>(c.row_bytes());
  ASSERT_EQ(row_bytes, 656u);
  ASSERT_EQ(c.slots.size(), 76u);
  std::vector<bool> owned(static_cast<size_t>(c.num_pages * c.page_size), false);
  std::vector<float> scales;
  int64_t subnormal_codes = 0;
  for (size_t j = 0; j < c.slots.size(); ++j) {
    const auto slot = static_cast<size_t>(c.slots[j]);
    owned[slot] = c.written[j];
    const uint8_t* row = c.bytes.data() + slot * row_bytes;
    if (!c.written[j]) continue;
    for (int i = 0; i < kFp8DecodeRank; ++i) subnormal_codes += (row[i] & 0x78) == 0 && (row[i] & 0x07) != 0 ? 1 : 0;
    for (int g = 0; g < 4; ++g) {
      float scale;
      std::memcpy(&scale, row + kFp8DecodeRank + 4 * g, 4);
      scales.push_back(scale);
    }
  }
  EXPECT_EQ(std::count(c.written.begin(), c.written.end(), false), 3);  // each sequence's newest row
  EXPECT_GT(subnormal_codes, 0);
  std::sort(scales.begin(), scales.end());
  EXPECT_GE(std::unique(scales.begin(), scales.end()) - scales.begin(), 6) << "scales from group to group";
  const std::vector<uint16_t> bf16 = c.dequantized_bf16();
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    const uint8_t* row = c.bytes.data() + slot * row_bytes;
    const bool poisoned = std::all_of(row, row + row_bytes, [](uint8_t b) { return b == 0xff; });
    EXPECT_EQ(poisoned, !owned[slot]) << "slot " << slot;
    for (int i = 0; i < kFp8DecodeDim; ++i) {
      const float v = bf16_to_float(bf16[slot * kFp8DecodeDim + static_cast<size_t>(i)]);
      if (std::isfinite(v) != owned[slot]) {
        ADD_FAILURE() << "slot " << slot << " value " << i << ": " << v;
        break;
      }
    }
  }
  for (int32_t s = 0; s < c.num_seqs(); ++s) {  // pages in range for the contexts, out-of-range ids after them
    const int32_t pages = (c.context_lens[static_cast<size_t>(s)] + 15) / 16;
    for (int32_t p = 0; p < c.max_pages; ++p) {
      const int32_t page = c.page_table[static_cast<size_t>(s * c.max_pages + p)];
      EXPECT_EQ(page >= 0 && page < c.num_pages, p < pages) << "sequence " << s << " page " << p;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host: split count, workspace and the launcher's checks

alignas(16) const uint8_t kFp8Operand[64] = {};     // never read: the counts and checks look at pointers only
alignas(16) const uint16_t kBf16Operand[64] = {};

// The FP8 kernel has 16 heads a CTA whatever the head count, so its split count (and the workspace the op sizes with
// it) is the bf16 narrow kernel's, not the 64-head wide kernels' that bf16 picks for V3's 128 heads.
TEST(MlaDecodeFp8Splits, CountsAsTheNarrowKernelForEveryHeadCount) {
  for (const int32_t heads : {16, 32, 128}) {
    for (const int32_t batch : {1, 4, 64}) {
      for (const int32_t context : {1, 64, 65, 1000, 8192, 32768}) {
        SCOPED_TRACE(str_cat(heads, " heads, batch ", batch, ", context ", context));
        const MlaDecodeParams fp8{.cache_fp8 = kFp8Operand, .batch = batch, .num_heads = heads,
                                  .max_context_len = context, .num_sms = 132};
        const MlaDecodeParams narrow{.cache = kBf16Operand, .batch = batch, .num_heads = heads,
                                     .max_context_len = context, .num_sms = 132, .kernel = MlaDecodeKernel::kNarrow};
        EXPECT_EQ(cuda::mla_decode_num_splits(fp8), cuda::mla_decode_num_splits(narrow));
        EXPECT_EQ(cuda::mla_decode_workspace_bytes(fp8), cuda::mla_decode_workspace_bytes(narrow));
        MlaDecodeParams forced = fp8;  // the tuning record's forced count, capped at one split a tile
        forced.forced_splits = 7;
        EXPECT_EQ(cuda::mla_decode_num_splits(forced), context > 64 ? std::min(7, (context + 63) / 64) : 1);
      }
    }
  }
  // V3's 128 heads at batch 1, 8k: eight head blocks fill the GPU with fewer splits than two would.
  const MlaDecodeParams fp8{.cache_fp8 = kFp8Operand, .batch = 1, .num_heads = 128, .max_context_len = 8192,
                            .num_sms = 132};
  const MlaDecodeParams wide{.cache = kBf16Operand, .batch = 1, .num_heads = 128, .max_context_len = 8192,
                             .num_sms = 132};
  EXPECT_LT(cuda::mla_decode_num_splits(fp8), cuda::mla_decode_num_splits(wide));
}

// Each call below fails one check; the checks come before any launch, so this runs without a device (a call that
// passed them would fail on the launch instead, with another message).
TEST(MlaDecodeFp8Params, TheLauncherTakesOneCacheAndTheKernelOfItsFormat) {
  alignas(16) static uint16_t q[64], out[64];
  static int32_t table[1], lens[1];
  const MlaDecodeParams ok{.q = q, .cache_fp8 = kFp8Operand, .page_table = table, .context_lens = lens, .out = out,
                           .batch = 1, .num_heads = 16, .page_size = 64, .max_pages_per_seq = 1,
                           .max_context_len = 1, .num_splits = 1};
  const auto rejected = [](MlaDecodeParams p, const char* expected) {
    try {
      cuda::mla_decode(p, {});
      ADD_FAILURE() << "accepted; expected an error about '" << expected << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  MlaDecodeParams p = ok;
  p.cache = kBf16Operand;
  rejected(p, "exactly one of cache");
  p = ok;
  p.cache_fp8 = nullptr;
  rejected(p, "exactly one of cache");
  for (const MlaDecodeKernel bf16_kernel : {MlaDecodeKernel::kNarrow, MlaDecodeKernel::kWide,
                                            MlaDecodeKernel::kWideWgmma}) {
    p = ok;
    p.num_heads = 64;
    p.kernel = bf16_kernel;
    rejected(p, "does not read the FP8 cache");
  }
  p = ok;
  p.cache_fp8 = nullptr;
  p.cache = kBf16Operand;
  p.kernel = MlaDecodeKernel::kNarrowFp8;
  rejected(p, "does not read the bf16 cache");
  p = ok;
  p.cache_fp8 = kFp8Operand + 8;
  rejected(p, "16-byte aligned");
  p = ok;
  p.num_heads = 24;
  rejected(p, "multiple of 16");
}

// ---------------------------------------------------------------------------------------------------------------
// GPU: the FP8 kernel against the bf16 kernel on the dequantized cache

// One bf16 rounding step at the magnitude of v (2^-7 of its binade).
double bf16_ulp(double v) {
  const double a = std::abs(v);
  return a == 0.0 ? 0.0 : std::ldexp(1.0, std::ilogb(a) - 7);
}

// Every value finite on both sides, within one bf16 rounding of each other plus 2^-9 of the largest (a probability
// rounded to bf16 the other way), and at least 90% bit-equal.
void expect_same_up_to_order(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0.0;
  for (const double v : ref) max_ref = std::max(max_ref, std::abs(v));
  size_t equal = 0, reported = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      if (reported++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", bf16 kernel " << ref[i];
      continue;
    }
    equal += got[i] == ref[i] ? 1 : 0;
    const double allowed = bf16_ulp(std::max(std::abs(got[i]), std::abs(ref[i]))) + std::ldexp(max_ref, -9);
    if (std::abs(got[i] - ref[i]) > allowed && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", bf16 kernel " << ref[i] << " (allowed "
                    << allowed << ", max |ref| " << max_ref << ")";
    }
  }
  EXPECT_GE(static_cast<double>(equal), 0.9 * static_cast<double>(ref.size()))
      << what << ": " << equal << " of " << ref.size() << " bit-equal";
}

struct DirectCase {
  int32_t heads = 16;
  int64_t page_size = 64;
  std::vector<int32_t> context_lens;
};

TEST(CudaMlaDecodeFp8, MatchesTheBf16KernelOnTheDequantizedCache) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  int device = 0, num_sms = 0;
  CUDA_TRY(cudaGetDevice(&device));
  CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  // V2-Lite's 16 heads with a zero context, one row, tile edges and splits; 32 and V3's 128 heads; pages of 16, 7, 1.
  const DirectCase cases[] = {{16, 64, {0, 1, 64, 65, 130, 1000, 5000}}, {32, 16, {1000, 3, 130}},
                              {128, 64, {5, 300, 2049}},                  {128, 64, {5000}},
                              {16, 7, {40, 3, 700}},                      {16, 1, {9, 2, 130}},
                              {16, 64, {5000}}};
  uint64_t seed = 900;
  for (const DirectCase& dc : cases) {
    Rng rng(seed++);
    const Fp8PagedCache c = make_fp8_paged_cache(rng, dc.context_lens, dc.page_size);
    const int32_t seqs = c.num_seqs(), heads = dc.heads;
    const std::vector<uint16_t> bf16_cache = c.dequantized_bf16();
    const std::vector<float> q = rng.uniform(seqs * heads * kFp8DecodeDim);
    DeviceMemory memory;
    OpRunner run(memory);
    cuda::CudaStream stream;
    const ConstTensorView fp8_dev = run.upload(c.tensor());
    const ConstTensorView bf16_dev = run.upload(HostTensor::from_raw({c.num_pages, c.page_size, kFp8DecodeDim},
                                                                     DType::kBF16, bf16_cache.data()));
    const ConstTensorView q_dev = run.upload(HostTensor::bf16({seqs, heads, kFp8DecodeDim}, q));
    const ConstTensorView table = run.upload(HostTensor::i32({seqs, c.max_pages}, c.page_table));
    const ConstTensorView lens = run.upload(HostTensor::i32({seqs}, c.context_lens));
    const MlaDecodeParams fp8{.q = q_dev.as<uint16_t>(), .cache_fp8 = fp8_dev.as<uint8_t>(),
                              .page_table = table.as<int32_t>(), .context_lens = lens.as<int32_t>(),
                              .batch = seqs, .num_heads = heads, .page_size = static_cast<int32_t>(c.page_size),
                              .max_pages_per_seq = c.max_pages, .max_context_len = c.max_context,
                              .num_sms = num_sms, .softmax_scale = 1.0f / std::sqrt(192.0f)};
    MlaDecodeParams bf16 = fp8;
    bf16.cache_fp8 = nullptr;
    bf16.cache = bf16_dev.as<uint16_t>();
    bf16.kernel = MlaDecodeKernel::kNarrow;  // the same 16-head blocks, hence the same splits of the same tiles
    const int heuristic = cuda::mla_decode_num_splits(fp8);
    ASSERT_EQ(heuristic, cuda::mla_decode_num_splits(bf16));
    for (const int splits : {heuristic, 1, 3}) {
      for (const int32_t fresh_rows : {-1, 0, 1}) {
        for (const int32_t defer : {0, 1}) {
          if (defer == 1 && splits == 1) continue;  // one split writes the output: nothing to defer
          const std::string what = str_cat(heads, " heads, pages of ", c.page_size, ", ", splits,
                                           " splits, fresh rows ", fresh_rows, defer == 1 ? ", deferred" : "");
          SCOPED_TRACE(what);
          const auto run_kernel = [&](MlaDecodeParams p, TensorView out, TensorView workspace) {
            p.out = out.as<uint16_t>();
            p.workspace = workspace.data;
            p.num_splits = splits;
            p.fresh_rows = fresh_rows;
            p.defer_combine = defer;
            cuda::mla_decode(p, {stream.get()});
          };
          const Shape out_shape{seqs, heads, kFp8DecodeRank};
          const size_t workspace_bytes =
              cuda::mla_decode_workspace_bytes({.batch = seqs, .num_heads = heads, .num_splits = splits});
          const auto workspace_floats = static_cast<int64_t>(std::max<size_t>(workspace_bytes, 16) / 4);
          const TensorView out_fp8 = run.output(out_shape, DType::kBF16);
          const TensorView out_bf16 = run.output(out_shape, DType::kBF16);
          const TensorView ws_fp8 = run.output({workspace_floats}, DType::kF32);
          const TensorView ws_bf16 = run.output({workspace_floats}, DType::kF32);
          run_kernel(fp8, out_fp8, ws_fp8);
          run_kernel(bf16, out_bf16, ws_bf16);
          if (defer == 0) {
            expect_same_up_to_order(run.fetch(out_fp8), run.fetch(out_bf16), what + ": out");
            continue;
          }
          // Deferred: out untouched (still the NaN fill), the partials and log-sum-exps in the workspace. An empty
          // split writes its lse (-inf) and no partial.
          for (const double v : run.fetch(out_fp8)) ASSERT_TRUE(std::isnan(v)) << "the deferred decode wrote out";
          const std::vector<double> w_fp8 = run.fetch(ws_fp8), w_bf16 = run.fetch(ws_bf16);
          const size_t rows = static_cast<size_t>(seqs) * heads, lse0 = static_cast<size_t>(splits) * rows * 512;
          std::vector<double> part_fp8, part_bf16;
          for (size_t k = 0; k < static_cast<size_t>(splits) * rows; ++k) {
            const double l_fp8 = w_fp8[lse0 + k], l_bf16 = w_bf16[lse0 + k];
            ASSERT_EQ(std::isinf(l_fp8), std::isinf(l_bf16)) << "split x row " << k << ": lse " << l_fp8 << " vs "
                                                             << l_bf16;
            if (std::isinf(l_fp8)) continue;
            EXPECT_NEAR(l_fp8, l_bf16, 1e-3) << "lse of split x row " << k;
            part_fp8.insert(part_fp8.end(), w_fp8.begin() + k * 512, w_fp8.begin() + (k + 1) * 512);
            part_bf16.insert(part_bf16.end(), w_bf16.begin() + k * 512, w_bf16.begin() + (k + 1) * 512);
          }
          double max_ref = 0.0, max_err = 0.0;
          for (size_t i = 0; i < part_bf16.size(); ++i) {
            ASSERT_TRUE(std::isfinite(part_fp8[i]) && std::isfinite(part_bf16[i])) << "partial " << i;
            max_ref = std::max(max_ref, std::abs(part_bf16[i]));
            max_err = std::max(max_err, std::abs(part_fp8[i] - part_bf16[i]));
          }
          EXPECT_LE(max_err, 2e-3 * max_ref) << "partials: max |difference| " << max_err << ", max |ref| " << max_ref;
        }
      }
    }
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
