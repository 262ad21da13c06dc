// The sampling kernel (ops/sample.h): one group of CTAs per row of logits, a cluster of up to 8 CTAs of 512 threads
// when there are few rows (each CTA reads a slice of the row; partial results meet in distributed shared memory).
//
// Pass 1 reads the row (float4 loads) and applies penalties and masks as the logits are read: a bitmap in shared
// memory marks the row's masked and penalized tokens, the main loop skips them and a loop over the row's short
// penalty list supplies the penalized logits l'. A grammar mask (allowed_row) starts the bitmaps as the complement
// of its allowed tokens, so a disallowed token is a masked token to every later step (the raw logits of the logprobs
// never look at the bitmaps); a row with no grammar mask, penalties or masked tokens neither builds nor tests them.
// It finds the largest l' (its first index is the greedy token; s = l' / temperature is monotone in l', so the
// largest s is max(l') / temperature) and the raw maximum (logprobs).
// With temperature alone it also runs the draw (below), so such a row is read once.
//
// A row with top-k or top-p then needs only the tokens that can still matter, all at or above one floor on s:
//   - a token below max(s) - 24 neither carries top-p mass (its fixed-point mass is 0) nor can win the Gumbel race;
//   - without top-p, a token whose s plus the largest possible noise stays below the argmax token's own score cannot
//     win, nor can one that fails min_p;
//   - with top-k, the k-th largest s is at least the k-th largest per-thread maximum of each CTA (divided by the
//     temperature), so each CTA copies only its tokens above that;
//   - with top-p alone, the threshold lies above max(s) + log((1 - top_p) / V): the tokens below hold less than
//     1 - top_p of the mass together. Their mass still counts in the total: pass 2 counts them, which bounds it, and
//     only when the bound leaves the threshold open is their exact mass summed (one more read of the row).
// Pass 2 divides only the logits that can reach the floor, and copies the (key of s, index) pairs at or above it into
// shared memory when they fit (the usual case); every later step works there. When they do not fit, the steps read
// the row again (from L2 for small batches) until a narrower floor fits. The thresholds are radix selects over
// order-preserving keys of s (digits of 11, 11 and 10 bits; bins count tokens for top-k and sum fixed-point masses
// for top-p): exactly the values the CPU reference compares.
//
// The draw gives each thread a running best score and offers it tokens: a cheap upper bound on a token's noise
// (one fast log) drops most of them, and the exact noise (core/counter_rng.h) is computed only for tokens that could
// still win. min_p alone draws in pass 2, once max(s) is known.
//
// Logprobs: pass 2 sums exp(l - max) and gathers the tokens ranked at or above the N-th largest of the CTA's per-thread
// maxima: they include the CTA's top N, and number at most N threads' worth of tokens. Each gathered token's rank
// among all the group's gathered tokens is then counted directly.
//
// Nothing is allocated and `logits` is only read: the op can be captured in a CUDA graph. The loops live in
// __noinline__ functions that take the row by value, so their registers hold it (no local-memory reloads per token).
#include "backend/cuda/sample/sample.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>

#include "backend/backend.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "backend/cuda/sample/sample_group.cuh"
#include "backend/cuda/sample/sample_params.h"
#include "backend/cuda/sample/sample_row.cuh"
#include "core/counter_rng.h"

