// The Hopper (wgmma) MLA prefill attention kernel; included only by instantiations/mla_prefill_attention_wgmma.cu.
// Same semantics, inputs and output as the mma.sync kernel (mla_prefill_kernels.cuh; mla_prefill_params.h), chosen
// by MlaPrefillAttentionParams::kernel (CudaTuning::mla_prefill_kernel: wgmma, the default, or mma).
//
// Work split: one CTA per (128-query tile, head, sequence), longest query tiles first; two warpgroups, warpgroup wg
// owns query rows 64 wg .. +64 of the tile, and both share every key/value tile. Per key tile of kBlockN keys:
//   S[64, kBlockN] = Q · K^T   wgmma m64nNk16, Q and K from shared memory (K-major), 12 k-steps over 192 dims
//   online softmax in fp32 registers (causal mask on the tiles that reach past the warpgroup's first position)
//   O[64, 128] += P · V        wgmma m64n128k16, P (bf16) from registers, V from shared memory (MN-major), kBlockN/16
// Operand layouts. Every tile is stored as 64-column blocks ([block][rows][128 bytes]) with the 128-byte swizzle
// (16-byte chunk c of row r at c ^ (r & 7); 8-row atoms of 1 KB, every block on a 1 KB boundary). Q [128, 192] and
// K [kBlockN, 192] hold their reduction dimension (the 192 dims) contiguous: K-major for both operands of Q · K^T.
// For P · V the reduction dimension is the key: V [kBlockN keys, 128 dims] as stored has N (dims) contiguous, so it
// is the MN-major ("transposed") B operand: leading byte offset = the stride between its two 64-dim blocks
// (kBlockN * 128 bytes), stride byte offset = 1024 (the next 8 keys), one k16 step = 16 keys = +2 KB. This is the
// convention of the wgmma MLA decode kernel's P · V (mla_decode_wgmma.cuh). P never touches shared memory: the
// register-A form of wgmma takes a thread's four 32-bit registers in the m16n8k16 A layout, which is exactly the
// fp32 accumulator layout of S (thread lane 4 g + t of warp w holds rows 16 w + g (+ 8), columns 8 j + 2 t (+ 1) in
// s[4 j + 2 half + e]), so k-step kk of P · V packs s[8 kk .. 8 kk + 7] in pairs.
// Pipeline within a warpgroup (the softmax overlaps the previous tile's P · V): iteration i issues S_i = Q · K_i^T,
// then O += P_{i-1} · V_{i-1}, waits only for S_i, runs the softmax of tile i while P_{i-1} · V_{i-1} still runs on
// the tensor cores, then waits for it, rescales O and packs P_i. The last P · V runs after the loop. Copies: cp.async
// by all 256 threads, one group per iteration holding K_{i+1} and V_i (V is needed one iteration later than K), two
// slots each; one __syncthreads per iteration orders slot reuse (every warpgroup waited for the wgmma that read a
// slot before the barrier that precedes its refill).
// Shared memory (kBlockN = 128): Q 48 KB + K 2 x 48 KB + V 2 x 32 KB + 1 KB alignment = 209 KB: one CTA per SM.
// Registers a thread: O 64 + S kBlockN / 2 + P kBlockN / 4 (fp32, fp32, bf16x2) = 160 at kBlockN 128 (ptxas, sm_90a:
// 221 in all, no spills; 184 at kBlockN 64). ptxas reports no serialized wgmma: the loop has no branch between a
// wgmma and its wait, which is why tile 0 (no P · V yet) is peeled off the loop.
// Expected rate: per 128 x 128 tile both warpgroups issue 2560 tensor-core cycles (20 m64n128k16 each, 64 cycles
// apiece at about 4 K FLOP/clock/SM) and 16 K exp2 (1 K cycles at 16 a clock): the softmax hides behind P · V but not
// behind Q · K^T, and the copies, barrier and masking add to the critical path: well above the mma.sync kernel at
// long prompts, below FlashAttention-3-class kernels, which add a
// producer warpgroup with TMA and mbarriers and ping-pong the two consumer warpgroups' softmax against each other.
// Keys past the context are zero-filled (never NaN) and masked; query rows past the sequence compute on zeros and are
// not stored.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mla/mla_prefill_kernels.cuh"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda::mla_prefill_detail {

