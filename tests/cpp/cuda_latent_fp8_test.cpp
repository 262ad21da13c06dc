// The CUDA side of the FP8 latent cache (backend/ops/latent_fp8.h) on its own, without the CPU backend:
//   - host-only: the kernels' arithmetic (backend/cuda/mla/latent_fp8_math.h), compiled for the host, against the
//     host reference it must match bit for bit (latent_fp8_scale, float_to_e4m3, float_to_bf16, e4m3_to_float), and
//     the launchers' layout checks (latent_fp8_rows.h);
//   - GPU (the *Cuda* tests): the cache write's rows byte for byte against quantize_latent_fp8_row of the same
//     values, special values included; the prefill gather's widened rows against dequantize_latent_fp8_row; the fused
//     mla_prepare into an FP8 cache (the latent, q and q_abs as into a bf16 cache, bit for bit, and each cache row the
//     quantization of its latent row); mla_prefill over FP8 rows against mla_prefill over their widened bf16 values,
//     bit for bit.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla/latent_fp8_math.h"
#include "backend/cuda/mla/latent_fp8_rows.h"
#include "backend/cuda/mla/mla_cache_write.cuh"
#include "backend/cuda/mla/mla_prefill.cuh"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/ops/latent_fp8.h"
#include "core/fp8.h"
#include "core/half.h"
#include "device_memory.h"
#include "mla_fp8_cache_cases.h"
#include "op_test_harness.h"

namespace deepinfer::op_test {
namespace {

float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits_of(float v) { return std::bit_cast<uint32_t>(v); }

// Floats spread over every exponent and sign: a stride through all 2^32 bit patterns, plus the patterns around each
// binade's ends.
std::vector<float> float_sweep(uint32_t stride) {
  std::vector<float> v;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += stride) v.push_back(float_of(static_cast<uint32_t>(bits)));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t mantissa : {0u, 1u, 2u, 0x400000u, 0x7ffffeu, 0x7fffffu}) {
        v.push_back(float_of(sign | exponent << 23 | mantissa));
      }
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Host-only: the kernels' arithmetic and the layout checks

TEST(LatentFp8KernelMath, GroupScaleIsTheHostRule) {
  std::vector<float> amaxes = float_sweep(4099);
  for (int k = -140; k <= 127; ++k) {  // 448 * 2^k and its neighbours: where the scale steps
    const float edge = std::ldexp(448.0f, k);
    for (const float v : {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, INFINITY)}) amaxes.push_back(v);
  }
  for (const float amax : amaxes) {
    ASSERT_EQ(bits_of(cuda::latent_fp8_group_scale(amax)), bits_of(latent_fp8_scale(amax)))
        << "amax " << amax << " (bits " << std::hex << bits_of(amax) << ")";
  }
}

TEST(LatentFp8KernelMath, InverseScaleIsExact) {
  for (int k = -126; k <= 127; ++k) {
    const float scale = std::ldexp(1.0f, k);
    EXPECT_EQ(cuda::latent_fp8_inverse_scale(scale), std::ldexp(1.0f, -k)) << "2^" << k;
  }
}

TEST(LatentFp8KernelMath, CodesRoundAsTheHostDoes) {
  std::vector<float> values = float_sweep(4099);
  // Every value of the code range and the midpoints between neighbouring codes (the ties), each with its neighbours.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(code)), hi = e4m3_to_float(static_cast<uint8_t>(code + 1));
    for (const float x : {lo, 0.5f * (lo + hi), 0.5f * (448.0f + 512.0f), 464.0f}) {
      for (const float v : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
        values.push_back(v);
        values.push_back(-v);
      }
    }
  }
  for (const float v : values) {
    ASSERT_EQ(int{cuda::latent_fp8_code(v)}, int{float_to_e4m3(v)})
        << "value " << v << " (bits " << std::hex << bits_of(v) << ")";
  }
}