namespace deepinfer::cuda {
namespace {

using sample_group::BinPick;
using sample_group::Group;
using sample_group::GroupShared;
using sample_group::kBins;
using sample_group::key_value;
using sample_group::kThreads;
using sample_group::order_key;
using sample_group::ranked;
using sample_group::ranked_index;
using sample_group::ranked_key;
using sample_row::Candidates;
using sample_row::Floor;
using sample_row::level_shift;
using sample_row::level_width;
using sample_row::Row;

constexpr int32_t kMaxVocab = 1 << 18;     // two bitmaps of 32 KB
constexpr int32_t kMaxCandidates = 16384;  // 128 KB of (key, index) pairs per CTA
constexpr float kNoiseSpan = 24.0f;        // no token below max(s) - kNoiseSpan matters (see above)
static_assert(kNoiseSpan > counter_rng::kGumbelMax - counter_rng::kGumbelMin + 4.0f, "room for the noise");
static_assert(kNoiseSpan > -counter_rng::kMassCutoff, "tokens below the span have no top-p mass");
constexpr float kTopPSlack = 3.0f;         // how far below the top-p bound the candidates reach (see above)
constexpr float kNegInf = -__builtin_huge_valf();
constexpr uint32_t kNoFloor = 0x007FFFFFu;  // the key of -inf: below every value

static_assert(offsetof(SampledToken, top_ids) == 4 * sizeof(int32_t) &&
              offsetof(SampledToken, top_logprobs) == (4 + kMaxTopLogprobs) * sizeof(int32_t),
              "the kernel writes SampledToken words by offset");

struct KernelShared {
  GroupShared group;
  int num_candidates;
  int num_top;
};

// Where a CTA's candidates and logprob tokens live in dynamic shared memory, after the two bitmaps.
struct Buffers {
  uint32_t* masked_bits;
  uint32_t* special_bits;
  uint2* candidates;  // [candidate_capacity - top_reserve]
  uint2* top;         // [top_reserve]
};

// The row's share of this CTA: a slice of the float4 body, the head on rank 0 and the tail on the last rank.
template <int kCluster>
__device__ Row row_share(const SampleParams& p, const SamplingRow& params, int64_t r, const Buffers& b,
                         int32_t penalty_begin, int32_t penalty_end, bool has_special) {
  const int rank = Group<kCluster>::rank();
  const float* logits = p.logits + r * p.vocab;
  const auto misalignment = static_cast<int32_t>(reinterpret_cast<uintptr_t>(logits) % 16);
  const int32_t head = min(p.vocab, ((16 - misalignment) % 16) / 4);
  const int32_t num_vec = (p.vocab - head) / 4;
  const int32_t per_rank = (num_vec + kCluster - 1) / kCluster;
  return {.logits = logits, .vocab = p.vocab, .temperature = params.temperature,
          .repetition_penalty = params.repetition_penalty, .presence_penalty = params.presence_penalty,
          .frequency_penalty = params.frequency_penalty, .penalty_tokens = p.penalty_tokens,
          .penalty_counts = p.penalty_counts, .masked_bits = b.masked_bits, .special_bits = b.special_bits,
          .has_special = has_special, .head = head, .takes_head = rank == 0, .takes_tail = rank == kCluster - 1,
          .vec_begin = min(num_vec, rank * per_rank), .vec_end = min(num_vec, (rank + 1) * per_rank),
          .penalty_first = penalty_begin + rank, .penalty_step = kCluster, .penalty_end = penalty_end};
}

// One thread's part of the Gumbel-max race: the exact noise (core/counter_rng.h) only for the tokens whose score
// could still reach the best so far, judged with a cheap bound on the noise first: -log(-log u) <= -log(1 - u), one
// fast log, with room for its error and the exact one's.
struct Draw {
  const Row* row;
  uint64_t rng_key;
  float max_s, log_min_p;  // min_p: s - max_s >= log_min_p
  float inv_t;             // 1 / temperature, for the bound only
  uint64_t winner;         // ranked(key of the best score, its token); 0: none yet
  float best_score;        // -inf: none yet

