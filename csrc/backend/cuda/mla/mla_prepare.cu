// mla_prepare kernel: one launch for the five steps between the projections and MLA. The grid is (token, 1 + head
// blocks):
//   - block (t, 0) owns token t's latent row: the kv_a_layernorm of c_kv, then the rope of k_pe. Each value is
//     written back in place and into the token's cache row from registers, so the cache write costs no second read
//     of the row. The norm is rms_norm_row.cuh, the rms_norm kernel's own reduction and rounding: in bfloat16, c_kv
//     comes out with the bits of the unfused rms_norm. (Its float32 path sums in the same order as the bfloat16 one,
//     not in the vectorized order of the float32 rms_norm: the two differ in the last bits.) Into an FP8 cache
//     (backend/ops/latent_fp8.h) the norm and the rope write only the row; after a barrier the block quantizes the
//     row as written back (latent_fp8_row.cuh), so the cache row is quantize_latent_fp8_row of the op's latent row,
//     its bf16-rounded c_kv on bf16. The group maxima need the whole row, hence the second read, from L1 or L2.
//   - block (t, 1 + b) rotates q_pe in heads [b * heads_per_block, (b + 1) * heads_per_block) of token t. Thread
//     (row, lane) takes pair `lane` (and lane + lanes, ... for rope dims past the block) in every `rows`-th head of
//     the range: one cos/sin serves all its heads, a warp reads consecutive pairs of one head (128 contiguous bytes
//     for DeepSeek's 64 bfloat16 rope values), and the pairs of kHeadsPerBatch heads are loaded before any is stored,
//     so they are in flight together. Each rotated pair goes to q and, for a decode token, to q_abs: q_pe is read
//     once, where rope then a copy read it twice.
// Splitting a token's heads over blocks keeps small decode batches spread over the SMs (128 heads of 64 rope values
// are 48 KB to move per token); the rope math (rope_rotation.cuh) is the rope kernel's, so every value matches it.
// At decode sizes the kernel is a link of the step's dependent chain: what it reads that no earlier kernel of the
// step writes (position, slot, the first pair's cos and sin, the norm weights) it reads before its grid dependency
// wait, and each thread keeps its c_kv elements in registers between the norm's two passes (PrepareAhead).
#include "backend/cuda/mla/mla_prepare.cuh"

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/latent_fp8_row.cuh"
#include "backend/cuda/mla/latent_fp8_rows.h"
#include "backend/cuda/mla/mla_prepare_params.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "backend/cuda/norm/rms_norm_row.cuh"
#include "backend/cuda/rope/rope_rotation.cuh"

namespace deepinfer::cuda {
namespace {

// What the cache rows hold: the latent's elements, or FP8 rows (backend/ops/latent_fp8.h).
enum class PrepareCache : uint8_t { kElements, kFp8 };

template <typename T, int kThreadsPerBlock, PrepareCache kCacheRows>
struct MlaPrepareTraits {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "float32 or bfloat16 elements");
  using Element = T;
  static constexpr int kThreads = kThreadsPerBlock;  // rms_norm_block_threads(rank): the norm's reduction order
  static constexpr int kHeadsPerBatch = 4;           // q_pe pairs a thread loads before it stores any
  static constexpr PrepareCache kCache = kCacheRows;
};

// Threads of a q block that share a head row: one per rope pair, at most the whole block.
__host__ __device__ constexpr int64_t pair_lanes(int64_t half, int threads) { return half < threads ? half : threads; }

// What a block reads before its grid dependency wait: the token's position and cache slot (step inputs, copied
// before the step's first kernel), its first rope pair's cos and sin, and (latent block) the weights of the thread's
// first kv_a_layernorm elements. After the wait only the rows the projections wrote are left to read.
template <typename Traits>
struct PrepareAhead {
  static constexpr int kNormCached = 4;  // c_kv elements a thread keeps: kv_lora_rank 512 at 128 threads
  int64_t slot = -1;
  float cos_a = 1.0f, sin_a = 0.0f;  // rope pair `first_pair`
  int64_t first_pair = 0;
  RowWeightsAhead<Traits::kThreads, kNormCached> norm;