TEST(LatentFp8KernelMath, Bf16BitsAreTheHostRounding) {
  std::vector<float> values = float_sweep(4099);
  for (uint32_t high = 0; high < 65536; high += 7) {  // the ties and their neighbours under many high halves
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) values.push_back(float_of(high << 16 | low));
  }
  for (const float v : values) {
    ASSERT_EQ(cuda::latent_fp8_bf16_bits(v), float_to_bf16(v)) << "bits " << std::hex << bits_of(v);
  }
}

TEST(LatentFp8KernelMath, CodePairsWidenToTheirValues) {
  for (uint32_t pair = 0; pair < 65536; ++pair) {
    const float2 got = cuda::latent_fp8_values(static_cast<uint16_t>(pair));
    const float lo = e4m3_to_float(static_cast<uint8_t>(pair & 0xff)), hi = e4m3_to_float(static_cast<uint8_t>(pair >> 8));
    const auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b); };
    ASSERT_TRUE(same(lo, got.x) && same(hi, got.y)) << "codes " << std::hex << pair;
  }
}

ConstTensorView fake_cache(DType dtype, Shape shape) {  // shapes only: the checks never read the data
  return {nullptr, dtype, shape, Device::kCuda};
}

TEST(LatentFp8CacheChecks, AcceptsTheLayoutAndGivesItsOffsets) {
  const LatentFp8Layout deepseek =
      cuda::checked_fp8_latent_layout(fake_cache(DType::kF8E4M3, {3, 64, 656}), 512, 64, "test");
  const cuda::LatentFp8RowParams p = cuda::fp8_row_params(deepseek);
  EXPECT_EQ(p.rank, 512);
  EXPECT_EQ(p.rope_dim, 64);
  EXPECT_EQ(p.scales_offset, 512);
  EXPECT_EQ(p.rope_offset, 528);
  EXPECT_EQ(p.row_bytes, 656);
  // Padded rows: rank 9 (one partial group) and rope 4 take 9 + 4 + 8 = 21 bytes, 32 with the padding.
  const LatentFp8Layout odd = cuda::checked_fp8_latent_layout(fake_cache(DType::kF8E4M3, {2, 7, 32}), 9, 4, "test");
  const cuda::LatentFp8RowParams q = cuda::fp8_row_params(odd);
  EXPECT_EQ(q.scales_offset, 9);
  EXPECT_EQ(q.rope_offset, 13);
  EXPECT_EQ(q.row_bytes, 32);
  for (const auto& [rank, rope] : {std::pair<int64_t, int64_t>{200, 8}, {1000, 16}, {1536, 16}, {2048, 64}}) {
    const LatentFp8Layout l{.rank = rank, .rope_dim = rope};
    const cuda::LatentFp8RowParams r =
        cuda::fp8_row_params(cuda::checked_fp8_latent_layout(fake_cache(DType::kF8E4M3, {1, 1, l.row_bytes()}),
                                                              rank, rope, "test"));
    EXPECT_EQ(r.scales_offset, l.scales_offset()) << rank;
    EXPECT_EQ(r.rope_offset, l.rope_offset()) << rank;
    EXPECT_EQ(r.row_bytes, l.row_bytes()) << rank;
  }
}

TEST(LatentFp8CacheChecks, RejectsOtherRowsAndRanks) {
  const auto check = [](ConstTensorView cache, int64_t rank, int64_t rope) {
    cuda::checked_fp8_latent_layout(cache, rank, rope, "test");
  };
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {3, 64, 672}), 512, 64), Error);   // one 16-byte chunk too many
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {3, 64, 656}), 512, 32), Error);   // rope 32: 592 bytes
  EXPECT_THROW(check(fake_cache(DType::kBF16, {3, 64, 576}), 512, 64), Error);     // not an FP8 cache
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {64, 656}), 512, 64), Error);      // not [pages, page_size, bytes]
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {3, 64, 656}), 0, 576), Error);    // no kv_lora_rank given
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {3, 64, 656}), 512, -1), Error);
  // 17 groups: past the kernels' shared amax array, declined rather than wrong.
  const LatentFp8Layout wide{.rank = 2049, .rope_dim = 64};
  EXPECT_THROW(check(fake_cache(DType::kF8E4M3, {1, 1, wide.row_bytes()}), 2049, 64), UnsupportedOp);
}

