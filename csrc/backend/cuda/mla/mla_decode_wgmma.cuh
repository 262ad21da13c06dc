// Device code of the wgmma variants of the wide MLA decode kernel (64 heads per CTA); included only by
// instantiations/mla_decode_wide_wgmma.cu. Same tiles, pipeline and shared-memory layout as the mma.sync wide
// kernel (mla_decode_kernels.cuh), with both products on Hopper's warpgroup MMA reading shared memory directly:
//   warpgroup wg (of 2) computes S[64 heads, tokens 32 wg .. +32] = Q · K^T     (wgmma m64n32k16, 36 k-steps)
//   both exchange row maxima, write P (bf16) to shared memory, then
//   warpgroup wg computes O[64 heads, cols 256 wg .. +256] += P · V             (wgmma m64n256k16, 4 k-steps)
// Warp w of a warpgroup holds rows 16 (w % 4) .. +16 of both accumulators, so the softmax rescale factors of a
// thread's rows stay in its registers.
#pragma once

#include "backend/cuda/mla/mla_decode_kernels.cuh"

namespace deepinfer::cuda::mla_detail {

// ---------------------------------------------------------------------------------------------------------------
// wgmma wrappers (sm_90a)


// D[64x32] (+)= A[64x16] · B[16x32]; A, B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}


// ---------------------------------------------------------------------------------------------------------------
// Kernel

template <typename T>
struct WgmmaSmem {
  // The wide kernel's layout; every operand block starts on a 1 KB boundary (the swizzle atom), so the dynamic
  // shared memory is over-allocated by 1 KB and aligned at run time.
  using Base = WideSmem<T>;
  static_assert(Base::kQ % 1024 == 0 && Base::kKv % 1024 == 0 && T::kTileBytes % 1024 == 0 && Base::kP % 1024 == 0,
                "wgmma operands start on swizzle-atom boundaries");
  static constexpr int kBytes = Base::kBytes + 1024;
  static_assert(kBytes <= 227 * 1024, "fits one CTA per SM");
};

// What one thread of the wgmma kernels owns: rows r_lo = 16 (warp % 4) + g and r_hi = r_lo + 8 of both
// accumulators; S columns (tokens) 32 wg + 8 j + 2 t (+ 1); O columns 256 wg + 8 j + 2 t (+ 1).
struct WgmmaThread {
  int wg, t, r_lo, r_hi;
  // The same rows as the softmax sees them: warpgroup wg holds S columns 32 wg .., four n8 tiles.
  __device__ __forceinline__ SoftmaxRows<kWideHeads, 2, 4> softmax_rows() const {
    return {.part = wg, .r_lo = r_lo, .t = t};
  }
};

__device__ __forceinline__ void rescale_o(float (&o)[128], float2 alpha) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= alpha.x;
    o[4 * j + 1] *= alpha.x;
    o[4 * j + 2] *= alpha.y;
    o[4 * j + 3] *= alpha.y;
  }
}

// Descriptors of consecutive k-steps differ only in the start address: desc(addr + off) == desc(addr) + off / 16
// while the address stays below 256 KB (shared memory is smaller), so each loop adds constants to one base.

// S[64, 32] = Q · K^T for tokens 32 wg .. +32 of the tile at `kv` (36 wgmma, not waited for).
__device__ __forceinline__ void issue_qk(float (&s)[16], uint32_t q_base, uint32_t kv, int wg) {
  constexpr int kColBlockBytes = kBlockN * 128;
  const uint64_t desc_q = sw128_desc(q_base, 16, 1024);
  const uint64_t desc_k = sw128_desc(kv + wg * 32 * 128, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    const uint64_t step = ((ks >> 2) * kColBlockBytes + (ks & 3) * 32) >> 4;
    wgmma_m64n32k16_ss(s, desc_q + step, desc_k + step, ks > 0 ? 1 : 0);
  }
}

// O[64, 256 wg .. +256] += P · V (4 wgmma, not waited for).
__device__ __forceinline__ void issue_pv(float (&o)[128], uint32_t p_tile, uint32_t kv, int wg) {
  constexpr int kColBlockBytes = kBlockN * 128;
  const uint64_t desc_p = sw128_desc(p_tile, 16, 1024);
  const uint64_t desc_v = sw128_desc(kv + wg * 4 * kColBlockBytes, kColBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    wgmma_m64n256k16_bf16<BLayout::kMNMajor>(o, desc_p + ((kk * 32) >> 4), desc_v + ((kk * 16 * 128) >> 4), 1);
  }
}

