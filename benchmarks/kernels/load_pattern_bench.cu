// Which pattern of 16-byte global loads streams a bf16 weight matrix at the HBM's bandwidth: the question behind the
// batch-1 GEMV and small-M MoE kernels, which stream below a plain copy (docs/experiments/load_pattern/ has the runs).
//
// Every variant reads the same matrix once, as the kernels do: a warp owns 16 weight rows and a slice of K, CTAs of
// 4 warps, no shared memory, and feeds every 16 bytes it loads to one m16n8k16 MMA, as the kernels do (the values do
// not matter; the MMAs keep the compiler's schedule of loads and uses the kernels' own). The variables:
//   lanes a row     4 (the mma.sync fragment: 8 rows x 64 B an instruction, what the kernels do today), 8, 16 or 32
//                   (one row's 512 contiguous bytes an instruction);
//   rounds in flight how many K chunks each lane has loaded before it consumes the first;
//   K slices        warps that share a row tile, each over a slice of K: contiguous slices, or interleaved chunks
//                   (warp s takes chunks s, s + S, ...; what moe_small_gemm does).
// Reference lines: the device-to-device copy (the floor every report uses) and a grid-stride read of the whole
// buffer by as many threads as fit.
//
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc --expt-relaxed-constexpr \
//        benchmarks/kernels/load_pattern_bench.cu -o load_pattern_bench && ./load_pattern_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace {

using deepinfer::bench::time_ms;
using deepinfer::cuda::ptx::ld_stream_16;
using deepinfer::cuda::ptx::mma_bf16_16816;

constexpr int kWarpsPerCta = 4;
constexpr int kRowsPerWarp = 16;

struct Matrix {
  const uint16_t* w;
  int64_t rows;
  int k_dim;
};

template <int kLanesPerRow, int kRounds, bool kInterleaved>
__global__ void __launch_bounds__(32 * kWarpsPerCta) stream_rows(Matrix m, int k_slices, int* sink) {
  constexpr int kRowsPerInst = 32 / kLanesPerRow;
  constexpr int kInstPerRound = kRowsPerWarp / kRowsPerInst;
  constexpr int kChunkElems = kLanesPerRow * 8;  // K elements one instruction covers in a row
  const int lane = threadIdx.x & 31;
  const int64_t warp_id = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5);
  const int64_t tile = warp_id / k_slices;
  const int slice = static_cast<int>(warp_id % k_slices);
  if (tile * kRowsPerWarp >= m.rows) return;
  const int chunks = (m.k_dim + kChunkElems - 1) / kChunkElems;
  const int begin = kInterleaved ? slice : chunks * slice / k_slices;
  const int end = kInterleaved ? chunks : chunks * (slice + 1) / k_slices;
  const int stride = kInterleaved ? k_slices : 1;
  const int col = (lane % kLanesPerRow) * 8;
  const uint16_t* base = m.w + (tile * kRowsPerWarp + lane / kLanesPerRow) * static_cast<int64_t>(m.k_dim) + col;
  float acc[4] = {};
  for (int c = begin; c < end; c += stride * kRounds) {
    uint4 v[kRounds][kInstPerRound];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int chunk = c + u * stride;
      const bool in = chunk < end && chunk * kChunkElems + col < m.k_dim;
#pragma unroll
      for (int i = 0; i < kInstPerRound; ++i) {
        v[u][i] = in ? ld_stream_16(base + static_cast<int64_t>(i) * kRowsPerInst * m.k_dim + chunk * kChunkElems)
                     : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
#pragma unroll
      for (int i = 0; i < kInstPerRound; ++i) mma_bf16_16816(acc, v[u][i].x, v[u][i].y, v[u][i].z, v[u][i].w, lane, lane);
    }
  }
  if (acc[0] + acc[1] + acc[2] + acc[3] == 1.25f) *sink = lane;  // keeps the loads; practically never true
}

__global__ void grid_stride_read(const int4* data, int64_t n, int* sink) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcs(data + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0x7fffffff) *sink = 1;
}

struct Shape {
  const char* name;
  int64_t rows;
  int k_dim;
};

struct Bench {
  cudaStream_t stream;
  const int4* flush_buf;
  int64_t flush_n;
  int* sink;
  int num_sms;

  void flush() const {
    deepinfer::bench::read_flush<<<num_sms * 8, 512, 0, stream>>>(flush_buf, flush_n, sink);
  }
  double ms(auto&& fn) const {
    return time_ms(stream, 2, 15, fn, [&] { flush(); });
  }
};