// ---------------------------------------------------------------------------------------------------------------
// GPU

// Latents for the byte-for-byte checks: fp8_test_latents' groups of many magnitudes, with special values in the first
// tokens' first groups (the launcher's rank is at least 9 here):
//   token 1: amax 448 (scale 1), ties between two codes (1.0625, 1.1875, 17, 2^-10, 3 * 2^-10), -0, a negative value
//            that rounds to -0;
//   token 2: amax 452, just past 448 (scale 2), and, with a second group, 896 = 448 * 2 exactly (scale 2, code 448);
//   token 3: a NaN (code 0x7f, not counted in the amax) and an infinity (amax inf: scale 1, code 448) in c_kv, and a
//            NaN with a payload and -inf in k_pe.
std::vector<float> special_latents(Rng& rng, int64_t tokens, const LatentFp8Layout& layout) {
  std::vector<float> v = fp8_test_latents(rng, tokens, layout);
  const int64_t dim = layout.rank + layout.rope_dim;
  const auto row = [&](int64_t t) { return v.data() + t * dim; };
  if (tokens > 1) {
    const float ties[] = {448.0f, 1.0625f, 1.1875f, 17.0f, 0x1p-10f, 0x1.8p-9f, -0.0f, -0x1p-11f};
    std::copy(std::begin(ties), std::end(ties), row(1));
  }
  if (tokens > 2) {
    row(2)[0] = 452.0f;
    if (layout.rank > LatentFp8Layout::kGroup) row(2)[LatentFp8Layout::kGroup] = 896.0f;
  }
  if (tokens > 3) {
    row(3)[0] = std::numeric_limits<float>::quiet_NaN();
    row(3)[1] = -INFINITY;
    if (layout.rope_dim >= 2) {
      row(3)[layout.rank] = float_of(0xff800001u);  // a negative signaling NaN
      row(3)[layout.rank + 1] = -INFINITY;
    }
  }
  return v;
}

// The values a device tensor of `dtype` holds for `values` (bf16: rounded, as HostTensor::bf16 stores them).
std::vector<float> as_stored(DType dtype, const std::vector<float>& values) {
  std::vector<float> out = values;
  if (dtype == DType::kBF16) {
    for (float& x : out) x = bf16_to_float(float_to_bf16(x));
  }
  return out;
}

HostTensor activations(DType dtype, Shape shape, const std::vector<float>& values) {
  return dtype == DType::kBF16 ? HostTensor::bf16(shape, values) : HostTensor::f32(shape, values);
}

// The first differing byte of two caches, as "row r, byte b: got x, expected y", or empty when they are equal.
std::string first_difference(const HostTensor& got, const std::vector<uint8_t>& want, int64_t row_bytes) {
  if (got.bytes.size() != want.size()) return str_cat(got.bytes.size(), " bytes, expected ", want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto g = std::to_integer<uint8_t>(got.bytes[i]);
    if (g != want[i]) {
      return str_cat("row ", static_cast<int64_t>(i) / row_bytes, ", byte ", static_cast<int64_t>(i) % row_bytes,
                     ": got ", int{g}, ", expected ", int{want[i]});
    }
  }
  return {};
}

