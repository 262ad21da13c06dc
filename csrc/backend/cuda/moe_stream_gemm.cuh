// Device code of the small-M expert kernels (decode: few rows per expert); included only by
// instantiations/moe_small_*.cu.
//
// Memory-bound: every active expert's weights are read once, so the kernel is built to keep HBM busy from its first
// microsecond to its last. One CTA per SM, persistent: the work is a list of items, an item being one tile of weight
// rows of one active expert and one pass over at most kRowsPerPass of its token rows, and each CTA takes a
// contiguous share of the list, so the grid finishes together (no partial last wave) and each CTA reads long runs of
// consecutive weight rows.
//   gate/up item: 16 rows = 8 gate rows i0 .. +8 and the 8 up rows I + i0 .. +8 (one m16 tile: silu(gate) * up
//                 meets in one accumulator), K = hidden; token rows are rows of x.
//   down item:    32 rows d0 .. +32 of W_down (two m16 tiles), K = inter; token rows are rows of act. With the
//                 fused combine, the last item of each 32-column block (over all slots) combines it.
// A producer warp feeds a ring of kStages shared-memory stages; a stage holds one K chunk of an item: the item's
// token pairs (a header), its weight rows and its token rows, all brought by bulk copies (one per row) counted on the
// stage's mbarrier. Eight consumer warps split each stage's K chunk, run mma.sync m16n8k16 (weight rows = M, token
// rows = N) from shared memory and release the stage: they never wait on global memory, so the only latency left
// in their loop is the ring's. At the end of an item the warps' partial sums meet in shared memory for the epilogue.
//
// K order inside an MMA is free as long as A and B agree: for every 32-wide K chunk, lane (g, t) reads 16 bytes
// (k = 8t .. 8t+7) of weight rows g and g + 8 and of token row g, and feeds k = 8t .. 8t+3 to the first m16n8k16 and
// 8t+4 .. 8t+7 to the second, in the fragment slots of k = 2t, 2t+1, 2t+8, 2t+9. A token row past the expert's rows
// is not copied: its stage row holds stale bytes, which reach only that row's output column, never written.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/moe_internal.h"
#include "backend/cuda/moe_ptx.cuh"
#include "core/error.h"

namespace deepinfer::cuda::moe_detail {

template <GemmKind kKindValue, int kTokenTilesValue>
struct StreamTraits {
  static constexpr GemmKind kKind = kKindValue;
  static constexpr bool kGateUp = kKindValue == GemmKind::kGateUp;
  static constexpr int kTokenTiles = kTokenTilesValue;  // n8 tiles of token rows per pass
  static constexpr int kRowsPerPass = 8 * kTokenTiles;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kConsumerThreads = 32 * kConsumerWarps;
  static constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
  static constexpr int kRowTiles = kGateUp ? 1 : 2;       // m16 tiles of an item
  static constexpr int kRows = 16 * kRowTiles;            // weight rows of an item
  static constexpr int kStageRows = kRows + kRowsPerPass;  // weight rows, then token rows
  static constexpr int kKSplit = kConsumerWarps / kRowTiles;  // warps along K in a stage
  static constexpr int kOutCols = kGateUp ? 8 : kDownColsPerCta;  // output columns of an item
  static constexpr int kStages = 6;
  static constexpr int kHeaderBytes = 128;          // the item's pairs, then the rows (128-byte aligned)
  static constexpr int kMaxRowBytes = 30 * 1024;    // row bytes of one stage (before the bank padding)
  static constexpr int kMaxChunk = kMaxRowBytes / (kStageRows * 2) / 32 * 32;  // K columns of a stage, at most
  static constexpr int kMaxChunksPerWarp = (kMaxChunk / 32 + kKSplit - 1) / kKSplit;
  static constexpr int kMaxPitch = 2 * kMaxChunk + 64;
  static constexpr int kMaxStageBytes = kHeaderBytes + kStageRows * kMaxPitch;
  static_assert(kOutCols == 32 || kGateUp, "the fused combine covers the down item's 32 columns, 2 a thread");
  static_assert(kTokenTiles >= 1 && kTokenTiles <= 4, "at most 32 rows a pass: one producer lane a row");
  static_assert(kRowsPerPass * 4 <= kHeaderBytes, "the header holds a pass's pairs");
  static_assert(kMaxChunk >= 32, "a stage holds a 32-wide K chunk");
};

// How one launch cuts K into stages (host-side; every item has the same stages).
struct StreamGeometry {
  int32_t chunk = 0;            // K columns of a full stage (a multiple of 32)
  int32_t stages_per_item = 0;  // ceil(K / chunk); the last stage may be shorter
  int32_t pitch = 0;            // bytes between a stage's rows: 2 * chunk, padded to 64 mod 128 (conflict-free reads)
  int32_t stage_bytes = 0;      // header + kStageRows * pitch
  int32_t tiles = 0;            // items of one expert and pass: inter / 8 (gate/up) or hidden / 32 (down)
};

struct StreamParams {
  MoeKernelParams kp;
  StreamGeometry geo;
  int32_t early_weights = 0;  // down: weights start streaming before the grid dependency wait (see the kernel)
};

template <typename T>
StreamGeometry stream_geometry(const MoeParams& p) {
  const int64_t k_dim = T::kGateUp ? p.hidden : p.inter;
  StreamGeometry g;
  const int64_t stages = (k_dim + T::kMaxChunk - 1) / T::kMaxChunk;
  g.chunk = static_cast<int32_t>(((k_dim + stages - 1) / stages + 31) / 32 * 32);
  g.stages_per_item = static_cast<int32_t>((k_dim + g.chunk - 1) / g.chunk);
  g.pitch = 2 * g.chunk + ((2 * g.chunk) % 128 == 0 ? 64 : 0);
  g.stage_bytes = T::kHeaderBytes + T::kStageRows * g.pitch;
  g.tiles = static_cast<int32_t>(T::kGateUp ? p.inter / 8 : p.hidden / 32);
  DI_CHECK(g.chunk <= T::kMaxChunk && g.stage_bytes <= T::kMaxStageBytes, "moe small-M: a K chunk of ", g.chunk,
           " columns exceeds the stage of ", T::kMaxChunk);
  return g;
}

// Where a CTA is in its share of the item list: items run slot by slot (active experts in order), tile by tile, pass
// by pass (passes innermost, so a second pass over the same weights finds them in L2).
struct ItemCursor {
  int slot = 0, tile = 0, pass = 0, passes = 1;

