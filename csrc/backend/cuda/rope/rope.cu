// Rotary embedding kernel. One thread per (token, group of heads, pair): it computes its pair's cos and sin once
// (precise sincosf: positions reach 10^5 radians) and rotates that pair in each head of its group. Consecutive
// threads take consecutive pairs, so a warp's accesses are contiguous; interleaved pairs move as one 4- or 8-byte
// access when aligned. The math (rope_rotation.cuh) is the one mla_prepare's kernel uses.
#include "backend/cuda/rope/rope.cuh"

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "backend/cuda/rope/rope_rotation.cuh"

namespace deepinfer::cuda {
namespace {

template <typename T>
struct RopeTraits {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "float32 or bfloat16 elements");
  using Element = T;
  static constexpr int kThreads = 256;
  static constexpr int kHeadsPerThread = 4;  // heads that share one sincosf
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) rope_kernel(__grid_constant__ const RopeParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = typename Traits::Element;
  T* x = static_cast<T*>(p.x);
  const int64_t half = p.rot_dim / 2;
  const int64_t head_groups = (p.num_heads + Traits::kHeadsPerThread - 1) / Traits::kHeadsPerThread;
  const int64_t items = p.num_tokens * head_groups * half;
  const GridStride<Traits::kThreads> grid;
  for (int64_t w = grid.first; w < items; w += grid.step) {
    const int64_t i = w % half;
    const int64_t rest = w / half;
    const int64_t group = rest % head_groups;
    const int64_t t = rest / head_groups;
    float cos_a, sin_a;
    rope_cos_sin(p.positions[t], p.inv_freq[i], p.attention_scaling, cos_a, sin_a);
    const int64_t h_end = min(p.num_heads, (group + 1) * Traits::kHeadsPerThread);
    for (int64_t h = group * Traits::kHeadsPerThread; h < h_end; ++h) {
      T* slice = x + t * p.token_stride + h * p.head_stride;
      store_rope_pair(slice, i, half, p.interleaved,
                      rope_rotate(load_rope_pair(slice, i, half, p.interleaved), cos_a, sin_a));
    }
  }
}

}  // namespace

void rope(const RopeParams& p, DType dtype, LaunchStream stream) {
  DI_CHECK(p.num_tokens >= 0 && p.num_heads >= 0 && p.rot_dim >= 0 && p.rot_dim % 2 == 0, "cuda rope: ",
           p.num_tokens, " tokens, ", p.num_heads, " heads, rot_dim ", p.rot_dim, " (must be even)");
  if (p.num_tokens == 0 || p.num_heads == 0 || p.rot_dim == 0) return;
  DI_CHECK(p.x != nullptr && p.positions != nullptr && p.inv_freq != nullptr,
           "cuda rope: x, positions and inv_freq must be device pointers");
  dispatch_activation(dtype, "cuda rope", [&](auto element) {
    using Traits = RopeTraits<decltype(element)>;
    const int64_t head_groups = (p.num_heads + Traits::kHeadsPerThread - 1) / Traits::kHeadsPerThread;
    const int64_t items = p.num_tokens * head_groups * (p.rot_dim / 2);
    launch_pdl(rope_kernel<Traits>, grid_stride_shape<Traits::kThreads>(items), stream, p);
  });
}

}  // namespace deepinfer::cuda