// The cache write's FP8 rows are quantize_latent_fp8_row of the same values, byte for byte, for bf16 and float32
// latents: DeepSeek's dims, a partial group with padding, a partial second group, rank 1536; pages of 1, 7 and 64; odd
// token counts. The launcher is called directly (no backend, no CPU). The first token's slot is -1 and the last
// one's the cache size: both skipped, so their rows, like every row no token names, keep the 0xff poison.
TEST(CudaLatentFp8Cache, WriteIsTheHostQuantizationByteForByte) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  struct Dims {
    int64_t rank, rope, pages, page_size, tokens;
  };
  const Dims all[] = {{512, 64, 3, 64, 101}, {512, 64, 40, 1, 37}, {512, 64, 9, 7, 45},
                      {9, 4, 4, 7, 13},      {200, 8, 2, 64, 33},  {1536, 16, 2, 7, 11}};
  uint64_t seed = 7000;
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Dims& d : all) {
      SCOPED_TRACE(str_cat(dtype_name(dtype), " rank ", d.rank, " rope ", d.rope, ", ", d.tokens, " tokens on ",
                           d.pages, " pages of ", d.page_size));
      const LatentFp8Layout layout{.rank = d.rank, .rope_dim = d.rope};
      const int64_t dim = d.rank + d.rope, num_slots = d.pages * d.page_size;
      Rng rng(seed++);
      const std::vector<float> latent = as_stored(dtype, special_latents(rng, d.tokens, layout));
      std::vector<int32_t> slots(static_cast<size_t>(num_slots));
      std::iota(slots.begin(), slots.end(), 0);
      rng.shuffle(slots);
      slots.resize(static_cast<size_t>(d.tokens));
      slots.front() = -1;
      slots.back() = static_cast<int32_t>(num_slots);
      // Expected: the poison, then each written row quantized on the host.
      std::vector<uint8_t> want(static_cast<size_t>(num_slots * layout.row_bytes()), 0xff);
      for (int64_t t = 0; t < d.tokens; ++t) {
        if (slots[t] < 0 || slots[t] >= num_slots) continue;
        quantize_latent_fp8_row(std::span<const float>(latent).subspan(t * dim, dim), layout,
                                std::span<uint8_t>(want).subspan(slots[t] * layout.row_bytes(), layout.row_bytes()));
      }
      DeviceMemory memory;
      OpRunner run(memory);
      const TensorView cache = run.upload(fp8_cache_filled(d.pages, d.page_size, layout, 0xff), Access::kReadWrite);
      const cuda::CudaStream stream;
      cuda::mla_cache_write({.latent = run.upload(activations(dtype, {d.tokens, dim}, latent)),
                             .cache = cache,
                             .slot_mapping = run.upload(HostTensor::i32({d.tokens}, slots)),
                             .kv_lora_rank = d.rank},
                            {stream.get()});
      stream.synchronize();
      EXPECT_EQ(first_difference(run.download(cache), want, layout.row_bytes()), "");
      for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
    }
  }
}

// Sequences' contexts as FP8 rows on scattered pages, built on the host (quantize_latent_fp8_row of bf16 latents of
// many magnitudes; the other rows 0xff), the latent rows they widen to (dequantize_latent_fp8_row, exact in bf16)
// and the same rows as a bf16 cache.
struct Fp8Contexts {
  Fp8ScatteredPages pages;
  HostTensor fp8_cache, bf16_cache;
  std::vector<float> widened;  // [sum of contexts, 576]: sequence after sequence, the gather's workspace rows
};