  __device__ __forceinline__ float noise_bound(int32_t i) const {
    return -__logf(1.0f - counter_rng::uniform01_at(rng_key, i)) + 1e-3f;
  }
  __device__ __forceinline__ float reach() const { return best_score - (2e-3f + fabsf(best_score) * 0x1p-16f); }
  __device__ __forceinline__ void exact(float s, int32_t i) {
    if (!(__fsub_rn(s, max_s) >= log_min_p)) return;
    const float score = __fadd_rn(s, counter_rng::gumbel_at(rng_key, i));
    const uint64_t rank = ranked(order_key(score), i);
    if (rank > winner) {
      winner = rank;
      best_score = score;
    }
  }
  // A candidate known by the key of its s.
  __device__ __forceinline__ void offer_key(uint32_t key, int32_t i) {
    const float s = key_value(key);
    if (s + noise_bound(i) >= reach()) exact(s, i);
  }
  // A token known by its logit l' (a scan of the row): s is computed only when the token could win.
  __device__ __forceinline__ void offer_logit(float l, int32_t i, uint32_t floor) {
    if (l * inv_t + noise_bound(i) < reach()) return;
    const float s = sample_row::scaled(*row, l);
    if (order_key(s) >= floor) exact(s, i);
  }
};

// Pass 1 over this CTA's share of the row: the largest l' with its first index, the largest raw logit (kRaw, ranked),
// and (kDraw) the draw's winner.
struct Pass1 {
  float best_l;
  int32_t best_i;
  uint64_t raw_best;
  uint64_t winner;
};

template <bool kRaw, bool kDraw>
__device__ __noinline__ Pass1 pass_1(const Row& row, Draw draw) {
  Pass1 one{.best_l = kNegInf, .best_i = 0, .raw_best = 0, .winner = 0};
  sample_row::scan_row<kRaw, true>(row, [&](int32_t i, float x) {
    const uint64_t rank = ranked(order_key(x), i);
    one.raw_best = rank > one.raw_best ? rank : one.raw_best;
  }, [&](int32_t i, float l) {
    if (l > one.best_l || (l == one.best_l && i < one.best_i)) {
      one.best_l = l;
      one.best_i = i;
    }
    if constexpr (kDraw) draw.offer_logit(l, i, kNoFloor);
  });
  one.winner = draw.winner;
  return one;
}

// What pass 2 does with the unmasked tokens besides the logprobs: nothing, copy the candidates, or draw.
enum class Pass2Values : uint8_t { kNone, kCopy, kDraw };

struct Pass2In {
  uint32_t copy_floor, win_floor;
  float max_raw;
  uint64_t gather_floor;
  int32_t num_top, top_reserve, capacity;
};
struct Pass2 {
  float sum_exp;       // sum of exp(l - max_raw) over the CTA's share (kRaw)
  uint64_t num_below;  // tokens below copy_floor (kCopy)
  uint64_t winner;     // the draw's (kDraw)
};

// Pass 2 over this CTA's share of the row: the logprob sum and gather (kRaw), and the candidates or the draw.
template <bool kRaw, Pass2Values kValues>
__device__ __noinline__ Pass2 pass_2(const Row& row, const Pass2In& in, Draw draw, const Buffers& b,
                                     KernelShared& sh) {
  Pass2 two{.sum_exp = 0.0f, .num_below = 0, .winner = draw.winner};
  const Floor copy_at = sample_row::floor_of(row, in.copy_floor), win_at = sample_row::floor_of(row, in.win_floor);
  sample_row::scan_row<kRaw, kValues != Pass2Values::kNone>(row, [&](int32_t i, float x) {
    two.sum_exp += expf(x - in.max_raw);
    if (in.num_top > 0) {
      const uint32_t key = order_key(x);
      if (ranked(key, i) >= in.gather_floor) {
        const int slot = sample_group::append_slot(&sh.num_top);
        if (slot < in.top_reserve) b.top[slot] = make_uint2(key, static_cast<uint32_t>(i));
      }
    }
  }, [&](int32_t i, float l) {
    if constexpr (kValues == Pass2Values::kDraw) {
      if (l >= win_at.logit) draw.offer_logit(l, i, in.win_floor);
    } else {
      const uint32_t key = l < copy_at.logit ? 0u : order_key(sample_row::scaled(row, l));
      if (key < in.copy_floor) {
        ++two.num_below;
        return;
      }
      const int slot = sample_group::append_slot(&sh.num_candidates);
      if (slot < in.capacity) b.candidates[slot] = make_uint2(key, static_cast<uint32_t>(i));
    }
  });
  two.winner = draw.winner;
  return two;
}

// The draw over this CTA's share of the row, for tokens at or above the floor: its winner.
__device__ __noinline__ uint64_t draw_over_row(const Row& row, Draw draw, uint32_t floor) {
  const Floor at = sample_row::floor_of(row, floor);
  sample_row::scan_row<false, true>(row, [](int32_t, float) {}, [&](int32_t i, float l) {
    if (l >= at.logit) draw.offer_logit(l, i, floor);
  });
  return draw.winner;
}

// This CTA's sum of the masses of its tokens with s in [low, high): a pass over its share of the row.
__device__ __noinline__ uint64_t exact_mass_between(const Row& row, uint32_t low, uint32_t high, float max_s) {
  const Floor at = sample_row::floor_of(row, low);
  uint64_t mass = 0;
  sample_row::scan_row<false, true>(row, [](int32_t, float) {}, [&](int32_t, float l) {
    if (l < at.logit) return;
    const float s = sample_row::scaled(row, l);
    const uint32_t key = order_key(s);
    if (key >= low && key < high) mass += counter_rng::softmax_mass(__fsub_rn(s, max_s));
  });
  return mass;
}

// The smallest key of the bucket that `prefix` (the digits chosen up to radix level `level`) names.
__device__ __forceinline__ uint32_t bucket_floor(uint32_t prefix, int level) { return prefix << level_shift(level); }

// One threshold by radix select over the group's candidates at or above `floor`: the largest key whose candidates
// at or above it reach the target (a count, or kMass: a mass, target_of(total)). Returns kNoFloor when the
// candidates fall short. Between levels, a group still reading the row copies the candidates once they are known
// to fit.
template <int kCluster, bool kMass, typename TargetOf>
__device__ __noinline__ uint32_t radix_select(Group<kCluster>& g, const Row& row, Candidates& c, Floor floor,
                                              float max_s, TargetOf target_of, const Buffers& b, int32_t capacity,
                                              KernelShared& sh) {
  uint32_t prefix = 0;
  uint64_t target = 0, count_above = 0;
  for (int level = 0; level < 3; ++level) {
    sample_row::radix_histogram<kMass>(row, c, floor, level, prefix, max_s, g.sh);
    const BinPick pick =
        g.template pick_bin<kMass>([&](uint64_t total) { return level == 0 ? target_of(total) : target; });
    if (!pick.found) return kNoFloor;
    prefix = (prefix << level_width(level)) | pick.bin;
    target = pick.target - (kMass ? pick.above.mass : pick.above.count);
    count_above += pick.above.count;
    if (!c.in_shared && count_above + pick.in_bin.count <= uint64_t(capacity) && level < 2) {
      const uint32_t key = max(floor.key, bucket_floor(prefix, level));
      c = sample_row::compact(row, b.candidates, capacity, sample_row::floor_of(row, key), &sh.num_candidates);
      c.in_shared = !g.any(!c.in_shared);
    }
  }
  return prefix;
}

template <int kCluster>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(__grid_constant__ const SampleParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  __shared__ KernelShared sh;
  Group<kCluster> g{sh.group};
  const int64_t r = blockIdx.x / kCluster;
  const int32_t tid = static_cast<int32_t>(threadIdx.x), vocab = p.vocab;

  SamplingRow params;
  {
    static_assert(kSamplingRowWords % 4 == 0, "a SamplingRow is read as whole int4 vectors");
    constexpr int kRowVectors = kSamplingRowWords / 4;
    int4 words[kRowVectors];
    const auto* src = reinterpret_cast<const int4*>(p.rows + r * kSamplingRowWords);
#pragma unroll
    for (int w = 0; w < kRowVectors; ++w) words[w] = __ldg(src + w);
    memcpy(static_cast<void*>(&params), words, sizeof params);
  }
  // Ranges are checked on the host only when the rows are host memory: clamp them, so bad rows cannot read outside.
  // An allowed_row outside the bitmaps reads none of them: the row has no grammar mask.
  const int32_t penalty_begin = min(max(params.penalty_begin, 0), p.num_penalties);
  const int32_t penalty_end = min(max(params.penalty_end, penalty_begin), p.num_penalties);
  const int32_t mask_begin = min(max(params.mask_begin, 0), p.num_masked);
  const int32_t mask_end = min(max(params.mask_end, mask_begin), p.num_masked);
  const uint32_t* allowed = params.allowed_row >= 0 && params.allowed_row < p.num_allowed_rows
                                ? p.allowed_tokens + static_cast<int64_t>(params.allowed_row) * p.allowed_words
                                : nullptr;
  const bool has_special = allowed != nullptr || penalty_end > penalty_begin || mask_end > mask_begin;

  const int32_t bitmap_words = ((vocab + 63) / 64) * 2;
  const bool greedy = params.temperature == 0.0f;
  const bool want_logprobs = params.num_logprobs >= 0;
  const int32_t num_top = want_logprobs ? min(min(params.num_logprobs, kMaxTopLogprobs), vocab) : 0;
  const int32_t top_reserve = num_top * p.tokens_per_thread;
  Buffers b;
  b.masked_bits = reinterpret_cast<uint32_t*>(dynamic_shared);
  b.special_bits = b.masked_bits + bitmap_words;
  b.candidates = reinterpret_cast<uint2*>(b.special_bits + bitmap_words);
  const int32_t capacity = p.candidate_capacity - top_reserve;
  b.top = b.candidates + capacity;
  const Row row = row_share<kCluster>(p, params, r, b, penalty_begin, penalty_end, has_special);
  if (has_special) {  // every CTA marks the whole row's lists (they are short) and copies its grammar mask
    if (allowed != nullptr) {
      // A token the grammar disallows is a masked token. The words past the bitmap, and the bits of its last word
      // past the vocabulary, stand for no token: masked too, so no bit of the copy can let one through.
      for (int32_t w = tid; w < bitmap_words; w += kThreads) {
        uint32_t masked = w < p.allowed_words ? ~__ldg(allowed + w) : ~0u;
        const int32_t tokens_in_word = vocab - 32 * w;
        if (tokens_in_word < 32) masked |= tokens_in_word <= 0 ? ~0u : ~0u << tokens_in_word;
        b.masked_bits[w] = masked;
        b.special_bits[w] = masked;
      }
    } else {
      for (int32_t w = tid; w < 2 * bitmap_words; w += kThreads) b.masked_bits[w] = 0;
    }
    __syncthreads();
    for (int32_t j = mask_begin + tid; j < mask_end; j += kThreads) {
      const int32_t t = p.masked_tokens[j];
      if (t < 0 || t >= vocab) continue;
      atomicOr(&b.masked_bits[t >> 5], 1u << (t & 31));
      atomicOr(&b.special_bits[t >> 5], 1u << (t & 31));
    }
    for (int32_t j = penalty_begin + tid; j < penalty_end; j += kThreads) {
      const int32_t t = p.penalty_tokens[j];
      if (t >= 0 && t < vocab) atomicOr(&b.special_bits[t >> 5], 1u << (t & 31));
    }
  }
  const bool top_k_on = !greedy && params.top_k > 0 && params.top_k < vocab;
  const bool top_p_on = !greedy && params.top_p < 1.0f;
  const bool min_p_on = !greedy && params.log_min_p != kNegInf;
  // Temperature alone: the draw happens in pass 1. min_p alone: in pass 2, once max(s) is known.
  const bool draw_in_pass_1 = !greedy && !top_k_on && !top_p_on && !min_p_on;
  const bool draw_in_pass_2 = !greedy && !top_k_on && !top_p_on && min_p_on;
  const uint64_t rng_key = counter_rng::stream_key(params.seed, params.step);
  Draw draw{.row = &row, .rng_key = rng_key, .max_s = 0.0f, .log_min_p = kNegInf,
            .inv_t = greedy ? 0.0f : 1.0f / params.temperature, .winner = 0, .best_score = kNegInf};
  __syncthreads();

  // Pass 1: the largest l' and its first index (the first index of -inf when every token is masked) and the raw
  // maximum; with temperature alone, the draw.
  const Pass1 one = want_logprobs ? (draw_in_pass_1 ? pass_1<true, true>(row, draw) : pass_1<true, false>(row, draw))
                                  : (draw_in_pass_1 ? pass_1<false, true>(row, draw) : pass_1<false, false>(row, draw));
  const float best_l = one.best_l;
  const int32_t best_i = one.best_i;
  const uint64_t raw_best = one.raw_best;
  draw.winner = one.winner;
  const uint64_t thread_best = ranked(order_key(best_l), best_i);
  const uint64_t best = g.max(thread_best);
  int32_t token = ranked_index(best);
  const float max_l = key_value(ranked_key(best));
  const float max_raw = want_logprobs ? key_value(ranked_key(g.max(raw_best))) : 0.0f;
  const float max_s = greedy ? max_l : __fdiv_rn(max_l, params.temperature);
  const bool sampling = !greedy && isfinite(max_s);  // otherwise the greedy token stands (every token masked)
  if (draw_in_pass_1) {
    const uint64_t winner = g.max(draw.winner);
    if (sampling) token = ranked_index(winner);
  }
  const bool thresholds = sampling && (top_k_on || top_p_on);

  // The floors (see the top of the file), as keys of s.
  uint32_t win_floor = kNoFloor, noise_floor = kNoFloor, floor = kNoFloor, copy_floor = kNoFloor;
  if (sampling && !draw_in_pass_1) {
    noise_floor = order_key(max_s - (kNoiseSpan + fabsf(max_s) * 0x1p-18f));
    draw.max_s = max_s;
    draw.log_min_p = params.log_min_p;
    draw.best_score = __fadd_rn(max_s, counter_rng::gumbel_at(rng_key, token));  // the argmax token's score
    draw.winner = ranked(order_key(draw.best_score), token);
    const float margin = 1e-3f + fabsf(draw.best_score) * 0x1p-18f;
    win_floor = max(noise_floor, order_key(draw.best_score - counter_rng::kGumbelMax - margin));
    win_floor = max(win_floor, order_key(max_s + params.log_min_p - (1e-3f + fabsf(max_s) * 0x1p-18f)));
    if (top_k_on) {
      // The k-th largest s is at least the k-th largest of this CTA's per-thread maxima (divided): every token at or
      // above it is at or above that, in each CTA.
      floor = top_p_on ? noise_floor : win_floor;
      copy_floor = floor;
      if (params.top_k <= kThreads) {
        const float tau = key_value(ranked_key(
            sample_group::nth_largest(thread_best, params.top_k, reinterpret_cast<uint64_t*>(b.candidates))));
        copy_floor = max(floor, order_key(__fdiv_rn(tau, params.temperature)));
      }
    } else if (top_p_on) {
      // The threshold lies above max(s) + log((1 - top_p) / V); the tokens below it only add to the total mass.
      const float log_share = logf((1.0f - params.top_p) / static_cast<float>(vocab));
      floor = max(noise_floor, order_key(max_s + log_share - (kTopPSlack + fabsf(max_s) * 0x1p-18f)));
      copy_floor = floor;
    } else {
      floor = win_floor;
    }
  }

  // The logprob gather threshold: the num_top-th largest per-thread maximum of this CTA. The candidate buffer is its
  // scratch.
  const uint64_t gather_floor =
      num_top > 0 ? sample_group::nth_largest(raw_best, num_top, reinterpret_cast<uint64_t*>(b.candidates)) : ~0ull;

  // Pass 2: the logprob sum and gather; the candidates at or above copy_floor and how many tokens lie below it
  // (with top-k or top-p); the draw (min_p alone).
  if (tid == 0) {
    sh.num_candidates = 0;
    sh.num_top = 0;
  }
  __syncthreads();
  const Pass2In in{.copy_floor = copy_floor, .win_floor = win_floor, .max_raw = max_raw,
                   .gather_floor = gather_floor, .num_top = num_top, .top_reserve = top_reserve,
                   .capacity = capacity};
  Pass2 two{.sum_exp = 0.0f, .num_below = 0, .winner = draw.winner};
  if (want_logprobs && thresholds) {
    two = pass_2<true, Pass2Values::kCopy>(row, in, draw, b, sh);
  } else if (want_logprobs && sampling && draw_in_pass_2) {
    two = pass_2<true, Pass2Values::kDraw>(row, in, draw, b, sh);
  } else if (want_logprobs) {
    two = pass_2<true, Pass2Values::kNone>(row, in, draw, b, sh);
  } else if (thresholds) {
    two = pass_2<false, Pass2Values::kCopy>(row, in, draw, b, sh);
  } else if (sampling && draw_in_pass_2) {
    two = pass_2<false, Pass2Values::kDraw>(row, in, draw, b, sh);
  }
  const float sum_exp = two.sum_exp;
  const uint64_t num_below = two.num_below;
  draw.winner = two.winner;
  __syncthreads();
  const int32_t num_copied = sh.num_candidates;
  Candidates candidates{b.candidates, min(num_copied, capacity), num_copied <= capacity};
  if (thresholds) candidates.in_shared = !g.any(!candidates.in_shared);  // the group reads one way
  if (sampling && draw_in_pass_2) token = ranked_index(g.max(draw.winner));

  int32_t* out = p.out + r * kSampledTokenWords;
  double log_norm = 0.0;
  if (want_logprobs) {
    log_norm = static_cast<double>(max_raw) + log(g.sum(static_cast<double>(sum_exp)));
    // Each gathered token's rank among the group's gathered tokens (they include the top num_top): its slot.
    const int32_t gathered = min(sh.num_top, top_reserve);
    g.sync();  // every CTA's list is complete
    for (int32_t a = tid; a < gathered; a += kThreads) {
      const uint2 e = b.top[a];
      const uint64_t rank_a = ranked(e.x, static_cast<int32_t>(e.y));
      int32_t rank = 0;
      for (int c = 0; c < kCluster; ++c) {
        const uint2* list = Group<kCluster>::at_rank(b.top, c);
        const int32_t n = min(*Group<kCluster>::at_rank(&sh.num_top, c), top_reserve);
        for (int32_t j = 0; j < n; ++j) rank += ranked(list[j].x, static_cast<int32_t>(list[j].y)) > rank_a;
      }
      if (rank < num_top) {
        out[4 + rank] = static_cast<int32_t>(e.y);
        out[4 + kMaxTopLogprobs + rank] =
            __float_as_int(static_cast<float>(static_cast<double>(key_value(e.x)) - log_norm));
      }
    }
  }

  if (thresholds) {
    // top-k: the k-th largest s (when fewer than k candidates lie above the floor, it lies below them all, and
    // keeps every token that can still win or carry mass).
    if (top_k_on) {
      const auto k = static_cast<uint64_t>(params.top_k);
      floor = max(floor, radix_select<kCluster, false>(g, row, candidates, sample_row::floor_of(row, floor), max_s,
                                                      [&](uint64_t) { return k; }, b, capacity, sh));
    }
    // top-p over what top-k keeps: the largest threshold whose tokens hold the target share of the mass. Without
    // top-k, the mass below the floor counts in the total: bounded by its token count first, computed exactly only
    // when the bound leaves the threshold open.
    if (top_p_on) {
      const float top_p = params.top_p;
      const Floor at = sample_row::floor_of(row, floor);
      const auto select = [&](uint64_t below) {
        return radix_select<kCluster, true>(g, row, candidates, at, max_s, [&](uint64_t total) {
          return counter_rng::top_p_target(top_p, total + below);
        }, b, capacity, sh);
      };
      const uint64_t count_below = top_k_on ? 0 : g.sum(num_below);
      uint32_t threshold = 0;
      bool open = count_below > 0;
      if (open && candidates.in_shared) {
        const double mass_bound = ldexp(exp(static_cast<double>(key_value(floor)) - max_s), 32) * 1.01 + 1.0;
        threshold = select(0);
        open = threshold != select(count_below * static_cast<uint64_t>(mass_bound));
      }
      if (open) {
        threshold = select(g.sum(exact_mass_between(row, noise_floor, floor, max_s)));
      } else if (count_below == 0) {
        threshold = select(0);
      }
      floor = max(floor, threshold);
    }
    // The Gumbel-max draw over the kept tokens, starting from the argmax token's score.
    floor = max(floor, win_floor);
    if (candidates.in_shared) {
      for (int32_t j = tid; j < candidates.count; j += kThreads) {
        const uint2 e = candidates.entries[j];
        if (e.x >= floor) draw.offer_key(e.x, static_cast<int32_t>(e.y));
      }
    } else {
      draw.winner = draw_over_row(row, draw, floor);
    }
    token = ranked_index(g.max(draw.winner));
  }

  if (params.score_token >= 0 && params.score_token < vocab) token = params.score_token;  // a scored prompt token
  if (tid == 0 && Group<kCluster>::rank() == 0) {
    out[0] = token;
    out[1] = want_logprobs
                 ? __float_as_int(static_cast<float>(static_cast<double>(__ldg(row.logits + token)) - log_norm))
                 : 0;
    out[2] = num_top;
    out[3] = 0;
    for (int32_t j = num_top; j < kMaxTopLogprobs; ++j) {
      out[4 + j] = 0;
      out[4 + kMaxTopLogprobs + j] = 0;
    }
  }
  g.sync();  // no CTA leaves while another may still read its shared memory
}

// Tokens of its slice one thread visits in the main loop, at most (the logprob gather reserve relies on it).
int32_t tokens_per_thread(int64_t vocab, int cluster) {
  const int64_t vec_per_rank = (vocab / 4 + cluster - 1) / cluster;
  return static_cast<int32_t>(4 * ((vec_per_rank + kThreads - 1) / kThreads) + 8);
}

// Rows per CTA group: a cluster of several CTAs per row while the rows alone leave SMs idle.
int cluster_size(int64_t rows, int num_sms) {
  for (const int c : {8, 4, 2}) {
    if (rows * c <= num_sms) return c;
  }
  return 1;
}

template <int kCluster>
void launch(const SampleParams& p, size_t shared_bytes, LaunchStream stream) {
  launch_pdl_large_smem(sample_kernel<kCluster>,
                        {.grid = dim3(static_cast<unsigned>(p.num_rows * kCluster)), .block = dim3(kThreads),
                         .smem_bytes = shared_bytes, .cluster_ctas = kCluster},
                        stream, p);
}

int num_sms_of_current_device() {
  static std::array<std::atomic<int>, 64> cache{};  // per device; 0 = not read yet
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  std::atomic<int>& slot = cache[static_cast<size_t>(device) % cache.size()];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    CUDA_TRY(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

void sample(const SampleArgs& a, LaunchStream stream) {
  const int64_t num_rows = a.logits.shape[0], vocab = a.logits.shape[1];
  for (const ConstTensorView* t : {&a.penalty_tokens, &a.penalty_counts, &a.masked_tokens, &a.allowed_tokens}) {
    DI_CHECK(t->numel() == 0 || t->device == Device::kCuda,
             "cuda sample: the token lists and grammar masks must be in device memory");
  }
  const bool has_allowed = a.allowed_tokens.numel() > 0;
  DI_CHECK(!has_allowed || a.allowed_tokens.shape[0] <= INT_MAX, "cuda sample: ", a.allowed_tokens.shape.str(),
           " grammar masks exceed the kernel's row index");
  if (vocab > kMaxVocab) {
    throw UnsupportedOp(str_cat("cuda sample: a vocabulary of ", vocab, " tokens exceeds the kernel's ", kMaxVocab));
  }
  DI_CHECK(num_rows <= INT_MAX / 8, "cuda sample: ", num_rows, " rows exceed the grid");
  if (num_rows == 0) return;
  const int cluster = cluster_size(num_rows, num_sms_of_current_device());
  const int32_t per_thread = tokens_per_thread(vocab, cluster);
  // Room for the CTA's whole slice (small vocabularies), the logprob reserve, and the logprob threshold's scratch.
  const int64_t slice = (vocab + cluster - 1) / cluster + 8;
  const int64_t capacity =
      std::clamp<int64_t>(slice + int64_t{kMaxTopLogprobs} * per_thread, kThreads, kMaxCandidates);
  const size_t bitmap_bytes = size_t{2} * ((vocab + 63) / 64) * 2 * sizeof(uint32_t);
  const size_t shared_bytes = bitmap_bytes + static_cast<size_t>(capacity) * sizeof(uint2);
  const SampleParams p{.logits = a.logits.as<float>(),
                       .rows = a.rows.as<int32_t>(),
                       .penalty_tokens = a.penalty_tokens.numel() > 0 ? a.penalty_tokens.as<int32_t>() : nullptr,
                       .penalty_counts = a.penalty_counts.numel() > 0 ? a.penalty_counts.as<int32_t>() : nullptr,
                       .masked_tokens = a.masked_tokens.numel() > 0 ? a.masked_tokens.as<int32_t>() : nullptr,
                       .allowed_tokens = has_allowed ? reinterpret_cast<const uint32_t*>(a.allowed_tokens.as<int32_t>())
                                                     : nullptr,
                       .out = a.out.as<int32_t>(),
                       .num_rows = num_rows,
                       .vocab = static_cast<int32_t>(vocab),
                       .num_penalties = static_cast<int32_t>(a.penalty_tokens.numel()),
                       .num_masked = static_cast<int32_t>(a.masked_tokens.numel()),
                       .num_allowed_rows = has_allowed ? static_cast<int32_t>(a.allowed_tokens.shape[0]) : 0,
                       .allowed_words = has_allowed ? static_cast<int32_t>(a.allowed_tokens.shape[1]) : 0,
                       .candidate_capacity = static_cast<int32_t>(capacity),
                       .tokens_per_thread = per_thread};
  switch (cluster) {
    case 8: launch<8>(p, shared_bytes, stream); break;
    case 4: launch<4>(p, shared_bytes, stream); break;
    case 2: launch<2>(p, shared_bytes, stream); break;
    default: launch<1>(p, shared_bytes, stream); break;
  }
}

}  // namespace deepinfer::cuda