template <int kL, int kU, bool kI>
void run_variant(const Bench& b, const Shape& s, const Matrix& m, int k_slices) {
  const int64_t warps = (s.rows / kRowsPerWarp) * k_slices;
  const int ctas = static_cast<int>((warps + kWarpsPerCta - 1) / kWarpsPerCta);
  const double ms = b.ms([&] {
    stream_rows<kL, kU, kI><<<ctas, 32 * kWarpsPerCta, 0, b.stream>>>(m, k_slices, b.sink);
  });
  CUDA_TRY(cudaGetLastError());
  const double bytes = static_cast<double>(s.rows) * s.k_dim * 2;
  const int inflight = kU * kRowsPerWarp * kL * 16;  // bytes a warp has requested before it consumes
  std::printf("pattern %-8s lanes/row %2d rounds %d slices %d %-11s ctas %5d warp_inflight_B %5d  %7.2f us %8.0f GB/s\n",
              s.name, kL, kU, k_slices, kI ? "interleaved" : "contiguous", ctas, inflight, ms * 1e3,
              bytes / (ms * 1e-3) / 1e9);
}

template <int kL, int kU>
void run_lanes_rounds(const Bench& b, const Shape& s, const Matrix& m) {
  for (int k_slices : {1, 2, 4}) {
    run_variant<kL, kU, false>(b, s, m, k_slices);
    if (k_slices > 1) run_variant<kL, kU, true>(b, s, m, k_slices);
  }
}

}  // namespace

int main() {
  int dev = 0;
  cudaDeviceProp prop{};
  CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t flush_bytes = int64_t{256} << 20;
  void *flush_buf = nullptr, *sink = nullptr;
  CUDA_TRY(cudaMalloc(&flush_buf, flush_bytes));
  CUDA_TRY(cudaMalloc(&sink, 64));
  CUDA_TRY(cudaMemset(flush_buf, 1, flush_bytes));
  const Bench b{stream, static_cast<const int4*>(flush_buf), flush_bytes / 16, static_cast<int*>(sink),
                prop.multiProcessorCount};
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // V2-Lite at batch 1: 8 experts' gate/up (2 x 1408 rows of 2048 each) and down (2048 rows of 1408); q_proj.
  const std::vector<Shape> shapes = {{"gate_up", 8 * 2816, 2048}, {"down", 8 * 2048, 1408}, {"q_proj", 3072, 2048}};
  for (const Shape& s : shapes) {
    const int64_t bytes = s.rows * s.k_dim * 2;
    void* w = nullptr;
    CUDA_TRY(cudaMalloc(&w, bytes));
    CUDA_TRY(cudaMemset(w, 3, bytes));
    void* dst = nullptr;
    CUDA_TRY(cudaMalloc(&dst, bytes));
    const double copy_ms = b.ms([&] { CUDA_TRY(cudaMemcpyAsync(dst, w, bytes, cudaMemcpyDeviceToDevice, stream)); });
    std::printf("reference %-8s %6.1f MB copy      %7.2f us %8.0f GB/s (read + write)\n", s.name, bytes / 1e6,
                copy_ms * 1e3, 2.0 * bytes / (copy_ms * 1e-3) / 1e9);
    const double read_ms = b.ms([&] {
      grid_stride_read<<<prop.multiProcessorCount * 4, 512, 0, stream>>>(static_cast<const int4*>(w), bytes / 16,
                                                                           static_cast<int*>(sink));
    });
    std::printf("reference %-8s %6.1f MB grid-stride read %7.2f us %8.0f GB/s\n", s.name, bytes / 1e6,
                read_ms * 1e3, bytes / (read_ms * 1e-3) / 1e9);
    const Matrix m{static_cast<const uint16_t*>(w), s.rows, s.k_dim};
    run_lanes_rounds<4, 2>(b, s, m);
    run_lanes_rounds<4, 3>(b, s, m);
    run_lanes_rounds<4, 4>(b, s, m);
    run_lanes_rounds<4, 8>(b, s, m);
    run_lanes_rounds<8, 1>(b, s, m);
    run_lanes_rounds<8, 2>(b, s, m);
    run_lanes_rounds<8, 4>(b, s, m);
    run_lanes_rounds<16, 1>(b, s, m);
    run_lanes_rounds<16, 2>(b, s, m);
    run_lanes_rounds<32, 1>(b, s, m);
    run_lanes_rounds<32, 2>(b, s, m);
    CUDA_TRY(cudaFree(dst));
    CUDA_TRY(cudaFree(w));
  }
  CUDA_TRY(cudaStreamSynchronize(stream));
  CUDA_TRY(cudaFree(flush_buf));
  CUDA_TRY(cudaFree(sink));
  CUDA_TRY(cudaStreamDestroy(stream));
  return 0;
}