  // The cos and sin of the thread's rope pair i: the one computed ahead, or (more pairs than lanes) computed here.
  __device__ __forceinline__ void pair_cos_sin(const MlaPrepareParams& p, int32_t position, int64_t i, float& c,
                                               float& s) const {
    if (i == first_pair) {
      c = cos_a;
      s = sin_a;
    } else {
      rope_cos_sin(position, p.inv_freq[i], p.attention_scaling, c, s);
    }
  }
};

// Into an FP8 cache: the norm and the rope write the latent row in place, then the block quantizes it into the cache
// row from memory, once every thread's values are there.
template <typename Traits>
__device__ __forceinline__ void prepare_latent_row_fp8(const MlaPrepareParams& p, int64_t t, int32_t position,
                                                       const PrepareAhead<Traits>& ahead) {
  using T = typename Traits::Element;
  T* row = static_cast<T*>(p.latent) + t * (p.rank + p.rope_dim);
  rms_norm_row<Traits::kThreads>(row, ahead.norm, p.kv_a_norm, p.rank, p.eps, [&](int64_t i, T v) { row[i] = v; });
  const int64_t half = p.rope_dim / 2;  // k_pe, as in prepare_latent_row_elements, into the row only
  for (int64_t i = threadIdx.x; i < half; i += Traits::kThreads) {
    float cos_a, sin_a;
    ahead.pair_cos_sin(p, position, i, cos_a, sin_a);
    const RopePair r = rope_rotate(load_rope_pair(row + p.rank, i, half, p.interleaved), cos_a, sin_a);
    store_rope_pair(row + p.rank, i, half, p.interleaved, r);
  }
  const int64_t slot = ahead.slot;
  if (slot < 0 || slot >= p.num_slots) return;  // the same for the whole block: no barrier is left waiting
  __syncthreads();  // the row as every thread of the block wrote it
  store_latent_fp8_row<Traits::kThreads>(row, p.fp8_row, static_cast<uint8_t*>(p.cache) + slot * p.fp8_row.row_bytes);
}

// Into a cache of elements: each value goes to the row and the cache row from registers.
template <typename Traits>
__device__ __forceinline__ void prepare_latent_row_elements(const MlaPrepareParams& p, int64_t t, int32_t position,
                                                            const PrepareAhead<Traits>& ahead) {
  using T = typename Traits::Element;
  const int64_t row_dim = p.rank + p.rope_dim;
  T* row = static_cast<T*>(p.latent) + t * row_dim;
  const int64_t slot = ahead.slot;
  T* cache_row = slot >= 0 && slot < p.num_slots ? static_cast<T*>(p.cache) + slot * row_dim : nullptr;
  rms_norm_row<Traits::kThreads>(row, ahead.norm, p.kv_a_norm, p.rank, p.eps, [&](int64_t i, T v) {
    row[i] = v;
    if (cache_row != nullptr) cache_row[i] = v;
  });
  // k_pe: the columns after c_kv, which the norm neither reads nor writes.
  const int64_t half = p.rope_dim / 2;
  for (int64_t i = threadIdx.x; i < half; i += Traits::kThreads) {
    float cos_a, sin_a;
    ahead.pair_cos_sin(p, position, i, cos_a, sin_a);
    const RopePair r = rope_rotate(load_rope_pair(row + p.rank, i, half, p.interleaved), cos_a, sin_a);
    store_rope_pair(row + p.rank, i, half, p.interleaved, r);
    if (cache_row != nullptr) store_rope_pair(cache_row + p.rank, i, half, p.interleaved, r);
  }
}

template <typename Traits>
__device__ __forceinline__ void prepare_latent_row(const MlaPrepareParams& p, int64_t t, int32_t position,
                                                   const PrepareAhead<Traits>& ahead) {
  if constexpr (Traits::kCache == PrepareCache::kFp8) {
    prepare_latent_row_fp8<Traits>(p, t, position, ahead);
  } else {
    prepare_latent_row_elements<Traits>(p, t, position, ahead);
  }
}

template <typename Traits>
__device__ __forceinline__ void rotate_q_heads(const MlaPrepareParams& p, int64_t t, int64_t block, int32_t position,
                                               const PrepareAhead<Traits>& ahead) {
  using T = typename Traits::Element;
  constexpr int kBatch = Traits::kHeadsPerBatch;
  const int64_t half = p.rope_dim / 2;
  const int64_t lanes = pair_lanes(half, Traits::kThreads), rows = Traits::kThreads / lanes;
  const int64_t lane = threadIdx.x % lanes, row = threadIdx.x / lanes;
  if (row >= rows) return;  // past the last whole row of lanes: no pair (no barrier follows)
  const int64_t qk_dim = p.nope + p.rope_dim, abs_dim = p.rank + p.rope_dim;
  T* q_pe = static_cast<T*>(p.q) + t * p.num_heads * qk_dim + p.nope;  // head 0's rope slice
  T* abs_pe = t < p.num_decode ? static_cast<T*>(p.q_abs) + t * p.num_heads * abs_dim + p.rank : nullptr;
  const int64_t h_begin = block * p.heads_per_block;
  const int64_t h_end = min(p.num_heads, h_begin + p.heads_per_block);
  for (int64_t i = lane; i < half; i += lanes) {
    float cos_a, sin_a;
    ahead.pair_cos_sin(p, position, i, cos_a, sin_a);
    for (int64_t h0 = h_begin + row; h0 < h_end; h0 += rows * kBatch) {
      RopePair x[kBatch] = {};
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t h = h0 + b * rows;
        if (h < h_end) x[b] = load_rope_pair(q_pe + h * qk_dim, i, half, p.interleaved);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t h = h0 + b * rows;
        if (h >= h_end) break;
        const RopePair r = rope_rotate(x[b], cos_a, sin_a);
        store_rope_pair(q_pe + h * qk_dim, i, half, p.interleaved, r);
        if (abs_pe != nullptr) store_rope_pair(abs_pe + h * abs_dim, i, half, p.interleaved, r);
      }
    }
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) mla_prepare_kernel(__grid_constant__ const MlaPrepareParams p) {
  const int64_t t = blockIdx.x;
  const bool latent_block = blockIdx.y == 0;
  // Before the wait: step inputs and constants only (ptx.cuh's rule 1; the step's inputs were copied before its
  // first kernel).
  PrepareAhead<Traits> ahead;
  const int32_t position = p.positions[t];
  const int64_t half = p.rope_dim / 2;
  ahead.first_pair = latent_block || half == 0 ? threadIdx.x : threadIdx.x % pair_lanes(half, Traits::kThreads);
  if (ahead.first_pair < half) {
    rope_cos_sin(position, p.inv_freq[ahead.first_pair], p.attention_scaling, ahead.cos_a, ahead.sin_a);
  }
  if (latent_block) {
    ahead.slot = p.slot_mapping[t];
    ahead.norm.load(p.kv_a_norm, p.rank);
  }
  ptx::griddep_wait();  // the latent and q come from earlier kernels; the cache rows are written after them
  ptx::griddep_launch_dependents();
  if (latent_block) {
    prepare_latent_row<Traits>(p, t, position, ahead);
  } else {
    rotate_q_heads<Traits>(p, t, blockIdx.y - 1, position, ahead);
  }
}

template <typename Traits>
void launch(MlaPrepareParams p, LaunchStream stream) {
  const int64_t half = p.rope_dim / 2;
  int64_t head_blocks = 0;
  if (half > 0 && p.num_heads > 0) {
    p.heads_per_block = Traits::kThreads / pair_lanes(half, Traits::kThreads) * Traits::kHeadsPerBatch;
    head_blocks = (p.num_heads + p.heads_per_block - 1) / p.heads_per_block;
  }
  DI_CHECK(1 + head_blocks <= 65535, "cuda mla_prepare: ", p.num_heads, " heads need ", head_blocks,
           " blocks per token, more than the grid holds");
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(1 + head_blocks));
  launch_pdl(mla_prepare_kernel<Traits>, {.grid = grid, .block = dim3(Traits::kThreads)}, stream, p);
}

