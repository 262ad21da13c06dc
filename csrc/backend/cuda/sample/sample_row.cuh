// How the sampling kernel (sample.cu) reads one row: its share of the logits with penalties and masks applied as they
// are read, the candidates copied to shared memory, and one radix level over either.
#pragma once

#include <cstdint>

#include "backend/cuda/sample/sample_group.cuh"
#include "core/counter_rng.h"

namespace deepinfer::cuda::sample_row {

using sample_group::kBins;
using sample_group::kThreads;
using sample_group::order_key;
using sample_group::key_value;

// The row as one CTA of its group reads it.
struct Row {
  const float* __restrict__ logits;  // the row
  int32_t vocab;
  float temperature;  // 0: greedy
  float repetition_penalty, presence_penalty, frequency_penalty;
  const int32_t* __restrict__ penalty_tokens;
  const int32_t* __restrict__ penalty_counts;
  const uint32_t* masked_bits;   // shared memory: the row's masked tokens
  const uint32_t* special_bits;  // shared memory: masked or penalized tokens, which the main loop skips
  bool has_special;
  // This CTA's share: the scalar head (before the first 16-byte boundary) on rank 0, float4s [vec_begin, vec_end)
  // of the aligned body, the scalar tail on the last rank, and the penalty entries penalty_first, + penalty_step, ...
  // below penalty_end.
  int32_t head;
  bool takes_head, takes_tail;
  int32_t vec_begin, vec_end;
  int32_t penalty_first, penalty_step, penalty_end;
};

__device__ __forceinline__ bool test_bit(const uint32_t* bits, int32_t i) { return (bits[i >> 5] >> (i & 31)) & 1u; }

// The CPU reference's float operations, each rounded once (no contraction into FMAs).
__device__ __forceinline__ float scaled(const Row& row, float l) { return __fdiv_rn(l, row.temperature); }
__device__ __forceinline__ float penalized(const Row& row, float l, int32_t count) {
  l = l > 0.0f ? __fdiv_rn(l, row.repetition_penalty) : __fmul_rn(l, row.repetition_penalty);
  if (count > 0) {
    l = __fsub_rn(l, __fadd_rn(__fmul_rn(row.frequency_penalty, static_cast<float>(count)), row.presence_penalty));
  }
  return l;
}

// A floor on s = l / temperature as a key, with a bound on l below which s is certainly below the floor (the scans
// skip those logits without dividing).
struct Floor {
  uint32_t key;
  float logit;
};

__device__ __forceinline__ Floor floor_of(const Row& row, uint32_t key) {
  const float s = key_value(key);
  const float l = s * row.temperature;  // |error| <= 2^-24 |l|; s rounds l / t by at most as much again
  return {key, l - fabsf(l) * 0x1p-20f - 0x1p-126f};
}

// Visits the CTA's share of the row: on_raw(i, logit) for every token (kRaw), on_value(i, l') for every token that
// is not masked (kValues), l' the logit after the penalties.
template <bool kRaw, bool kValues, typename OnRaw, typename OnValue>
__device__ __forceinline__ void scan_row(const Row& row, OnRaw&& on_raw, OnValue&& on_value) {
  const auto visit = [&](int32_t i, float x) {
    if constexpr (kRaw) on_raw(i, x);
    if constexpr (kValues) {
      if (!row.has_special || !test_bit(row.special_bits, i)) on_value(i, x);
    }
  };
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  if (row.takes_head && tid < row.head) visit(tid, __ldg(row.logits + tid));
  const auto* vec = reinterpret_cast<const float4*>(row.logits + row.head);
  constexpr int kUnroll = 4;  // loads in flight per thread: 32 KB per CTA
  for (int32_t base = row.vec_begin + tid; base < row.vec_end; base += kUnroll * kThreads) {
    float4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kThreads;
      x[u] = j < row.vec_end ? __ldg(vec + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kThreads;
      if (j < row.vec_end) {
        const int32_t i = row.head + 4 * j;
        visit(i, x[u].x);
        visit(i + 1, x[u].y);
        visit(i + 2, x[u].z);
        visit(i + 3, x[u].w);
      }
    }
  }
  if (row.takes_tail) {
    const int32_t tail = row.head + 4 * row.vec_end + tid;  // fewer than 4 left
    if (tail < row.vocab) visit(tail, __ldg(row.logits + tail));
  }
  if constexpr (kValues) {
    if (row.has_special) {
      for (int32_t j = row.penalty_first + tid * row.penalty_step; j < row.penalty_end;
           j += kThreads * row.penalty_step) {
        const int32_t t = row.penalty_tokens[j];
        if (t < 0 || t >= row.vocab || test_bit(row.masked_bits, t)) continue;
        on_value(t, penalized(row, __ldg(row.logits + t), row.penalty_counts[j]));
      }
    }
  }
}

// The tokens a step visits: the (key of s, index) pairs this CTA copied to shared memory, or its share of the row,
// read again.
struct Candidates {
  const uint2* entries;
  int32_t count;
  bool in_shared;
};

// f(key of s, index) for every candidate of this CTA at or above the floor.
template <typename F>
__device__ __forceinline__ void visit_candidates(const Row& row, const Candidates& c, Floor floor, F&& f) {
  if (c.in_shared) {
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < c.count; j += kThreads) {
      const uint2 e = c.entries[j];
      if (e.x >= floor.key) f(e.x, static_cast<int32_t>(e.y));
    }
  } else {
    scan_row<false, true>(row, [](int32_t, float) {}, [&](int32_t i, float l) {
      if (l < floor.logit) return;
      const uint32_t key = order_key(scaled(row, l));
      if (key >= floor.key) f(key, i);
    });
  }
}

