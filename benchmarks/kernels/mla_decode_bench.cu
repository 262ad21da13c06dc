// MLA decode (absorbed, paged latent cache): correctness against the CPU reference, then a microbenchmark beside the
// measured ceilings (device-to-device copy bandwidth; the bf16 tensor-core peak is quoted, not measured).
//
// usage: mla_decode_bench [--json PATH] [--quick] [--fp8]
//   --fp8: the FP8 latent cache too (backend/ops/latent_fp8.h, 656 bytes a token): its kernel checked against the
//          CPU reference on the dequantized values, and every timed shape timed again over an FP8 cache, its
//          bandwidth counted over the FP8 bytes, reported beside the bf16 figures with the speedup.
//   Environment (recorded in the JSON when set): BENCH_COMMIT, BENCH_DATE, BENCH_COMMAND.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/mla/mla_decode.cuh"
#include "backend/ops/latent_fp8.h"
#include "core/half.h"
#include "bench_util.cuh"

namespace deepinfer::bench {
namespace {

using cuda::CudaStream;
using cuda::DeviceBuffer;
using cuda::MlaDecodeKernel;
using cuda::MlaDecodeParams;

constexpr int kRank = 512, kRopeDim = 64, kHeadDim = kRank + kRopeDim;
constexpr int kFp8RowBytes = cuda::kMlaDecodeFp8RowBytes;  // 512 e4m3 codes, 4 float32 scales, 64 bf16 values
constexpr double kBf16PeakTflops = 790.0;  // dense bf16 matrix product measured on this GPU model (not in this run)

const char* kernel_name(MlaDecodeKernel k) {
  switch (k) {
    case MlaDecodeKernel::kAuto: return "auto";
    case MlaDecodeKernel::kNarrow: return "narrow";
    case MlaDecodeKernel::kWide: return "wide";
    case MlaDecodeKernel::kWideWgmma: return "wgmma";
    case MlaDecodeKernel::kNarrowFp8: return "fp8";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------------------------
// Correctness

struct CheckCase {
  int heads = 16;
  std::vector<int> context_lens;
  int page_size = 64;
  float q_scale = 1.0f;              // queries ~ U(-q_scale, q_scale): larger gives peakier softmax
  std::vector<int> splits = {0};     // 0 = heuristic
  MlaDecodeKernel kernel = MlaDecodeKernel::kAuto;
  bool fp8 = false;                  // the cache in the FP8 layout: each row quantized, the reference on its values
};

struct CheckResult {
  std::string name;
  int heads = 0, batch = 0, page_size = 0, splits = 0;
  std::string kernel;
  double error = 0.0;
  int64_t nan_count = 0;
  bool pass = false;
};

std::string case_name(const CheckCase& c) {
  std::string s = std::string(c.fp8 ? "fp8 " : "") + "h" + std::to_string(c.heads) + " ps" +
                  std::to_string(c.page_size) + " ctx[";
  for (size_t i = 0; i < c.context_lens.size(); ++i) s += (i ? "," : "") + std::to_string(c.context_lens[i]);
  return s + "]";
}

std::vector<CheckResult> run_check(const CheckCase& c, std::mt19937_64& rng, cudaStream_t stream, int num_sms) {
  const int batch = static_cast<int>(c.context_lens.size()), heads = c.heads, ps = c.page_size;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  int max_ctx = 0, max_pages = 1, used_pages = 0;
  for (int ctx : c.context_lens) {
    max_ctx = std::max(max_ctx, ctx);
    max_pages = std::max(max_pages, (ctx + ps - 1) / ps + 2);  // spare slots hold out-of-range ids
    used_pages += (ctx + ps - 1) / ps;
  }
  const int num_pages = used_pages + 5;  // unused pages stay poisoned
  // Pages scattered in random order.
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> page_table(static_cast<size_t>(batch) * max_pages);
  std::vector<uint16_t> cache(static_cast<size_t>(num_pages) * ps * kHeadDim, 0x7fc0);  // NaN everywhere
  // The FP8 twin: each written row quantized (and the bf16 row replaced by its dequantized values, which are bf16:
  // the reference then computes on exactly what the FP8 kernel reads); 0xff (NaN) elsewhere.
  const LatentFp8Layout fp8_layout{.rank = kRank, .rope_dim = kRopeDim};
  std::vector<uint8_t> cache_fp8(c.fp8 ? static_cast<size_t>(num_pages) * ps * kFp8RowBytes : 0, 0xff);
  std::vector<float> latent(kHeadDim);
  int next_page = 0;
  for (int b = 0; b < batch; ++b) {
    const int ctx = c.context_lens[b];
    for (int p = 0; p < max_pages; ++p) {
      const bool used = p < (ctx + ps - 1) / ps;
      page_table[static_cast<size_t>(b) * max_pages + p] = used ? perm[next_page++] : num_pages + 1000 + p;
    }
    for (int j = 0; j < ctx; ++j) {
      const int page = page_table[static_cast<size_t>(b) * max_pages + j / ps];
      const size_t slot = static_cast<size_t>(page) * ps + j % ps;
      uint16_t* row = &cache[slot * kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) row[d] = float_to_bf16(unit(rng));
      if (c.fp8) {
        const std::span<uint8_t> bytes(cache_fp8.data() + slot * kFp8RowBytes, kFp8RowBytes);
        for (int d = 0; d < kHeadDim; ++d) latent[d] = bf16_to_float(row[d]);
        quantize_latent_fp8_row(latent, fp8_layout, bytes);
        dequantize_latent_fp8_row(bytes, fp8_layout, latent);
        for (int d = 0; d < kHeadDim; ++d) row[d] = float_to_bf16(latent[d]);
      }
    }
  }
  std::vector<uint16_t> q(static_cast<size_t>(batch) * heads * kHeadDim);
  for (auto& v : q) v = float_to_bf16(c.q_scale * unit(rng));
  const float scale = 1.0f / std::sqrt(192.0f) * 1.3f;

  // The CPU reference on the same (bf16-rounded) values in fp32: q is [batch, heads, 576] = q_latent then q_pe.
  std::vector<float> q_f(q.size());
  for (size_t i = 0; i < q.size(); ++i) q_f[i] = bf16_to_float(q[i]);
  std::vector<float> cache_f(cache.size());
  for (size_t i = 0; i < cache.size(); ++i) cache_f[i] = bf16_to_float(cache[i]);
  std::vector<float> ref(static_cast<size_t>(batch) * heads * kRank, 0.0f);
  std::vector<int32_t> query_start(batch + 1);
  std::iota(query_start.begin(), query_start.end(), 0);
  MlaDecodeArgs args{
      .q = ConstTensorView(q_f.data(), DType::kF32, Shape{batch, heads, kHeadDim}, Device::kCpu),
      .cache = ConstTensorView(cache_f.data(), DType::kF32, Shape{num_pages, ps, kHeadDim}, Device::kCpu),
      .out_latent = TensorView{ref.data(), DType::kF32, Shape{batch, heads, kRank}, Device::kCpu},
      .meta = AttentionMetadata{
          .query_start = ConstTensorView(query_start.data(), DType::kI32, Shape{batch + 1}, Device::kCpu),
          .context_lens = ConstTensorView(c.context_lens.data(), DType::kI32, Shape{batch}, Device::kCpu),
          .page_table = ConstTensorView(page_table.data(), DType::kI32, Shape{batch, max_pages}, Device::kCpu),
          .num_seqs = batch,
          .max_pages_per_seq = max_pages,
          .max_context_len = max_ctx},
      .kv_lora_rank = kRank,
      .softmax_scale = scale,
  };
  cpu::mla_decode(args);
  double ref_max = 0.0;
  for (float v : ref) ref_max = std::max(ref_max, static_cast<double>(std::fabs(v)));

  DeviceBuffer d_q(q.size() * 2, stream), d_cache(cache.size() * 2, stream), d_out(ref.size() * 2, stream);
  DeviceBuffer d_cache_fp8(std::max<size_t>(cache_fp8.size(), 16), stream);
  DeviceBuffer d_table(page_table.size() * 4, stream), d_lens(c.context_lens.size() * 4, stream);
  CUDA_TRY(cudaMemcpyAsync(d_q.data(), q.data(), d_q.bytes(), cudaMemcpyHostToDevice, stream));
  CUDA_TRY(cudaMemcpyAsync(d_cache.data(), cache.data(), d_cache.bytes(), cudaMemcpyHostToDevice, stream));
  if (c.fp8) {
    CUDA_TRY(cudaMemcpyAsync(d_cache_fp8.data(), cache_fp8.data(), cache_fp8.size(), cudaMemcpyHostToDevice, stream));
  }
  CUDA_TRY(cudaMemcpyAsync(d_table.data(), page_table.data(), d_table.bytes(), cudaMemcpyHostToDevice, stream));
  CUDA_TRY(cudaMemcpyAsync(d_lens.data(), c.context_lens.data(), d_lens.bytes(), cudaMemcpyHostToDevice, stream));

  std::vector<CheckResult> results;
  for (int forced_splits : c.splits) {
    MlaDecodeParams p{.q = d_q.as<uint16_t>(), .cache = c.fp8 ? nullptr : d_cache.as<uint16_t>(),
                      .cache_fp8 = c.fp8 ? d_cache_fp8.as<uint8_t>() : nullptr, .page_table = d_table.as<int32_t>(),
                      .context_lens = d_lens.as<int32_t>(), .out = d_out.as<uint16_t>(), .batch = batch,
                      .num_heads = heads, .page_size = ps, .max_pages_per_seq = max_pages, .max_context_len = max_ctx,
                      .num_sms = num_sms, .num_splits = forced_splits, .softmax_scale = scale, .kernel = c.kernel};
    DeviceBuffer workspace(std::max<size_t>(cuda::mla_decode_workspace_bytes(p), 16), stream);
    CUDA_TRY(cudaMemsetAsync(workspace.data(), 0xff, workspace.bytes(), stream));  // NaN: unwritten partials show
    p.workspace = workspace.data();
    CUDA_TRY(cudaMemsetAsync(d_out.data(), 0xff, d_out.bytes(), stream));  // NaN: unwritten outputs show
    cuda::mla_decode(p, {stream});
    std::vector<uint16_t> got(ref.size());
    CUDA_TRY(cudaMemcpyAsync(got.data(), d_out.data(), d_out.bytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    CheckResult r{.name = case_name(c), .heads = heads, .batch = batch, .page_size = ps,
                  .splits = cuda::mla_decode_num_splits(p),
                  .kernel = kernel_name(c.fp8 ? MlaDecodeKernel::kNarrowFp8 : c.kernel)};
    double max_diff = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float v = bf16_to_float(got[i]);
      if (!std::isfinite(v)) {
        ++r.nan_count;
        continue;
      }
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(v - ref[i])));
    }
    r.error = max_diff / std::max(ref_max, 1e-30);
    r.pass = r.nan_count == 0 && r.error <= 1e-2;
    if (!r.pass) {  // where the error sits: per (sequence, 16-head group), per 64-column block
      for (int b = 0; b < batch; ++b) {
        for (int hg = 0; hg < heads / 16; ++hg) {
          std::printf("  seq %d (ctx %d) heads %3d..: ", b, c.context_lens[b], hg * 16);
          for (int cb = 0; cb < kRank / 64; ++cb) {
            double e = 0.0;
            for (int h = hg * 16; h < hg * 16 + 16; ++h) {
              for (int d = cb * 64; d < cb * 64 + 64; ++d) {
                const size_t i = (static_cast<size_t>(b) * heads + h) * kRank + d;
                const float v = bf16_to_float(got[i]);
                e = std::max(e, std::isfinite(v) ? std::fabs(v - ref[i]) / std::max(ref_max, 1e-30) : 99.0);
              }
            }
            std::printf("%8.1e", e);
          }
          std::printf("\n");
          if (hg >= 3) break;
        }
        if (b >= 2) break;
      }
      const size_t i0 = 0;
      std::printf("  out[0,0,0..4] got %g %g %g %g ref %g %g %g %g\n", bf16_to_float(got[i0]), bf16_to_float(got[i0 + 1]),
                  bf16_to_float(got[i0 + 2]), bf16_to_float(got[i0 + 3]), ref[i0], ref[i0 + 1], ref[i0 + 2], ref[i0 + 3]);
    }
    std::printf("check %-44s kernel %-6s splits %3d  err %.3e  nan %lld  %s\n", r.name.c_str(), r.kernel.c_str(),
                r.splits, r.error, static_cast<long long>(r.nan_count), r.pass ? "ok" : "FAIL");
    results.push_back(r);
  }
  return results;
}

// ---------------------------------------------------------------------------------------------------------------
// Timing

__global__ void fill_random_bf16(uint16_t* data, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // U(-1, 1)
    data[i] = static_cast<uint16_t>(__float_as_uint(u) >> 16);
  }
}




// Rows of the FP8 layout: random codes (the NaN codes 0x7f, 0xff moved to 0x7e, 0xfe), scales 2^-4, bf16 k_pe from
// fill_random_bf16's distribution: what a real cache's rows look like to the kernel.
__global__ void fill_random_fp8_rows(uint8_t* data, int64_t rows, uint64_t seed) {
  constexpr int kWords = kFp8RowBytes / 4, kCodeWords = kRank / 4, kScaleWords = kRank / 128;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * kWords;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    uint32_t word = static_cast<uint32_t>(x >> 32);
    const int w = static_cast<int>(i % kWords);
    if (w < kCodeWords) {
      const uint32_t nan_bytes = ((word & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;  // bytes of magnitude 0x7f
      word -= nan_bytes >> 7;  // 0x7f -> 0x7e, 0xff -> 0xfe
    } else if (w < kCodeWords + kScaleWords) {
      word = 0x3d800000u;  // 2^-4
    } else {
      word &= 0xbfffbfffu;  // two bf16 of magnitude below 2
    }
    reinterpret_cast<uint32_t*>(data)[i] = word;
  }
}

enum class CacheFormat : uint8_t { kBf16, kFp8 };

const char* format_name(CacheFormat f) { return f == CacheFormat::kFp8 ? "fp8" : "bf16"; }
int64_t row_bytes(CacheFormat f) { return f == CacheFormat::kFp8 ? kFp8RowBytes : kHeadDim * 2; }

struct PerfResult {
  int heads = 0, batch = 0, context = 0, splits = 0;
  std::string kernel, tag;
  CacheFormat cache = CacheFormat::kBf16;
  double ms = 0.0, bytes = 0.0, flops = 0.0, gbps = 0.0, bw_fraction = 0.0, tflops = 0.0, peak_fraction = 0.0;
};

struct PerfBuffers {
  DeviceBuffer cache, cache_fp8, q, out, table, lens, workspace, flush;  // cache_fp8: with --fp8 only
};

struct PerfCase {
  int heads = 16, batch = 1, context = 1024;
  int splits = 0;  // 0 = heuristic
  MlaDecodeKernel kernel = MlaDecodeKernel::kAuto;
  const char* tag = "main";
  CacheFormat cache = CacheFormat::kBf16;  // kFp8: the FP8 cache and its kernel (`kernel` must be kAuto)
};

PerfResult run_perf(const PerfCase& c, PerfBuffers& buf, std::mt19937_64& rng, cudaStream_t stream, int num_sms,
                    double copy_gbps) {
  const int heads = c.heads, batch = c.batch, context = c.context;
  const int ps = 64, pages_per_seq = (context + ps - 1) / ps, num_pages = batch * pages_per_seq;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // scattered pages
  std::vector<int32_t> lens(batch, context);
  CUDA_TRY(cudaMemcpyAsync(buf.table.data(), perm.data(), perm.size() * 4, cudaMemcpyHostToDevice, stream));
  CUDA_TRY(cudaMemcpyAsync(buf.lens.data(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream));
  const bool fp8 = c.cache == CacheFormat::kFp8;
  MlaDecodeParams p{.q = buf.q.as<uint16_t>(), .cache = fp8 ? nullptr : buf.cache.as<uint16_t>(),
                    .cache_fp8 = fp8 ? buf.cache_fp8.as<uint8_t>() : nullptr, .page_table = buf.table.as<int32_t>(),
                    .context_lens = buf.lens.as<int32_t>(), .out = buf.out.as<uint16_t>(), .batch = batch,
                    .num_heads = heads, .page_size = ps, .max_pages_per_seq = pages_per_seq, .max_context_len = context,
                    .num_sms = num_sms, .num_splits = c.splits, .softmax_scale = 1.0f / std::sqrt(192.0f),
                    .kernel = c.kernel};
  DI_CHECK(cuda::mla_decode_workspace_bytes(p) <= buf.workspace.bytes(), "workspace too small");
  p.workspace = buf.workspace.data();
  const auto flush = [&] {
    read_flush<<<4 * num_sms, 512, 0, stream>>>(buf.flush.as<int4>(), static_cast<int64_t>(buf.flush.bytes() / 16),
                                                 buf.flush.as<int>());
  };
  const double ms = time_ms(stream, 3, 30, [&] { cuda::mla_decode(p, {stream}); }, flush);
  CUDA_TRY(cudaGetLastError());
  PerfResult r{.heads = heads, .batch = batch, .context = context, .splits = cuda::mla_decode_num_splits(p),
               .kernel = kernel_name(fp8 ? MlaDecodeKernel::kNarrowFp8 : c.kernel), .tag = c.tag, .cache = c.cache,
               .ms = ms};
  // The bytes the kernel must move: the context's cache rows in their format, q, out.
  r.bytes = static_cast<double>(batch) * context * static_cast<double>(row_bytes(c.cache)) +
            static_cast<double>(batch) * heads * kHeadDim * 2 + static_cast<double>(batch) * heads * kRank * 2;
  r.flops = 2.0 * batch * heads * static_cast<double>(context) * (kHeadDim + kRank);
  r.gbps = r.bytes / (ms * 1e-3) / 1e9;
  r.bw_fraction = r.gbps / copy_gbps;
  r.tflops = r.flops / (ms * 1e-3) / 1e12;
  r.peak_fraction = r.tflops / kBf16PeakTflops;
  std::printf("perf %-9s %-4s h%-3d b%-3d ctx%-6d %-6s splits %3d %9.1f us  %7.0f GB/s  %5.1f%% of copy  "
              "%6.1f TFLOP/s\n",
              c.tag, format_name(c.cache), heads, batch, context, r.kernel.c_str(), r.splits, ms * 1e3, r.gbps,
              100.0 * r.bw_fraction, r.tflops);
  std::fflush(stdout);
  return r;
}


int run(int argc, char** argv) {
  std::string json_path = "mla_decode_h200.json";
  bool quick = false, fp8 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--fp8") fp8 = true;
  }
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  int num_sms = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  std::printf("device %s, %d SMs, L2 %d MB, smem/block optin %zu KB\n", prop.name, num_sms, prop.l2CacheSize >> 20,
              prop.sharedMemPerBlockOptin >> 10);
  CudaStream stream;
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));