  __device__ static int passes_of(const int4& info, int rows_per_pass) {
    return (info.y + rows_per_pass - 1) / rows_per_pass;
  }
  __device__ void start(int item, const int32_t* items_before, const int4* slots, int rows_per_pass) {
    slot = 0;
    while (items_before[slot + 1] <= item) ++slot;
    passes = passes_of(slots[slot], rows_per_pass);
    const int r = item - items_before[slot];
    tile = r / passes;
    pass = r % passes;
  }
  __device__ void next(const int4* slots, int tiles, int rows_per_pass) {
    if (++pass < passes) return;
    pass = 0;
    if (++tile < tiles) return;
    tile = 0;
    ++slot;
    passes = passes_of(slots[slot], rows_per_pass);
  }
};

// A ring position: stage index and the parity of its current round.
struct RingSlot {
  int stage = 0;
  uint32_t phase = 0;
  template <int kStages>
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// out[t, c] = add[t, c] + sum_j weight[t, j] * y[t * top_k + j, c] for the columns [col0, col0 + 32), slots in
// order (as the combine kernel); run by the consumer threads.
template <typename T>
__device__ void combine_column_block(const MoeKernelParams& kp, int col0) {
  const MoeParams& p = kp.p;
  for (int idx = threadIdx.x; idx < p.num_tokens * 16; idx += T::kConsumerThreads) {
    const int token = idx / 16, col = col0 + (idx % 16) * 2;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t pair = static_cast<int64_t>(token) * p.top_k + j;
      const int e = __ldcg(&p.topk_ids[pair]);
      if (e < 0 || e >= p.num_experts) continue;
      const float w = __ldcg(&p.topk_weights[pair]);
      if (w == 0.0f) continue;
      const uint32_t v = __ldcg(reinterpret_cast<const unsigned int*>(kp.y + pair * p.hidden + col));
      acc0 = fmaf(w, bf16_lo(v), acc0);
      acc1 = fmaf(w, bf16_hi(v), acc1);
    }
    const int64_t at = static_cast<int64_t>(token) * p.hidden + col;
    if (p.add != nullptr) {
      const uint32_t a = __ldcg(reinterpret_cast<const unsigned int*>(p.add + at));
      acc0 += bf16_lo(a);
      acc1 += bf16_hi(a);
    }
    *reinterpret_cast<uint32_t*>(p.out + at) = pack_bf16x2(acc0, acc1);
  }
}

template <typename T>
struct StreamSmem {
  uint64_t full[T::kStages];   // a stage's header is written and its bytes have landed
  uint64_t empty[T::kStages];  // every consumer warp is done with a stage
  float red[T::kKSplit][T::kRows][T::kRowsPerPass + 1];  // the warps' partial sums of an item
  int4 slots[kMaxExperts + 1];                           // slot_info of the active slots, then an end sentinel
  int32_t items_before[kMaxExperts + 1];                 // items of the slots before each one
  int32_t pair_s[T::kRowsPerPass];                       // the item's token pairs (-1 past the expert's rows)
  int32_t is_last;                                       // the last finished item completed its column block
};

// The producer's view of one token row (lane r < kRowsPerPass): its pair and its first element.
struct TokenRow {
  int32_t pair = -1;
  const uint16_t* src = nullptr;
};

template <typename T>
__device__ TokenRow token_row(const MoeKernelParams& kp, const int4& info, int pass, int lane) {
  const MoeParams& p = kp.p;
  TokenRow r;
  const int row = pass * T::kRowsPerPass + lane;
  if (lane >= T::kRowsPerPass || row >= info.y) return r;
  r.pair = __ldcg(&kp.row_pair[info.z + row]);
  if constexpr (T::kGateUp) {
    r.src = p.x + static_cast<int64_t>(r.pair / p.top_k) * p.hidden;
  } else {
    r.src = kp.act + static_cast<int64_t>(r.pair) * p.inter;
  }
  return r;
}

// Producer warp: feeds the ring with items [begin, end). With sp.early_weights the stages of the first ring round
// get their weight rows before griddep_wait and their token rows (act, written by the previous grid) after it.
template <typename T>
__device__ void produce(const StreamParams& sp, StreamSmem<T>& s, uint8_t* ring, int begin, int end) {
  const MoeKernelParams& kp = sp.kp;
  const MoeParams& p = kp.p;
  const StreamGeometry& geo = sp.geo;
  const int lane = threadIdx.x & 31;
  const int64_t k_dim = T::kGateUp ? p.hidden : p.inter;
  const uint64_t policy = l2_evict_first_policy();
  bool waited = !sp.early_weights;
  // Token copies of the first round held back until the wait (early_weights): this lane's source and size a stage.
  const uint16_t* held_src[T::kStages];
  uint32_t held_bytes[T::kStages];
  int held = 0;
  ItemCursor at;
  at.start(begin, s.items_before, s.slots, T::kRowsPerPass);
  RingSlot ring_at;
  TokenRow token;
  int token_slot = -1, token_pass = -1;
  for (int item = begin; item < end; ++item) {
    const int4 info = s.slots[at.slot];
    if (at.slot != token_slot || at.pass != token_pass) {  // a new set of token rows (pairs)
      token = token_row<T>(kp, info, at.pass, lane);
      token_slot = at.slot;
      token_pass = at.pass;
    }
    // Weight rows r = lane, lane + 32 of the item: their first element in the expert's stacked weights.
    const uint16_t* row_src[2] = {nullptr, nullptr};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = lane + 32 * i;
      if (r >= T::kRows) continue;
      int64_t row;
      if constexpr (T::kGateUp) {
        row = static_cast<int64_t>(info.x) * 2 * p.inter + (r < 8 ? 0 : p.inter) + 8 * at.tile + (r & 7);
      } else {
        row = static_cast<int64_t>(info.x) * p.hidden + 32 * at.tile + r;
      }
      row_src[i] = (T::kGateUp ? p.w_gate_up : p.w_down) + row * k_dim;
    }
    const unsigned valid_tokens = __popc(__ballot_sync(0xffffffffu, token.pair >= 0));
    for (int c = 0; c < geo.stages_per_item; ++c) {
      const int64_t k0 = static_cast<int64_t>(c) * geo.chunk;
      const uint32_t bytes = static_cast<uint32_t>(2 * min(static_cast<int64_t>(geo.chunk), k_dim - k0));
      if (!waited && held == T::kStages) {  // the ring is full: wait, then release the held token copies
        griddep_wait();
        waited = true;
        for (int i = 0; i < held; ++i) {
          if (held_src[i] != nullptr) {
            uint8_t* stage = ring + static_cast<int64_t>(i) * geo.stage_bytes;
            bulk_copy_to_shared(stage + T::kHeaderBytes + (T::kRows + lane) * geo.pitch, held_src[i], held_bytes[i],
                                &s.full[i], policy);
          }
        }
      }
      mbarrier_wait_parity(&s.empty[ring_at.stage], ring_at.phase ^ 1u);
      uint8_t* stage = ring + static_cast<int64_t>(ring_at.stage) * geo.stage_bytes;
      if (lane < T::kRowsPerPass) reinterpret_cast<int32_t*>(stage)[lane] = token.pair;
      __syncwarp();
      if (lane == 0) mbarrier_arrive_expect_tx(&s.full[ring_at.stage], bytes * (T::kRows + valid_tokens));
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = lane + 32 * i;
        if (r < T::kRows) {
          bulk_copy_to_shared(stage + T::kHeaderBytes + r * geo.pitch, row_src[i] + k0, bytes, &s.full[ring_at.stage],
                              policy);
        }
      }
      const uint16_t* token_src = token.pair >= 0 ? token.src + k0 : nullptr;
      if (!waited) {
        held_src[held] = token_src;
        held_bytes[held] = bytes;
        ++held;
      } else if (token_src != nullptr) {
        bulk_copy_to_shared(stage + T::kHeaderBytes + (T::kRows + lane) * geo.pitch, token_src, bytes,
                            &s.full[ring_at.stage], policy);
      }
      ring_at.advance<T::kStages>();
    }
    at.next(s.slots, geo.tiles, T::kRowsPerPass);
  }
  if (!waited) {  // fewer stages than the ring holds
    griddep_wait();
    for (int i = 0; i < held; ++i) {
      if (held_src[i] != nullptr) {
        uint8_t* stage = ring + static_cast<int64_t>(i) * geo.stage_bytes;
        bulk_copy_to_shared(stage + T::kHeaderBytes + (T::kRows + lane) * geo.pitch, held_src[i], held_bytes[i],
                            &s.full[i], policy);
      }
    }
  }
}