template <int kBlockNValue>
struct WgmmaPrefillTraits {
  using Dims = MlaPrefillTraits;
  static constexpr int kQk = Dims::kQk;  // 192
  static constexpr int kV = Dims::kV;    // 128
  static constexpr int kBlockM = 128;    // queries per CTA
  static constexpr int kBlockN = kBlockNValue;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kRowsPerWarpgroup = kBlockM / kWarpgroups;  // 64: the wgmma M
  static constexpr int kQkBlocks = kQk / 64;                       // 64-column (128-byte) blocks of Q and K
  static constexpr int kVBlocks = kV / 64;
  static constexpr int kQBlockBytes = kBlockM * 128;
  static constexpr int kKvBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kQkBlocks * kQBlockBytes;
  static constexpr int kKBytes = kQkBlocks * kKvBlockBytes;  // one K slot
  static constexpr int kVBytes = kVBlocks * kKvBlockBytes;   // one V slot
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;        // two slots
  static constexpr int kVOffset = kKOffset + 2 * kKBytes;    // two slots
  static constexpr int kSmemBytes = kVOffset + 2 * kVBytes + 1024;  // + alignment to the 1 KB swizzle atom
  static constexpr int kSRegs = kBlockN / 2;  // S accumulators a thread
  static constexpr int kORegs = kV / 2;       // O accumulators a thread
  static constexpr int kPSteps = kBlockN / 16;  // k-steps of P · V, four bf16x2 registers each