template <typename T, PrepareCache kCache>
void launch_for_rank(const MlaPrepareParams& p, LaunchStream stream) {
  if (rms_norm_block_threads(p.rank) == 128) {
    launch<MlaPrepareTraits<T, 128, kCache>>(p, stream);
  } else {
    launch<MlaPrepareTraits<T, 512, kCache>>(p, stream);
  }
}

}  // namespace

void mla_prepare(const MlaPrepareArgs& a, LaunchStream stream) {
  constexpr const char* kOp = "cuda mla_prepare";
  a.validate();  // shapes, dtypes, one device; never reads device memory
  const int64_t tokens = a.num_tokens();
  if (tokens == 0) return;
  // validate() put every tensor that is not empty on one device; the latent is not empty.
  DI_CHECK(a.latent.device == Device::kCuda, kOp, ": tensors must be in device memory");
  DI_CHECK(tokens <= INT_MAX, kOp, ": ", tokens, " tokens exceed the grid");
  const int64_t num_decode = a.num_decode_tokens();
  const bool fp8 = is_fp8_latent_cache(a.cache);
  const LatentFp8RowParams fp8_row =
      fp8 ? fp8_row_params(checked_fp8_latent_layout(a.cache, a.kv_lora_rank, a.rope_dim(), kOp))
          : LatentFp8RowParams{};
  const MlaPrepareParams p{.latent = a.latent.data,
                           .q = a.q.data,
                           .q_abs = num_decode > 0 ? a.q_abs.data : nullptr,
                           .cache = a.cache.data,
                           .slot_mapping = a.slot_mapping.as<int32_t>(),
                           .positions = a.positions.as<int32_t>(),
                           .kv_a_norm = a.kv_a_norm.as<float>(),
                           .inv_freq = a.inv_freq.as<float>(),
                           .num_tokens = tokens,
                           .num_decode = num_decode,
                           .num_heads = a.q.shape[1],
                           .rank = a.kv_lora_rank,
                           .nope = a.q.shape[2] - a.rope_dim(),
                           .rope_dim = a.rope_dim(),
                           .num_slots = a.cache.shape[0] * a.cache.shape[1],
                           .eps = a.eps,
                           .attention_scaling = a.attention_scaling,
                           .interleaved = a.interleaved,
                           .fp8_row = fp8_row};
  dispatch_activation(a.latent.dtype, kOp, [&](auto element) {
    using T = decltype(element);
    if (fp8) {
      launch_for_rank<T, PrepareCache::kFp8>(p, stream);
    } else {
      launch_for_rank<T, PrepareCache::kElements>(p, stream);
    }
  });
}

}  // namespace deepinfer::cuda