// Consumer warps: items [begin, end), stage by stage in the producer's order.
template <typename T>
__device__ void consume(const StreamParams& sp, StreamSmem<T>& s, const uint8_t* ring, int begin, int end) {
  const MoeKernelParams& kp = sp.kp;
  const MoeParams& p = kp.p;
  const StreamGeometry& geo = sp.geo;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = warp % T::kRowTiles, ks = warp / T::kRowTiles;
  const int64_t k_dim = T::kGateUp ? p.hidden : p.inter;
  const uint32_t ring_addr = smem_addr(ring);
  // Fused combine: the column block of the previous item, when its atomic ticket is pending in s.is_last.
  int pending_block = -1;
  ItemCursor at;
  at.start(begin, s.items_before, s.slots, T::kRowsPerPass);
  RingSlot ring_at;
  for (int item = begin; item < end; ++item) {
    float acc[T::kTokenTiles][4];
#pragma unroll
    for (int nt = 0; nt < T::kTokenTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int c = 0; c < geo.stages_per_item; ++c) {
      const int64_t k0 = static_cast<int64_t>(c) * geo.chunk;
      const int chunks = static_cast<int>(min(static_cast<int64_t>(geo.chunk), k_dim - k0)) / 32;
      mbarrier_wait_parity(&s.full[ring_at.stage], ring_at.phase);
      const uint32_t stage = ring_addr + ring_at.stage * geo.stage_bytes;
      const uint32_t a_row = stage + T::kHeaderBytes + (16 * h + g) * geo.pitch + 16 * t;
      const uint32_t b_row = stage + T::kHeaderBytes + (T::kRows + g) * geo.pitch + 16 * t;
#pragma unroll
      for (int j = 0; j < T::kMaxChunksPerWarp; ++j) {
        const int chunk = ks + j * T::kKSplit;  // this warp's 32-wide chunks: ks, ks + kKSplit, ...
        if (chunk >= chunks) break;
        const uint4 a_lo = ld_shared_16(a_row + chunk * 64);
        const uint4 a_hi = ld_shared_16(a_row + 8 * geo.pitch + chunk * 64);
#pragma unroll
        for (int nt = 0; nt < T::kTokenTiles; ++nt) {
          const uint4 b = ld_shared_16(b_row + 8 * nt * geo.pitch + chunk * 64);
          mma_bf16_16816(acc[nt], a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
          mma_bf16_16816(acc[nt], a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
        }
      }
      if (c == geo.stages_per_item - 1 && tid < T::kRowsPerPass) {
        s.pair_s[tid] = reinterpret_cast<const int32_t*>(ring + ring_at.stage * geo.stage_bytes)[tid];
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&s.empty[ring_at.stage]);
      ring_at.advance<T::kStages>();
    }
    // Accumulator (row g / g + 8 of row tile h, token rows 2t, 2t + 1 of each token tile) -> red[ks][row][token].
#pragma unroll
    for (int nt = 0; nt < T::kTokenTiles; ++nt) {
      s.red[ks][16 * h + g][8 * nt + 2 * t] = acc[nt][0];
      s.red[ks][16 * h + g][8 * nt + 2 * t + 1] = acc[nt][1];
      s.red[ks][16 * h + g + 8][8 * nt + 2 * t] = acc[nt][2];
      s.red[ks][16 * h + g + 8][8 * nt + 2 * t + 1] = acc[nt][3];
    }
    named_barrier_sync(1, T::kConsumerThreads);
    if constexpr (T::kGateUp) {
      // 8 act columns (4 pairs) x kRowsPerPass token rows: silu(gate row f) * (up row 8 + f).
      for (int idx = tid; idx < T::kRowsPerPass * 4; idx += T::kConsumerThreads) {
        const int n = idx / 4, f = (idx % 4) * 2;
        const int pair = s.pair_s[n];
        if (pair < 0) continue;
        float gate0 = 0.0f, gate1 = 0.0f, up0 = 0.0f, up1 = 0.0f;
#pragma unroll
        for (int k = 0; k < T::kKSplit; ++k) {
          gate0 += s.red[k][f][n];
          gate1 += s.red[k][f + 1][n];
          up0 += s.red[k][8 + f][n];
          up1 += s.red[k][9 + f][n];
        }
        *reinterpret_cast<uint32_t*>(kp.act + static_cast<int64_t>(pair) * p.inter + 8 * at.tile + f) =
            pack_bf16x2(silu(gate0) * up0, silu(gate1) * up1);
      }
    } else {
      if (pending_block >= 0 && s.is_last) {  // the previous item completed its column block
        combine_column_block<T>(kp, 32 * pending_block);
        if (tid == 0) kp.col_done[pending_block] = 0;
      }
      // 32 output columns (16 pairs) x kRowsPerPass token rows.
      for (int idx = tid; idx < T::kRowsPerPass * 16; idx += T::kConsumerThreads) {
        const int n = idx / 16, col = (idx % 16) * 2;
        const int pair = s.pair_s[n];
        if (pair < 0) continue;
        float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
        for (int k = 0; k < T::kKSplit; ++k) {
          v0 += s.red[k][col][n];
          v1 += s.red[k][col + 1][n];
        }
        *reinterpret_cast<uint32_t*>(kp.y + static_cast<int64_t>(pair) * p.hidden + 32 * at.tile + col) =
            pack_bf16x2(v0, v1);
      }
    }
    named_barrier_sync(1, T::kConsumerThreads);  // red and pair_s are free again; this item's rows are written
    if constexpr (!T::kGateUp) {
      if (kp.fused_combine) {
        // One thread publishes the CTA's rows (the barrier orders the others' stores before its fence) and takes a
        // ticket; the answer is read after the next item's stages, so the fence and the atomic stall nobody else.
        if (tid == 0) {
          const int items_per_block = s.items_before[s.slots[0].w] / geo.tiles;  // every slot's passes
          __threadfence();
          s.is_last = atomicAdd(&kp.col_done[at.tile], 1) == items_per_block - 1;
          __threadfence();
        }
        pending_block = at.tile;
      }
    }
    at.next(s.slots, geo.tiles, T::kRowsPerPass);
  }
  if constexpr (!T::kGateUp) {
    if (pending_block >= 0) {
      named_barrier_sync(1, T::kConsumerThreads);
      if (s.is_last) {
        combine_column_block<T>(kp, 32 * pending_block);
        if (tid == 0) kp.col_done[pending_block] = 0;
      }
    }
  }
}

// Gate/up with kp.down_prefetch: this CTA's share of the active experts' W_down into L2 for the down kernel, issued
// by the producer warp once its copies are queued (the share is of all active experts, whether or not this CTA has
// items).
template <typename T>
__device__ void prefetch_down_share(const StreamParams& sp, const StreamSmem<T>& s) {
  const MoeParams& p = sp.kp.p;
  const int num_active = s.slots[0].x < 0 ? 0 : s.slots[0].w;
  const int64_t expert_bytes = static_cast<int64_t>(p.hidden) * p.inter * 2;
  const int64_t total = expert_bytes * num_active;
  const int64_t share = (total / gridDim.x + 127) / 128 * 128;
  const int64_t begin = blockIdx.x * share, end = min(total, begin + share);
  const char* base = reinterpret_cast<const char*>(p.w_down);
  for (int64_t at = begin + (threadIdx.x & 31) * 128; at < end; at += 32 * 128) {
    const int e = s.slots[at / expert_bytes].x;
    prefetch_l2_evict_last(base + e * expert_bytes + at % expert_bytes);
  }
}

// Loads the active slots and counts every slot's items (tiles x passes) into s.items_before.
template <typename T>
__device__ void plan_items(const StreamParams& sp, StreamSmem<T>& s) {
  const MoeKernelParams& kp = sp.kp;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int slot = tid; slot < kp.max_active; slot += T::kThreads) s.slots[slot] = __ldcg(&kp.slot_info[slot]);
  __syncthreads();
  if (warp == 0) {
    const int num_active = s.slots[0].x < 0 ? 0 : s.slots[0].w;
    int carry = 0;
    for (int base = 0; base < num_active; base += 32) {
      const int slot = base + lane;
      const int items = slot < num_active ? sp.geo.tiles * ItemCursor::passes_of(s.slots[slot], T::kRowsPerPass) : 0;
      int inclusive = items;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += v;
      }
      if (slot < num_active) s.items_before[slot] = carry + inclusive - items;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) {
      s.items_before[num_active] = carry;
      s.slots[num_active] = make_int4(-1, 0, 0, 0);  // where the cursors step after their last item
    }
  }
  __syncthreads();
}