  static_assert(kBlockN == 64 || kBlockN == 128, "wgmma N of Q · K^T: 64 or 128 keys");
  static_assert(kRowsPerWarpgroup == 64, "one wgmma M of rows per warpgroup");
  static_assert(kQk % 64 == 0 && kV == 128 && Dims::kNope == 128 && Dims::kRope == 64,
                "two k_nope blocks and one k_pe block; O is one m64n128 accumulator");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0, "operands on swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
  static_assert(kBlockM % 32 == 0 && kBlockN % 32 == 0, "a copy pass covers 32 rows (8 threads a row)");
};

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in 64-column block `block` of a swizzled tile with
// `rows` rows.
__device__ __forceinline__ uint32_t wgmma_tile_offset(int block, int rows, int row, int chunk) {
  return static_cast<uint32_t>(block * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The copies of one thread: chunk threadIdx.x % 8 of rows threadIdx.x / 8 + 32 k of every 64-column block.
template <typename T>
struct WgmmaTileLoader {
  const uint16_t* latents;  // this sequence's first gathered row
  const uint16_t* kv;       // this sequence's first kv row, offset to this head's columns
  int64_t kv_stride;        // elements between kv rows (num_heads * 256)
  int ctx;                  // keys of the sequence
  int row;                  // first row this thread copies
  int chunk;                // its 16-byte chunk of each 128-byte row

  // Q rows [0, kBlockM) from `q` (row stride q_stride); rows from `valid_rows` on are zeros.
  __device__ __forceinline__ void load_q(uint32_t dst, const uint16_t* q, int64_t q_stride, int valid_rows) const {
#pragma unroll
    for (int k = 0; k < T::kBlockM / 32; ++k) {
      const int r = row + 32 * k;
      const bool valid = r < valid_rows;
      const uint16_t* src = q + (valid ? r : 0) * q_stride + chunk * 8;
#pragma unroll
      for (int b = 0; b < T::kQkBlocks; ++b) {
        ptx::cp_async_16(dst + wgmma_tile_offset(b, T::kBlockM, r, chunk), src + b * 64, valid ? 16u : 0u);
      }
    }
  }

  // K rows [key0, key0 + kBlockN): blocks 0-1 k_nope (kv workspace), block 2 k_pe (latents); zeros past ctx.
  __device__ __forceinline__ void load_k(uint32_t dst, int key0) const {
    using Dims = MlaPrefillTraits;
#pragma unroll
    for (int k = 0; k < T::kBlockN / 32; ++k) {
      const int r = row + 32 * k, key = key0 + r;
      const bool valid = key < ctx;
      const int64_t src_row = valid ? key : 0;
      const uint16_t* nope = kv + src_row * kv_stride + chunk * 8;
      const uint16_t* rope = latents + src_row * Dims::kLatent + Dims::kRank + chunk * 8;
#pragma unroll
      for (int b = 0; b < T::kQkBlocks; ++b) {
        const uint16_t* src = b < Dims::kNope / 64 ? nope + b * 64 : rope + (b - Dims::kNope / 64) * 64;
        ptx::cp_async_16(dst + wgmma_tile_offset(b, T::kBlockN, r, chunk), src, valid ? 16u : 0u);
      }
    }
  }

  // V rows [key0, key0 + kBlockN) (kv workspace columns 128..255 of the head); zeros past ctx.
  __device__ __forceinline__ void load_v(uint32_t dst, int key0) const {
    using Dims = MlaPrefillTraits;
#pragma unroll
    for (int k = 0; k < T::kBlockN / 32; ++k) {
      const int r = row + 32 * k, key = key0 + r;
      const bool valid = key < ctx;
      const uint16_t* src = kv + (valid ? key : 0) * kv_stride + Dims::kNope + chunk * 8;
#pragma unroll
      for (int b = 0; b < T::kVBlocks; ++b) {
        ptx::cp_async_16(dst + wgmma_tile_offset(b, T::kBlockN, r, chunk), src + b * 64, valid ? 16u : 0u);
      }
    }
  }
};

// Descriptors of consecutive k-steps differ only in the start address: desc(addr + off) == desc(addr) + off / 16
// while the address stays below 256 KB, so each loop adds constants to one base descriptor.

// S[64, kBlockN] = Q[this warpgroup's 64 rows] · K^T (kQk / 16 wgmma, not waited for). K-step ks reads dims
// 16 ks .. +16: block ks / 4, +32 bytes a step inside the block's 128-byte rows.
template <typename T>
__device__ __forceinline__ void issue_qk(float (&s)[T::kSRegs], uint32_t q_rows, uint32_t k_slot) {
  const uint64_t desc_q = ptx::sw128_desc(q_rows, 16, 1024);
  const uint64_t desc_k = ptx::sw128_desc(k_slot, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < T::kQk / 16; ++ks) {
    const uint64_t q_step = static_cast<uint64_t>(((ks >> 2) * T::kQBlockBytes + (ks & 3) * 32) >> 4);
    const uint64_t k_step = static_cast<uint64_t>(((ks >> 2) * T::kKvBlockBytes + (ks & 3) * 32) >> 4);
    if constexpr (T::kBlockN == 128) {
      ptx::wgmma_m64n128k16_ss<ptx::BLayout::kKMajor>(s, desc_q + q_step, desc_k + k_step, ks > 0 ? 1 : 0);
    } else {
      ptx::wgmma_m64n64k16_ss<ptx::BLayout::kKMajor>(s, desc_q + q_step, desc_k + k_step, ks > 0 ? 1 : 0);
    }
  }
}

// O[64, 128] += P · V (kBlockN / 16 wgmma, not waited for); V is the MN-major B operand (see the top of the file).
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[T::kORegs], const uint32_t (&p)[T::kPSteps][4], uint32_t v_slot) {
  const uint64_t desc_v = ptx::sw128_desc(v_slot, T::kKvBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < T::kPSteps; ++kk) {
    ptx::wgmma_m64n128k16_rs<ptx::BLayout::kMNMajor>(o, p[kk], desc_v + static_cast<uint64_t>((kk * 16 * 128) >> 4),
                                                     1);
  }
}

// What one thread owns in both accumulators: rows r = 64 wg + 16 warp + g (half 0) and r + 8 (half 1) of the CTA's
// query tile, columns 8 j + 2 t (+ 1).
struct WgmmaRows {
  int t;        // lane % 4
  int pos[2];   // positions of the two rows
  int min_pos;  // position of the warpgroup's first row
};

// Online softmax of one tile's scores, in place: masks keys past each row's position (tiles that reach past the
// warpgroup's first position only), updates the running maxima (raw scores) and this thread's share of the row sums,
// turns s into probabilities and returns the factors O must be rescaled by (0 on the first tile).
template <typename T>
__device__ __forceinline__ float2 online_softmax(float (&s)[T::kSRegs], const WgmmaRows& rows, int key0,
                                                 float scale_log2, float (&m_run)[2], float (&l_run)[2]) {
  if (key0 + T::kBlockN - 1 > rows.min_pos) {
#pragma unroll
    for (int i = 0; i < T::kSRegs; ++i) {
      const int key = key0 + 8 * (i >> 2) + 2 * rows.t + (i & 1);
      if (key > rows.pos[(i >> 1) & 1]) s[i] = -INFINITY;
    }
  }
  float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
  for (int j = 0; j < T::kSRegs / 4; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  // Tile 0 holds key 0, which every row sees, so the maxima are finite from the first tile on.
  const float2 alpha = make_float2(exp2f((m_run[0] - mx[0]) * scale_log2), exp2f((m_run[1] - mx[1]) * scale_log2));
  const float offset[2] = {mx[0] * scale_log2, mx[1] * scale_log2};
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < T::kSRegs; ++i) {
    const int h = (i >> 1) & 1;
    s[i] = exp2f(fmaf(s[i], scale_log2, -offset[h]));
    sum[h] += s[i];
  }
  m_run[0] = mx[0];
  m_run[1] = mx[1];
  l_run[0] = l_run[0] * alpha.x + sum[0];
  l_run[1] = l_run[1] * alpha.y + sum[1];
  return alpha;
}

// P (bf16) in the register-A layout of P · V: k-step kk takes S columns 16 kk .. +16, i.e. s[8 kk .. 8 kk + 7]
// (register r: s[8 kk + 2 r] low, s[8 kk + 2 r + 1] high).
template <typename T>
__device__ __forceinline__ void pack_p(const float (&s)[T::kSRegs], uint32_t (&p)[T::kPSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < T::kPSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = pack_bf16x2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  }
}

template <typename T>
__global__ void __launch_bounds__(T::kThreads, 1) mla_prefill_attention_wgmma_kernel(
    const __grid_constant__ MlaPrefillAttentionParams p) {
  using Dims = MlaPrefillTraits;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  QueryTile qt;
  if (!query_tile<T::kBlockM, T::kBlockN>(p, qt)) return;
  const int s = qt.seq, h = qt.head, q_begin = qt.q_begin, num_q = qt.num_q, m0 = qt.m0, ctx = qt.ctx;
  const int first_pos = qt.first_pos, valid_rows = qt.rows, num_tiles = qt.num_kv_tiles;

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int64_t seq_row0 = first_row(p.context_lens, s);
  const int64_t kv_stride = static_cast<int64_t>(p.num_heads) * Dims::kKvWidth;
  const WgmmaTileLoader<T> loader{.latents = p.latents + seq_row0 * Dims::kLatent,
                                  .kv = p.kv + seq_row0 * kv_stride + static_cast<int64_t>(h) * Dims::kKvWidth,
                                  .kv_stride = kv_stride,
                                  .ctx = ctx,
                                  .row = tid >> 3,
                                  .chunk = tid & 7};
  const uint32_t q_base = smem + T::kQOffset;
  const auto k_slot = [&](int i) { return smem + T::kKOffset + static_cast<uint32_t>(i & 1) * T::kKBytes; };
  const auto v_slot = [&](int i) { return smem + T::kVOffset + static_cast<uint32_t>(i & 1) * T::kVBytes; };

  const int64_t q_stride = static_cast<int64_t>(p.num_heads) * Dims::kQk;
  loader.load_q(q_base, p.q + (static_cast<int64_t>(q_begin + m0) * p.num_heads + h) * Dims::kQk, q_stride,
                valid_rows);
  loader.load_k(k_slot(0), 0);
  ptx::cp_async_commit();

  const int row_lo = wg * T::kRowsPerWarpgroup + warp * 16 + (lane >> 2);
  const WgmmaRows rows{.t = lane & 3,
                       .pos = {first_pos + m0 + row_lo, first_pos + m0 + row_lo + 8},
                       .min_pos = first_pos + m0 + wg * T::kRowsPerWarpgroup};
  const uint32_t q_rows = q_base + static_cast<uint32_t>(wg * T::kRowsPerWarpgroup * 128);
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[T::kORegs];
#pragma unroll
  for (int i = 0; i < T::kORegs; ++i) o[i] = 0.0f;
  float sc[T::kSRegs];
  uint32_t pf[T::kPSteps][4];  // P of the previous tile, bf16 pairs in the A layout
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // this thread's columns only; summed over the quad at the end

  // Tile 0: S_0 and its softmax (no P · V yet).
  ptx::cp_async_wait<0>();  // Q and K_0
  ptx::fence_proxy_async();
  __syncthreads();
  ptx::wgmma_fence();
  issue_qk<T>(sc, q_rows, k_slot(0));
  ptx::wgmma_commit();
  if (num_tiles > 1) loader.load_k(k_slot(1), T::kBlockN);
  loader.load_v(v_slot(0), 0);
  ptx::cp_async_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(sc);
  online_softmax<T>(sc, rows, 0, scale_log2, m_run, l_run);  // O is still zero: nothing to rescale
  pack_p<T>(sc, pf);

  // Tile i: S_i, then P_{i-1} · V_{i-1} behind it; the softmax of tile i runs while P_{i-1} · V_{i-1} does.
  for (int i = 1; i < num_tiles; ++i) {
    ptx::cp_async_wait<0>();  // K_i and V_{i-1} (this thread's copies)
    ptx::fence_proxy_async();
    __syncthreads();  // everyone's copies visible; every wgmma of iteration i - 1 waited for
    ptx::wgmma_fence();
    issue_qk<T>(sc, q_rows, k_slot(i));
    ptx::wgmma_commit();
    issue_pv<T>(o, pf, v_slot(i - 1));
    ptx::wgmma_commit();
    // Refill the slots of K_{i-1} and V_{i-2}, whose wgmma every warpgroup waited for before the barrier.
    if (i + 1 < num_tiles) loader.load_k(k_slot(i + 1), (i + 1) * T::kBlockN);
    loader.load_v(v_slot(i), i * T::kBlockN);
    ptx::cp_async_commit();
    ptx::wgmma_wait<1>();  // S_i; P_{i-1} · V_{i-1} may still run
    ptx::fence_registers(sc);
    const float2 alpha = online_softmax<T>(sc, rows, i * T::kBlockN, scale_log2, m_run, l_run);
    ptx::wgmma_wait<0>();
    ptx::fence_registers(o);
#pragma unroll
    for (int j = 0; j < T::kORegs / 4; ++j) {
      o[4 * j] *= alpha.x;
      o[4 * j + 1] *= alpha.x;
      o[4 * j + 2] *= alpha.y;
      o[4 * j + 3] *= alpha.y;
    }
    pack_p<T>(sc, pf);
  }
  ptx::cp_async_wait<0>();  // V of the last tile
  ptx::fence_proxy_async();
  __syncthreads();
  ptx::wgmma_fence();
  issue_pv<T>(o, pf, v_slot(num_tiles - 1));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_registers(o);

  // out = O / row sum, for the rows that are queries of this sequence.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = l_run[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = 1.0f / l;
    const int i = m0 + row_lo + 8 * half;
    if (i >= num_q) continue;
    uint16_t* out_row = p.out + (static_cast<int64_t>(q_begin + i) * p.num_heads + h) * Dims::kV + 2 * rows.t;
#pragma unroll
    for (int j = 0; j < T::kORegs / 4; ++j) {
      *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
          pack_bf16x2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
    }
  }
}

}  // namespace deepinfer::cuda::mla_prefill_detail