Fp8Contexts fp8_contexts(Rng& rng, const std::vector<int32_t>& context_lens, int64_t page_size) {
  const LatentFp8Layout layout{.rank = cuda::kMlaPrefillRank, .rope_dim = cuda::kMlaPrefillRope};
  const int64_t dim = layout.rank + layout.rope_dim;
  Fp8Contexts c{.pages = fp8_scatter_pages(rng, context_lens, page_size), .fp8_cache = {}, .bf16_cache = {},
                .widened = {}};
  const auto rows = static_cast<int64_t>(c.pages.slots.size()), num_slots = c.pages.num_pages * page_size;
  const std::vector<float> latents = as_stored(DType::kBF16, fp8_test_latents(rng, rows, layout));
  std::vector<uint8_t> fp8(static_cast<size_t>(num_slots * layout.row_bytes()), 0xff);
  std::vector<float> bf16(static_cast<size_t>(num_slots * dim), std::numeric_limits<float>::quiet_NaN());
  c.widened.resize(static_cast<size_t>(rows * dim));
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t slot = c.pages.slots[j];
    const std::span<uint8_t> row = std::span<uint8_t>(fp8).subspan(slot * layout.row_bytes(), layout.row_bytes());
    quantize_latent_fp8_row(std::span<const float>(latents).subspan(j * dim, dim), layout, row);
    dequantize_latent_fp8_row(row, layout, std::span<float>(c.widened).subspan(j * dim, dim));
    std::copy_n(c.widened.begin() + j * dim, dim, bf16.begin() + slot * dim);
  }
  c.fp8_cache = HostTensor::from_raw({c.pages.num_pages, page_size, layout.row_bytes()}, DType::kF8E4M3, fp8.data());
  c.bf16_cache = HostTensor::bf16({c.pages.num_pages, page_size, dim}, bf16);
  return c;
}

// The gather over FP8 rows writes each context row widened exactly: the bf16 of dequantize_latent_fp8_row, bit for
// bit. A sequence without queries is skipped (its workspace rows keep their NaN fill). The launcher is called directly.
TEST(CudaLatentFp8Cache, PrefillGatherWidensEachRowExactly) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  struct Batch {
    std::vector<int32_t> context_lens, queries;
    int64_t page_size;
  };
  const Batch batches[] = {{{70, 65, 1, 200}, {70, 9, 1, 130}, 64}, {{100, 33}, {100, 17}, 7}, {{50, 20, 130}, {0, 20, 65}, 1}};
  uint64_t seed = 7100;
  for (const Batch& b : batches) {
    SCOPED_TRACE(str_cat(b.context_lens.size(), " sequences, pages of ", b.page_size));
    Rng rng(seed++);
    const Fp8Contexts c = fp8_contexts(rng, b.context_lens, b.page_size);
    const auto seqs = static_cast<int32_t>(b.context_lens.size());
    const int64_t dim = cuda::kMlaPrefillRank + cuda::kMlaPrefillRope;
    const auto rows = static_cast<int64_t>(c.pages.slots.size());
    std::vector<int32_t> query_start(1, 0);
    for (const int32_t n : b.queries) query_start.push_back(query_start.back() + n);
    std::vector<uint16_t> want(static_cast<size_t>(rows * dim), 0x7fc0);  // the output's NaN fill
    int64_t first = 0;
    for (int32_t s = 0; s < seqs; ++s) {
      for (int64_t i = 0; i < b.context_lens[s] * dim && b.queries[s] > 0; ++i) {
        want[first * dim + i] = float_to_bf16(c.widened[first * dim + i]);
      }
      first += b.context_lens[s];
    }
    DeviceMemory memory;
    OpRunner run(memory);
    const TensorView latents = run.output({rows, dim}, DType::kBF16);
    const cuda::CudaStream stream;
    cuda::mla_prefill_gather(
        {.cache_fp8 = run.upload(c.fp8_cache).as<uint8_t>(),
         .page_table = run.upload(HostTensor::i32({seqs, c.pages.max_pages}, c.pages.page_table)).as<int32_t>(),
         .context_lens = run.upload(HostTensor::i32({seqs}, b.context_lens)).as<int32_t>(),
         .query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)).as<int32_t>(),
         .latents = latents.as<uint16_t>(),
         .num_seqs = seqs,
         .page_size = static_cast<int32_t>(b.page_size),
         .max_pages_per_seq = c.pages.max_pages,
         .max_context_len = *std::max_element(b.context_lens.begin(), b.context_lens.end())},
        {stream.get()});
    stream.synchronize();
    const HostTensor got = run.download(latents);
    std::vector<uint16_t> got_bits(want.size());
    std::memcpy(got_bits.data(), got.bytes.data(), got.bytes.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got_bits[i], want[i]) << "workspace row " << static_cast<int64_t>(i) / dim << ", column "
                                      << static_cast<int64_t>(i) % dim;
    }
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