// Grid: one CTA per SM. The PDL rule of ptx.cuh holds with one documented exception: with sp.early_weights (the down
// kernel, launched right after the gate/up kernel of the same call) the slot records, the row -> pair map and the
// weights are read before griddep_wait. That is safe because the gate/up grid triggers this launch only after its
// own griddep_wait, so the routing kernel that wrote those records has completed and its memory is visible by the
// time any CTA of this grid starts, and weights are never written during a step. What the gate/up kernel writes
// (act) is read only after the wait, by the producer's token copies and by nothing else.
template <typename T>
__global__ void __launch_bounds__(T::kThreads, 1) moe_stream_gemm_kernel(const __grid_constant__ StreamParams sp) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ StreamSmem<T> s;
  if (threadIdx.x == 0) {
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.full[i], 1);
      mbarrier_init(&s.empty[i], T::kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  const bool producer = threadIdx.x >= T::kConsumerThreads;
  if (!sp.early_weights) {
    griddep_wait();
    griddep_launch_dependents();
  }
  plan_items<T>(sp, s);
  if (sp.early_weights && !producer) {  // the consumers' outputs (y, out) are written after the previous grid's
    griddep_wait();
    griddep_launch_dependents();
  }
  const int total = s.items_before[s.slots[0].x < 0 ? 0 : s.slots[0].w];
  const int begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * total / gridDim.x);
  const int end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * total / gridDim.x);
  if (producer) {
    if (begin < end) produce<T>(sp, s, ring, begin, end);
    if constexpr (T::kGateUp) {
      if (sp.kp.down_prefetch) prefetch_down_share<T>(sp, s);
    }
    return;
  }
  if (begin < end) consume<T>(sp, s, ring, begin, end);
}

template <typename T>
void launch_stream_gemm(const MoeKernelParams& kp, cudaStream_t stream, bool early_weights) {
  const StreamParams sp{.kp = kp, .geo = stream_geometry<T>(kp.p), .early_weights = early_weights ? 1 : 0};
  const auto kernel = moe_stream_gemm_kernel<T>;
  const size_t smem = static_cast<size_t>(T::kStages) * sp.geo.stage_bytes;
  CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(kernel, {.grid = dim3(kp.p.num_sms), .block = dim3(T::kThreads), .smem_bytes = smem}, stream, sp);
}

}  // namespace deepinfer::cuda::moe_detail