template <typename T>
__device__ __forceinline__ void wgmma_store_output(const MlaDecodeParams& p, const WgmmaThread& th, int b, int h0,
                                                   int split, const float (&o)[128], const float (&m_run)[2],
                                                   const float (&l_run)[2], float* red_sum, float* row_max) {
  publish_row_stats(th.softmax_rows(), m_run, l_run, red_sum, row_max);
  __syncthreads();
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  const int64_t row0 = static_cast<int64_t>(b) * p.num_heads + h0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half == 0 ? th.r_lo : th.r_hi;
    const float l = red_sum[r] + red_sum[T::kHeads + r];
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    const int col0 = th.wg * 256 + 2 * th.t;
    if (p.num_splits == 1) {
      uint16_t* out = p.out + (row0 + r) * kValueDim + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            pack_bf16x2(o[4 * j + 2 * half] * inv_l, o[4 * j + 2 * half + 1] * inv_l);
      }
    } else {
      float* part = static_cast<float*>(p.workspace) + (split * rows + row0 + r) * kValueDim + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(part + 8 * j) =
            make_float2(o[4 * j + 2 * half] * inv_l, o[4 * j + 2 * half + 1] * inv_l);
      }
      if (th.wg == 0 && th.t == 0) {
        float* lse = static_cast<float*>(p.workspace) + static_cast<int64_t>(p.num_splits) * rows * kValueDim;
        lse[split * rows + row0 + r] = l > 0.0f ? row_max[r] + log2f(l) : -INFINITY;
      }
    }
  }
}

// Per tile: wait for its copy and queue the next one; QK; softmax; PV (each product waited for before the next step).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_wide_wgmma_kernel(const __grid_constant__ MlaDecodeParams p) {
  static_assert(T::kHeads == 64 && kThreads == 256, "two warpgroups over 64 heads");
  using L = WideSmem<T>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const uint32_t kv_base = smem_addr(smem + L::kKv);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const WgmmaThread th{.wg = warp >> 2, .t = lane & 3, .r_lo = (warp & 3) * 16 + (lane >> 2),
                       .r_hi = (warp & 3) * 16 + (lane >> 2) + 8};
  const int h0 = blockIdx.x * T::kHeads, split = blockIdx.y, b = blockIdx.z;
  const CtaKv start = start_cta<T>(p, b, split, kv_base);
  const int context_len = start.context_len;
  const TileRange range = start.range;
  if (range.begin >= range.end) {
    store_empty<T>(p, b, h0, split);
    return;
  }
  const int num_tiles = range.end - range.begin;
  const int32_t* pages = start.pages;
  const uint32_t q_base = smem_addr(smem + L::kQ);
  const uint32_t p_tile = smem_addr(smem + L::kP);
  float* red_max = reinterpret_cast<float*>(smem + L::kRedMax);

  queue_queries<T>(q_base, p, b, h0);
  finish_first_tiles<T>(kv_base, p, start);

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float s[16];
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // this thread's share of the row sums

  int stage = 0;
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<T::kStages - 2>();
    fence_proxy_async();
    __syncthreads();
    queue_next_tile<T>(kv_base, p, pages, range, i, stage, context_len);
    const uint32_t kv = kv_base + stage * T::kTileBytes;
    wgmma_fence();
    issue_qk(s, q_base, kv, th.wg);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);
    // s[16] is the m64n32 accumulator: four n8 tiles of the m16n8 layout the softmax reads
    const float2 alpha = online_softmax_tile(th.softmax_rows(), reinterpret_cast<float(&)[4][4]>(s),
                                             context_len - (range.begin + i) * kBlockN, scale_log2, red_max,
                                             smem + L::kP, m_run, l_run, [] { __syncthreads(); });
    fence_proxy_async();
    __syncthreads();
    rescale_o(o, alpha);
    wgmma_fence();
    issue_pv(o, p_tile, kv, th.wg);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    stage = stage + 1 == T::kStages ? 0 : stage + 1;
  }
  allow_dependent_launch();
  wgmma_store_output<T>(p, th, b, h0, split, o, m_run, l_run, reinterpret_cast<float*>(smem + L::kRedSum),
                        reinterpret_cast<float*>(smem + L::kRowMax));
}

}  // namespace deepinfer::cuda::mla_detail