  // 1. Correctness.
  std::vector<CheckCase> cases = {
      {.heads = 16, .context_lens = {1}},
      {.heads = 16, .context_lens = {63, 65, 1000, 1}, .splits = {0, 1, 3}},
      {.heads = 16, .context_lens = {1000, 1, 64, 129, 640, 7, 999, 500}, .q_scale = 4.0f, .splits = {0, 1, 5, 16}},
      {.heads = 16, .context_lens = {4097, 2500}, .page_size = 64, .splits = {0, 1}},
      {.heads = 16, .context_lens = {63, 65, 300}, .page_size = 16, .splits = {0, 2}},
      {.heads = 128, .context_lens = {1}},
      {.heads = 128, .context_lens = {63, 65, 1000}, .q_scale = 4.0f, .splits = {0, 1, 4}},
      {.heads = 128, .context_lens = {1000, 1, 64, 129, 640, 7, 999, 500}, .splits = {0, 1, 7}},
      {.heads = 128, .context_lens = {300, 77}, .page_size = 32, .splits = {0, 3}},
      {.heads = 128, .context_lens = {65, 1000}, .splits = {0, 2}, .kernel = MlaDecodeKernel::kNarrow},
      {.heads = 128, .context_lens = {1000, 1, 64, 129, 640, 7}, .splits = {0, 1, 5}, .kernel = MlaDecodeKernel::kWide},
      {.heads = 128, .context_lens = {2000, 128, 65, 3}, .q_scale = 4.0f, .splits = {0, 1, 2, 40}},
      {.heads = 64, .context_lens = {300, 192}, .page_size = 16, .splits = {0, 1}, .kernel = MlaDecodeKernel::kWide},
      {.heads = 16, .context_lens = {2000, 700, 3, 129}, .page_size = 128, .splits = {0, 1}},
      {.heads = 64, .context_lens = {200, 1}, .splits = {0}},
      {.heads = 32, .context_lens = {200, 33}, .splits = {0, 2}},
      {.heads = 16, .context_lens = {3000}, .splits = {200}},
  };
  if (fp8) {  // the FP8 kernel: 16, 32 and 128 heads (eight 16-head blocks), splits, odd pages, peaky softmax
    const std::vector<CheckCase> fp8_cases = {
        {.heads = 16, .context_lens = {1}, .fp8 = true},
        {.heads = 16, .context_lens = {63, 65, 1000, 1}, .splits = {0, 1, 3}, .fp8 = true},
        {.heads = 16, .context_lens = {1000, 1, 64, 129, 640, 7, 999, 500}, .q_scale = 4.0f, .splits = {0, 1, 16},
         .fp8 = true},
        {.heads = 16, .context_lens = {4097, 2500}, .splits = {0, 1}, .fp8 = true},
        {.heads = 16, .context_lens = {63, 65, 300}, .page_size = 16, .splits = {0, 2}, .fp8 = true},
        {.heads = 16, .context_lens = {200, 9}, .page_size = 7, .splits = {0, 2}, .fp8 = true},
        {.heads = 32, .context_lens = {200, 33}, .splits = {0, 2}, .fp8 = true},
        {.heads = 128, .context_lens = {63, 65, 1000}, .q_scale = 4.0f, .splits = {0, 1, 4}, .fp8 = true},
        {.heads = 128, .context_lens = {2000, 128, 65, 3}, .splits = {0, 40}, .fp8 = true},
        {.heads = 16, .context_lens = {3000}, .splits = {200}, .fp8 = true},
    };
    cases.insert(cases.end(), fp8_cases.begin(), fp8_cases.end());
  }
  std::vector<CheckResult> checks;
  bool all_pass = true;
  for (const auto& c : cases) {
    for (auto& r : run_check(c, rng, stream.get(), num_sms)) {
      all_pass = all_pass && r.pass;
      checks.push_back(std::move(r));
    }
  }
  std::printf("correctness: %s\n", all_pass ? "all pass" : "FAILURES");