// mla_prepare into an FP8 cache leaves the latent, q and q_abs exactly as into a cache of elements (bf16 and float32,
// V2-Lite's and V3's heads, a padding token whose slot is -1), and writes each token's row as quantize_latent_fp8_row
// of its latent row as the op returned it; rows no token names keep the 0xff poison. Rank 1536 runs the 512-thread
// block. Through the backend (its argument checks must take an FP8 cache).
TEST(CudaLatentFp8Cache, PrepareKeepsTheLatentAndCachesItsQuantization) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  struct Dims {
    int64_t heads, nope, rope, rank;
  };
  const Dims all[] = {{16, 128, 64, 512}, {128, 128, 64, 512}, {2, 8, 16, 1536}};
  uint64_t seed = 7200;
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Dims& d : all) {
      SCOPED_TRACE(str_cat(dtype_name(dtype), ", ", d.heads, " heads, rank ", d.rank));
      const int64_t tokens = 9, decode = 3, qk = d.nope + d.rope, ld = d.rank + d.rope, page_size = 7, pages = 4;
      const LatentFp8Layout layout{.rank = d.rank, .rope_dim = d.rope};
      Rng rng(seed++);
      const HostTensor latent = activations(dtype, {tokens, ld}, rng.uniform(tokens * ld, -3.0f, 3.0f));
      const HostTensor q = activations(dtype, {tokens, d.heads, qk}, rng.uniform(tokens * d.heads * qk));
      const HostTensor q_abs = activations(dtype, {decode, d.heads, ld}, rng.uniform(decode * d.heads * ld));
      const HostTensor element_cache =
          activations(dtype, {pages, page_size, ld}, rng.uniform(pages * page_size * ld));
      const std::vector<int32_t> slots = {3, 27, 0, 14, -1, 8, 21, 6, 15};  // -1: a padding token, not written
      std::vector<int32_t> positions(static_cast<size_t>(tokens));
      for (int32_t& p : positions) p = rng.integer(0, 163839);
      const std::vector<float> norm = rng.uniform(d.rank, 0.5f, 1.5f), inv_freq = rope_inv_freq(d.rope);
      DeviceMemory memory;
      OpRunner run(*cuda, memory);
      const auto make_args = [&](const HostTensor& cache) -> MlaPrepareArgs {
        return {.latent = run.upload(latent, Access::kReadWrite), .q = run.upload(q, Access::kReadWrite),
                .q_abs = run.upload(q_abs, Access::kReadWrite), .cache = run.upload(cache, Access::kReadWrite),
                .slot_mapping = run.upload(HostTensor::i32({tokens}, slots)),
                .positions = run.upload(HostTensor::i32({tokens}, positions)),
                .kv_a_norm = run.upload(HostTensor::f32({d.rank}, norm)),
                .inv_freq = run.upload(HostTensor::f32({d.rope / 2}, inv_freq)), .kv_lora_rank = d.rank,
                .eps = 1e-6f, .attention_scaling = 1.1f, .interleaved = true};
      };
      const MlaPrepareArgs fp8 = make_args(fp8_cache_filled(pages, page_size, layout, 0xff));
      const MlaPrepareArgs elements = make_args(element_cache);
      cuda->mla_prepare(fp8);
      cuda->mla_prepare(elements);
      const HostTensor latent_out = run.download(fp8.latent);
      EXPECT_EQ(latent_out.bytes, run.download(elements.latent).bytes) << "latent";
      EXPECT_EQ(run.download(fp8.q).bytes, run.download(elements.q).bytes) << "q";
      EXPECT_EQ(run.download(fp8.q_abs).bytes, run.download(elements.q_abs).bytes) << "q_abs";
      const std::vector<double> latent_values = latent_out.to_double();
      std::vector<uint8_t> want(static_cast<size_t>(pages * page_size * layout.row_bytes()), 0xff);
      std::vector<float> row(static_cast<size_t>(ld));
      for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        std::copy_n(latent_values.begin() + t * ld, ld, row.begin());
        quantize_latent_fp8_row(row, layout,
                                std::span<uint8_t>(want).subspan(slots[t] * layout.row_bytes(), layout.row_bytes()));
      }
      EXPECT_EQ(first_difference(run.download(fp8.cache), want, layout.row_bytes()), "");
      for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
    }
  }
}

