// Elementwise kernels: grid-stride loops over 16-byte vectors of elements when every pointer and row allows it,
// single elements otherwise. Memory-bound: one read of each input, one write of the output.
#include "backend/cuda/elementwise/elementwise.cuh"

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_params.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda {
namespace {

template <typename T, bool kVectorized>
struct ElementwiseTraits {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "float32 or bfloat16 elements");
  using Element = T;
  static constexpr bool kVector = kVectorized;
  static constexpr int kVec = kVectorized ? Vec16<T>::kSize : 1;  // elements per thread step
  static constexpr int kThreads = 256;
};

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) add_kernel(__grid_constant__ const AddParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = typename Traits::Element;
  T* x = static_cast<T*>(p.x);
  const T* y = static_cast<const T*>(p.y);
  const GridStride<Traits::kThreads> grid;
  int64_t done = 0;
  if constexpr (Traits::kVector) {
    const int64_t vectors = p.n / Traits::kVec;
    for (int64_t v = grid.first; v < vectors; v += grid.step) {
      Vec16<T> a = load16(x + v * Traits::kVec);
      const Vec16<T> b = load16(y + v * Traits::kVec);
#pragma unroll
      for (int j = 0; j < Traits::kVec; ++j) a.v[j] = from_float<T>(to_float(a.v[j]) + to_float(b.v[j]));
      store16(x + v * Traits::kVec, a);
    }
    done = vectors * Traits::kVec;
  }
  for (int64_t i = done + grid.first; i < p.n; i += grid.step) x[i] = from_float<T>(to_float(x[i]) + to_float(y[i]));
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) silu_mul_kernel(__grid_constant__ const SiluMulParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = typename Traits::Element;
  const T* gate_up = static_cast<const T*>(p.gate_up);
  T* out = static_cast<T*>(p.out);
  // Work item w covers kVec consecutive outputs of one row (kVec divides inter on the vector path).
  const int64_t per_row = p.inter / Traits::kVec;
  const int64_t items = p.rows * per_row;
  const GridStride<Traits::kThreads> grid;
  for (int64_t w = grid.first; w < items; w += grid.step) {
    const int64_t row = w / per_row;
    const int64_t col = (w - row * per_row) * Traits::kVec;
    const T* gate = gate_up + row * 2 * p.inter + col;
    const T* up = gate + p.inter;
    T* o = out + row * p.inter + col;
    if constexpr (Traits::kVector) {
      const Vec16<T> g = load16(gate);
      const Vec16<T> u = load16(up);
      Vec16<T> r;
#pragma unroll
      for (int j = 0; j < Traits::kVec; ++j) r.v[j] = from_float<T>(silu(to_float(g.v[j])) * to_float(u.v[j]));
      store16(o, r);
    } else {
      *o = from_float<T>(silu(to_float(*gate)) * to_float(*up));
    }
  }
}

template <typename Traits>
void launch_add(const AddParams& p, LaunchStream stream) {
  launch_pdl(add_kernel<Traits>, grid_stride_shape<Traits::kThreads>(p.n / Traits::kVec), stream, p);
}

template <typename Traits>
void launch_silu_mul(const SiluMulParams& p, LaunchStream stream) {
  const int64_t items = p.rows * (p.inter / Traits::kVec);
  launch_pdl(silu_mul_kernel<Traits>, grid_stride_shape<Traits::kThreads>(items), stream, p);
}

void check_on_device(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.device == Device::kCuda, op, ": ", name, " must be in device memory");
}

}  // namespace

void add(const AddArgs& a, LaunchStream stream) {
  DI_CHECK(a.x.numel() == a.y.numel(), "cuda add: x ", a.x.shape.str(), " y ", a.y.shape.str());
  DI_CHECK(a.x.dtype == a.y.dtype, "cuda add: x is ", dtype_name(a.x.dtype), " but y is ", dtype_name(a.y.dtype));
  check_on_device(a.x, "cuda add", "x");
  check_on_device(a.y, "cuda add", "y");
  const AddParams p{.x = a.x.data, .y = a.y.data, .n = a.x.numel()};
  if (p.n == 0) return;
  dispatch_activation(a.x.dtype, "cuda add", [&](auto element) {
    using T = decltype(element);
    if (is_aligned(p.x, 16) && is_aligned(p.y, 16)) {
      launch_add<ElementwiseTraits<T, true>>(p, stream);
    } else {
      launch_add<ElementwiseTraits<T, false>>(p, stream);
    }
  });
}

void silu_mul(const SiluMulArgs& a, LaunchStream stream) {
  DI_CHECK(a.gate_up.shape.ndim() == 2 && a.out.shape.ndim() == 2 && a.gate_up.shape[0] == a.out.shape[0] &&
               a.gate_up.shape[1] == 2 * a.out.shape[1],
           "cuda silu_mul: gate_up ", a.gate_up.shape.str(), " out ", a.out.shape.str());
  DI_CHECK(a.gate_up.dtype == a.out.dtype, "cuda silu_mul: gate_up is ", dtype_name(a.gate_up.dtype), " but out is ",
           dtype_name(a.out.dtype));
  check_on_device(a.gate_up, "cuda silu_mul", "gate_up");
  check_on_device(a.out, "cuda silu_mul", "out");
  const SiluMulParams p{.gate_up = a.gate_up.data, .out = a.out.data, .rows = a.out.shape[0],
                        .inter = a.out.shape[1]};
  if (p.rows == 0 || p.inter == 0) return;
  dispatch_activation(a.out.dtype, "cuda silu_mul", [&](auto element) {
    using T = decltype(element);
    if (p.inter % Vec16<T>::kSize == 0 && is_aligned(p.gate_up, 16) && is_aligned(p.out, 16)) {
      launch_silu_mul<ElementwiseTraits<T, true>>(p, stream);
    } else {
      launch_silu_mul<ElementwiseTraits<T, false>>(p, stream);
    }
  });
}

}  // namespace deepinfer::cuda