  // 2. Ceiling: device-to-device copy bandwidth (bytes read + written).
  double copy_gbps = 0.0;
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer src(bytes, stream.get()), dst(bytes, stream.get());
    fill_random_bf16<<<1024, 256, 0, stream.get()>>>(src.as<uint16_t>(), bytes / 2, seed);
    CUDA_TRY(cudaGetLastError());
    const double ms = time_ms(stream.get(), 2, 10, [&] {
      CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
    }, [] {});
    copy_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
    std::printf("copy bandwidth: %.0f GB/s (2 GiB device-to-device, %.3f ms)\n", copy_gbps, ms);
  }

  // 3. Kernel timings.
  std::vector<PerfResult> perf;
  {
    const std::vector<int> batches = quick ? std::vector<int>{32} : std::vector<int>{1, 32, 128};
    const std::vector<int> contexts = quick ? std::vector<int>{8192} : std::vector<int>{1024, 8192, 32768};
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
    const size_t cache_bytes = static_cast<size_t>(max_batch) * max_ctx * kHeadDim * 2;
    const size_t fp8_rows = fp8 ? static_cast<size_t>(max_batch) * max_ctx : 0;
    PerfBuffers buf{
        .cache = DeviceBuffer(cache_bytes, stream.get()),
        .cache_fp8 = DeviceBuffer(std::max<size_t>(fp8_rows * kFp8RowBytes, 16), stream.get()),
        .q = DeviceBuffer(static_cast<size_t>(max_batch) * 128 * kHeadDim * 2, stream.get()),
        .out = DeviceBuffer(static_cast<size_t>(max_batch) * 128 * kRank * 2, stream.get()),
        .table = DeviceBuffer(static_cast<size_t>(max_batch) * max_ctx / 64 * 4 + 4, stream.get()),
        .lens = DeviceBuffer(static_cast<size_t>(max_batch) * 4, stream.get()),
        .workspace = DeviceBuffer(size_t{256} << 20, stream.get()),
        .flush = DeviceBuffer(size_t{256} << 20, stream.get()),
    };
    fill_random_bf16<<<4096, 256, 0, stream.get()>>>(buf.cache.as<uint16_t>(), cache_bytes / 2, seed + 1);
    fill_random_bf16<<<256, 256, 0, stream.get()>>>(buf.q.as<uint16_t>(), buf.q.bytes() / 2, seed + 2);
    if (fp8) fill_random_fp8_rows<<<4096, 256, 0, stream.get()>>>(buf.cache_fp8.as<uint8_t>(), fp8_rows, seed + 3);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemsetAsync(buf.flush.data(), 0, buf.flush.bytes(), stream.get()));
    const auto add = [&](const PerfCase& c) {
      perf.push_back(run_perf(c, buf, rng, stream.get(), num_sms, copy_gbps));
    };
    // Each shape over the bf16 cache, then (with --fp8) over the FP8 one.
    const auto add_formats = [&](PerfCase c) {
      add(c);
      if (!fp8 || c.kernel != MlaDecodeKernel::kAuto) return;
      c.cache = CacheFormat::kFp8;
      add(c);
    };
    for (int heads : {16, 128}) {
      for (int batch : batches) {
        for (int context : contexts) {
          if (static_cast<double>(batch) * context * kHeadDim * 2 > 60e9) continue;
          add_formats({.heads = heads, .batch = batch, .context = context});
        }
      }
    }
    if (!quick) {
      // The split heuristic against fixed split counts.
      struct Sweep {
        int heads, batch, context;
        std::vector<int> splits;
      };
      const std::vector<Sweep> sweeps = {
          {16, 1, 8192, {8, 16, 32, 64, 128}},  {16, 1, 32768, {32, 64, 128}}, {16, 32, 1024, {1, 2, 4, 8}},
          {16, 32, 8192, {2, 4, 8}},            {16, 128, 1024, {1, 2}},       {16, 64, 16384, {1, 2, 4}},
          {128, 1, 32768, {16, 32, 64, 128}},   {128, 32, 1024, {1, 2, 4}},    {128, 32, 8192, {1, 2, 4}},
      };
      for (const auto& sw : sweeps) {
        for (int splits : sw.splits) {
          add({.heads = sw.heads, .batch = sw.batch, .context = sw.context, .splits = splits, .tag = "sweep"});
        }
      }
      if (fp8) {  // the FP8 kernel's split counts against its heuristic's (which reuses the bf16 fit)
        const std::vector<Sweep> fp8_sweeps = {
            {16, 1, 1024, {4, 6, 9, 17}},   {16, 1, 8192, {8, 16, 32, 64}}, {16, 1, 32768, {32, 64, 128}},
            {16, 32, 1024, {1, 2, 4}},      {16, 32, 8192, {1, 2, 4}},      {128, 1, 8192, {4, 8, 16, 32}},
            {128, 32, 1024, {1, 2}},        {128, 1, 32768, {16, 32, 64}},
        };
        for (const auto& sw : fp8_sweeps) {
          add({.heads = sw.heads, .batch = sw.batch, .context = sw.context, .tag = "sweep_fp8",
               .cache = CacheFormat::kFp8});
          for (int splits : sw.splits) {
            add({.heads = sw.heads, .batch = sw.batch, .context = sw.context, .splits = splits, .tag = "sweep_fp8",
                 .cache = CacheFormat::kFp8});
          }
        }
      }
      // The narrow kernel (eight 16-head blocks) on V3's 128 heads.
      add({.heads = 128, .batch = 32, .context = 8192, .kernel = MlaDecodeKernel::kNarrow, .tag = "narrow"});
      // The same version timed again: the spread between two measurements.
      add_formats({.heads = 16, .batch = 32, .context = 8192, .tag = "repeat"});
      add_formats({.heads = 128, .batch = 32, .context = 8192, .tag = "repeat"});
      for (int batch : batches) {  // the mma.sync wide kernel on every V3 shape, beside the default
        for (int context : contexts) {
          add({.heads = 128, .batch = batch, .context = context, .kernel = MlaDecodeKernel::kWide, .tag = "mma.sync"});
        }
      }
      // The shapes of the comparison table in the design notes.
      add_formats({.heads = 16, .batch = 64, .context = 16384, .tag = "compare"});
      add_formats({.heads = 128, .batch = 64, .context = 16384, .tag = "compare"});
      add_formats({.heads = 128, .batch = 128, .context = 16384, .tag = "compare"});
    }
    CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }

  // 4. JSON.
  if (FILE* f = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(f, "{\n  \"benchmark\": \"mla_decode\",\n");
    std::fprintf(f, "  \"gpu\": \"%s\",\n  \"num_sms\": %d,\n  \"l2_bytes\": %d,\n", json_escape(prop.name).c_str(),
                 num_sms, prop.l2CacheSize);
    std::fprintf(f, "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"command\": \"%s\",\n",
                 json_escape(env_or("BENCH_COMMIT", "unknown")).c_str(),
                 json_escape(env_or("BENCH_DATE", "unknown")).c_str(),
                 json_escape(env_or("BENCH_COMMAND", "mla_decode_bench")).c_str());
    std::fprintf(f, "  \"seed\": %llu,\n", static_cast<unsigned long long>(seed));
    std::fprintf(f, "  \"copy_bandwidth_gbps\": %.1f,\n  \"bf16_peak_tflops_reference\": %.1f,\n", copy_gbps,
                 kBf16PeakTflops);
    std::fprintf(f, "  \"fp8\": %s,\n  \"fp8_row_bytes\": %d,\n", fp8 ? "true" : "false", kFp8RowBytes);
    std::fprintf(f, "  \"correctness_pass\": %s,\n  \"correctness\": [\n", all_pass ? "true" : "false");
    for (size_t i = 0; i < checks.size(); ++i) {
      const auto& r = checks[i];
      std::fprintf(f,
                   "    {\"case\": \"%s\", \"heads\": %d, \"batch\": %d, \"page_size\": %d, \"kernel\": \"%s\", "
                   "\"splits\": %d, \"normalized_error\": %.3e, \"nan\": %lld, \"pass\": %s}%s\n",
                   r.name.c_str(), r.heads, r.batch, r.page_size, r.kernel.c_str(), r.splits, r.error,
                   static_cast<long long>(r.nan_count), r.pass ? "true" : "false", i + 1 < checks.size() ? "," : "");
    }
    std::fprintf(f, "  ],\n  \"perf\": [\n");
    for (size_t i = 0; i < perf.size(); ++i) {
      const auto& r = perf[i];
      std::fprintf(f,
                   "    {\"tag\": \"%s\", \"cache\": \"%s\", \"heads\": %d, \"batch\": %d, \"context\": %d, "
                   "\"kernel\": \"%s\", \"splits\": %d, \"time_us\": %.2f, \"bytes\": %.0f, \"flops\": %.0f, "
                   "\"gbps\": %.1f, \"copy_bw_fraction\": %.4f, \"tflops\": %.2f, \"bf16_peak_fraction\": %.4f}%s\n",
                   r.tag.c_str(), format_name(r.cache), r.heads, r.batch, r.context, r.kernel.c_str(), r.splits,
                   r.ms * 1e3, r.bytes, r.flops, r.gbps, r.bw_fraction, r.tflops, r.peak_fraction,
                   i + 1 < perf.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }

  std::printf("\n%-5s %-5s %-5s %-6s %-7s %-6s %10s %9s %8s %9s\n", "cache", "heads", "batch", "ctx", "kernel",
              "splits", "time_us", "GB/s", "%copy", "TFLOP/s");
  for (const auto& r : perf) {
    if (r.tag != "main") continue;
    std::printf("%-5s %-5d %-5d %-6d %-7s %-6d %10.1f %9.0f %7.1f%% %9.1f\n", format_name(r.cache), r.heads, r.batch,
                r.context, r.kernel.c_str(), r.splits, r.ms * 1e3, r.gbps, 100.0 * r.bw_fraction, r.tflops);
  }
  if (fp8) {  // each shape's FP8 time against its bf16 time (bytes: 656 against 1,152 a token, ideal 1.76x)
    std::printf("\n%-5s %-5s %-6s %12s %12s %10s %10s %8s\n", "heads", "batch", "ctx", "bf16_us", "fp8_us", "bf16_GB/s",
                "fp8_GB/s", "speedup");
    for (const auto& b : perf) {
      if (b.tag != "main" || b.cache != CacheFormat::kBf16) continue;
      for (const auto& f : perf) {
        if (f.tag != "main" || f.cache != CacheFormat::kFp8 || f.heads != b.heads || f.batch != b.batch ||
            f.context != b.context) {
          continue;
        }
        std::printf("%-5d %-5d %-6d %12.1f %12.1f %10.0f %10.0f %7.2fx\n", b.heads, b.batch, b.context, b.ms * 1e3,
                    f.ms * 1e3, b.gbps, f.gbps, b.ms / f.ms);
      }
    }
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