// Copies this CTA's tokens at or above the floor into `buffer`; in_shared is false where they did not fit (then the
// whole group must keep reading the row: see compact_group).
__device__ __noinline__ Candidates compact(const Row& row, uint2* buffer, int32_t capacity, Floor floor,
                                           int* counter) {
  if (threadIdx.x == 0) *counter = 0;
  __syncthreads();
  scan_row<false, true>(row, [](int32_t, float) {}, [&](int32_t i, float l) {
    if (l < floor.logit) return;
    const uint32_t key = order_key(scaled(row, l));
    if (key < floor.key) return;
    const int slot = sample_group::append_slot(counter);
    if (slot < capacity) buffer[slot] = make_uint2(key, static_cast<uint32_t>(i));
  });
  __syncthreads();
  const int32_t n = *counter;
  return {buffer, n < capacity ? n : capacity, n <= capacity};
}

// The digit of a radix level (0, 1, 2: 11, 11 and 10 bits from the top) and the bits above it.
__host__ __device__ constexpr int level_shift(int level) { return level == 0 ? 21 : level == 1 ? 10 : 0; }
__host__ __device__ constexpr int level_width(int level) { return level == 2 ? 10 : 11; }

// Adds this CTA's candidates at or above the floor that match `prefix` in the digits above `level` to its histogram
// of counts (and kMass: of masses exp(s - max_s)). The caller picks the bin over the group (Group::pick_bin).
template <bool kMass>
__device__ __noinline__ void radix_histogram(const Row& row, const Candidates& c, Floor floor, int level,
                                             uint32_t prefix, float max_s, sample_group::GroupShared& sh) {
  for (int b = static_cast<int>(threadIdx.x); b < kBins; b += kThreads) {
    sh.count[b] = 0;
    if constexpr (kMass) sh.mass[b] = 0;
  }
  __syncthreads();
  const int shift = level_shift(level), prefix_shift = shift + level_width(level);
  const uint32_t digit_mask = (1u << level_width(level)) - 1;
  visit_candidates(row, c, floor, [&](uint32_t key, int32_t) {
    if (prefix_shift < 32 && (key >> prefix_shift) != prefix) return;
    const uint32_t bin = (key >> shift) & digit_mask;
    atomicAdd(&sh.count[bin], 1u);
    if constexpr (kMass) {
      const uint64_t mass = counter_rng::softmax_mass(__fsub_rn(key_value(key), max_s));
      if (mass != 0) atomicAdd(&sh.mass[bin], static_cast<unsigned long long>(mass));
    }
  });
}

}  // namespace deepinfer::cuda::sample_row