// mla_prefill over FP8 rows is mla_prefill over the bf16 rows they widen to, bit for bit: the gather's output is the
// only difference, and it is exact. V2-Lite's and V3's heads; full prompts, chunked prefill over a cached prefix, a
// sequence without queries; pages of 64 and 7. Through the backend (its argument checks must take an FP8 cache).
TEST(CudaLatentFp8Cache, PrefillOverFp8RowsIsPrefillOverTheirWidenedValues) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  struct Batch {
    int64_t heads;
    std::vector<int32_t> context_lens, queries;
    int64_t page_size;
  };
  const Batch batches[] = {{16, {70, 65, 1, 200}, {70, 9, 1, 130}, 64},
                           {128, {300, 64}, {300, 1}, 7},
                           {16, {50, 20, 130}, {0, 20, 65}, 7}};
  constexpr int64_t kRank = 512, kNope = 128, kQk = 192, kV = 128;
  uint64_t seed = 7300;
  for (const Batch& b : batches) {
    SCOPED_TRACE(str_cat(b.heads, " heads, pages of ", b.page_size));
    Rng rng(seed++);
    const Fp8Contexts c = fp8_contexts(rng, b.context_lens, b.page_size);
    const auto seqs = static_cast<int32_t>(b.context_lens.size());
    std::vector<int32_t> query_start(1, 0);
    for (const int32_t n : b.queries) query_start.push_back(query_start.back() + n);
    const int64_t tokens = query_start.back();
    const float w_range = static_cast<float>(std::sqrt(3.0 / double(kRank)));
    const HostTensor q = HostTensor::bf16({tokens, b.heads, kQk}, rng.uniform(tokens * b.heads * kQk));
    const HostTensor kv_b =
        HostTensor::bf16({b.heads * (kNope + kV), kRank}, rng.uniform(b.heads * (kNope + kV) * kRank, -w_range, w_range));
    DeviceMemory memory;
    OpRunner run(*cuda, memory);
    const AttentionMetadata meta{
        .query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)),
        .context_lens = run.upload(HostTensor::i32({seqs}, b.context_lens)),
        .page_table = run.upload(HostTensor::i32({seqs, c.pages.max_pages}, c.pages.page_table)),
        .num_seqs = seqs, .max_pages_per_seq = c.pages.max_pages,
        .max_context_len = *std::max_element(b.context_lens.begin(), b.context_lens.end()),
        .total_context_len = std::accumulate(b.context_lens.begin(), b.context_lens.end(), int64_t{0})};
    const ConstTensorView q_dev = run.upload(q), kv_b_dev = run.upload(kv_b);
    const auto prefill = [&](const HostTensor& cache) {
      const TensorView out = run.output({tokens, b.heads, kV}, DType::kBF16);
      cuda->mla_prefill({.q = q_dev, .cache = run.upload(cache), .kv_b = kv_b_dev, .out = out, .meta = meta,
                         .kv_lora_rank = kRank, .qk_nope_head_dim = kNope, .v_head_dim = kV,
                         .softmax_scale = 1.0f / std::sqrt(static_cast<float>(kQk))});
      return run.download(out).bytes;
    };
    EXPECT_EQ(prefill(c.fp8_cache), prefill(c.bf16_cache));
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
