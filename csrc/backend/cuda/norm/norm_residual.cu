// RMSNorm with an optional fused residual add: one block per row. Pass 1: each thread adds (and stores) its slice of
// the residual and sums the squares of the stored values in fp32; the block reduces the sums (warp shuffles, then one
// value per warp through shared memory). Pass 2: each thread writes the normalized values of its own slice, kept in
// registers from pass 1 (the first kKeptChunks chunks, with weights loaded before the grid dependency wait) or read
// again: rms_norm_row.cuh's RowSlice and RowWeightsAhead, the rms_norm kernel's way. Every thread touches the same elements in both passes, so out may alias x.
#include "backend/cuda/norm/norm_residual.cuh"

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"
#include "backend/cuda/norm/norm_residual_params.h"
#include "backend/cuda/norm/rms_norm_row.cuh"

namespace deepinfer::cuda {
namespace {

enum class Residual : uint8_t { kNone, kAdd };

template <typename T, Residual kResidualMode, bool kVectorized, int kThreadsPerBlock>
struct NormTraits {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "float32 or bfloat16 rows");
  static_assert(kThreadsPerBlock % 32 == 0 && kThreadsPerBlock >= 32 && kThreadsPerBlock <= 1024, "whole warps");
  using Element = T;
  static constexpr bool kAddResidual = kResidualMode == Residual::kAdd;
  static constexpr bool kVector = kVectorized;
  static constexpr int kVec = kVectorized ? Vec16<T>::kSize : 1;
  static constexpr int kThreads = kThreadsPerBlock;
};

// kVec consecutive elements starting at element `i` (a multiple of kVec) as fp32.
template <typename Traits>
struct Chunk {
  float v[Traits::kVec];
};

template <typename Traits>
__device__ __forceinline__ Chunk<Traits> load_chunk(const typename Traits::Element* p) {
  Chunk<Traits> c;
  if constexpr (Traits::kVector) {
    const auto raw = load16(p);
#pragma unroll
    for (int j = 0; j < Traits::kVec; ++j) c.v[j] = to_float(raw.v[j]);
  } else {
    c.v[0] = to_float(*p);
  }
  return c;
}

// Rounds to the element type, stores, and returns the rounded values.
template <typename Traits>
__device__ __forceinline__ Chunk<Traits> store_chunk(typename Traits::Element* p, const Chunk<Traits>& c) {
  using T = typename Traits::Element;
  Chunk<Traits> rounded;
  if constexpr (Traits::kVector) {
    Vec16<T> raw;
#pragma unroll
    for (int j = 0; j < Traits::kVec; ++j) {
      raw.v[j] = from_float<T>(c.v[j]);
      rounded.v[j] = to_float(raw.v[j]);
    }
    store16(p, raw);
  } else {
    const T r = from_float<T>(c.v[0]);
    *p = r;
    rounded.v[0] = to_float(r);
  }
  return rounded;
}

// Chunks a thread keeps in registers between the passes, their weights loaded before the grid dependency wait (a
// constant): V2-Lite's 2048 at 128 threads and V3's 7168 at 512 are two chunks a thread. Later chunks are read again.
constexpr int kKeptChunks = 2;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) norm_residual_kernel(__grid_constant__ const NormResidualParams p) {
  if (p.trigger_early) ptx::griddep_launch_dependents();  // the next kernel reads only constants before its wait
  const RowSlice<Traits::kThreads, Traits::kVec, kKeptChunks> slice;
  RowWeightsAhead<Traits::kThreads, kKeptChunks, Traits::kVec> weight;
  weight.load(p.weight, p.dim, slice);
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using T = typename Traits::Element;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  T* residual = Traits::kAddResidual ? static_cast<T*>(p.residual) + row * p.residual_row_stride : nullptr;
  T* out = static_cast<T*>(p.out) + row * p.out_row_stride;
  const T* source = Traits::kAddResidual ? residual : x;  // the values normalized in pass 2
  // Pass 1 on element i: the value normalized in pass 2 (the residual sum as stored, rounded), its squares summed.
  float sum_sq = 0.0f;
  const auto pass1 = [&](int64_t i) {
    Chunk<Traits> v = load_chunk<Traits>(x + i);
    if constexpr (Traits::kAddResidual) {
      const Chunk<Traits> r = load_chunk<Traits>(residual + i);
#pragma unroll
      for (int j = 0; j < Traits::kVec; ++j) v.v[j] += r.v[j];
      v = store_chunk<Traits>(residual + i, v);
    }
#pragma unroll
    for (int j = 0; j < Traits::kVec; ++j) sum_sq = fmaf(v.v[j], v.v[j], sum_sq);
    return v;
  };
  Chunk<Traits> kept[kKeptChunks];
  slice.for_each(p.dim, [&](int c, int64_t i) { kept[c] = pass1(i); }, [&](int64_t i) { pass1(i); });
  const float inv_rms = rsqrtf(sum_over_block<Traits::kThreads>(sum_sq) / static_cast<float>(p.dim) + p.eps);
  const auto pass2 = [&](int64_t i, Chunk<Traits> v, const float (&w)[Traits::kVec]) {
#pragma unroll
    for (int j = 0; j < Traits::kVec; ++j) v.v[j] = w[j] * (v.v[j] * inv_rms);
    store_chunk<Traits>(out + i, v);
  };
  slice.for_each(
      p.dim, [&](int c, int64_t i) { pass2(i, kept[c], weight.w[c]); },
      [&](int64_t i) {
        float w[Traits::kVec];
        load_weights(p.weight + i, w);
        pass2(i, load_chunk<Traits>(source + i), w);
      });
}

template <typename Traits>
void launch(const NormResidualParams& p, LaunchStream stream) {
  launch_pdl(norm_residual_kernel<Traits>,
             {.grid = dim3(static_cast<unsigned>(p.rows)), .block = dim3(Traits::kThreads)}, stream, p);
}

template <typename T, Residual kMode, bool kVectorized>
void launch_sized(const NormResidualParams& p, LaunchStream stream) {
  // Short rows get a small block; hidden-size rows (2048..7168) enough threads to keep the loads in flight.
  const int64_t steps = kVectorized ? p.dim / Vec16<T>::kSize : p.dim;
  if (steps <= 256) {
    launch<NormTraits<T, kMode, kVectorized, 128>>(p, stream);
  } else {
    launch<NormTraits<T, kMode, kVectorized, 512>>(p, stream);
  }
}

template <Residual kMode>
void launch_norm(const NormResidualParams& p, DType dtype, const char* op, LaunchStream stream) {
  DI_CHECK(p.rows <= INT_MAX, op, ": ", p.rows, " rows exceed the grid");
  if (p.rows == 0 || p.dim == 0) return;
  dispatch_activation(dtype, op, [&](auto element) {
    using T = decltype(element);
    constexpr int kVec = Vec16<T>::kSize;
    const bool residual_ok =
        kMode == Residual::kNone || (is_aligned(p.residual, 16) && p.residual_row_stride % kVec == 0);
    const bool vector = p.dim % kVec == 0 && p.x_row_stride % kVec == 0 && p.out_row_stride % kVec == 0 &&
                        is_aligned(p.x, 16) && is_aligned(p.out, 16) && is_aligned(p.weight, 16) && residual_ok;
    if (vector) {
      launch_sized<T, kMode, true>(p, stream);
    } else {
      launch_sized<T, kMode, false>(p, stream);
    }
  });
}

void check_on_device(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.device == Device::kCuda, op, ": ", name, " must be in device memory");
}

}  // namespace

void add_rms_norm(const AddRmsNormArgs& a, bool trigger_early, LaunchStream stream) {
  constexpr const char* kOp = "cuda add_rms_norm";
  DI_CHECK(a.residual.shape.ndim() == 2 && a.x.shape == a.residual.shape && a.out.shape == a.residual.shape &&
               a.weight.numel() == a.residual.shape[1],
           kOp, ": residual ", a.residual.shape.str(), " x ", a.x.shape.str(), " weight ", a.weight.shape.str(),
           " out ", a.out.shape.str());
  DI_CHECK(a.x.dtype == a.residual.dtype && a.out.dtype == a.residual.dtype && a.weight.dtype == DType::kF32, kOp,
           ": residual, x and out must share one dtype and weight be float32, got ", dtype_name(a.residual.dtype),
           ", ", dtype_name(a.x.dtype), ", ", dtype_name(a.out.dtype), " and ", dtype_name(a.weight.dtype));
  DI_CHECK(a.out.data != a.residual.data || a.residual.numel() == 0, kOp, ": out must not alias residual");
  check_on_device(a.residual, kOp, "residual");
  check_on_device(a.x, kOp, "x");
  check_on_device(a.weight, kOp, "weight");
  check_on_device(a.out, kOp, "out");
  const int64_t dim = a.residual.shape[1];
  launch_norm<Residual::kAdd>({.x = a.x.data, .residual = a.residual.data,
                               .weight = static_cast<const float*>(a.weight.data), .out = a.out.data,
                               .rows = a.residual.shape[0], .dim = dim, .x_row_stride = dim,
                               .residual_row_stride = dim, .out_row_stride = dim, .eps = a.eps,
                               .trigger_early = trigger_early},
                              a.residual.dtype, kOp, stream);
}

void rms_norm_f32(const RmsNormArgs& a, LaunchStream stream) {
  constexpr const char* kOp = "cuda rms_norm";
  DI_CHECK(a.x.dtype == DType::kF32 && a.out.dtype == DType::kF32 && a.weight.dtype == DType::kF32, kOp,
           ": x, weight and out must be float32 here, got ", dtype_name(a.x.dtype), ", ", dtype_name(a.weight.dtype),
           " and ", dtype_name(a.out.dtype));
  DI_CHECK(a.x.shape.ndim() == 2 && a.out.shape == a.x.shape && a.weight.numel() == a.x.shape[1], kOp, ": x ",
           a.x.shape.str(), " weight ", a.weight.shape.str(), " out ", a.out.shape.str());
  const int64_t dim = a.x.shape[1];
  DI_CHECK(a.row_stride == 0 || a.row_stride >= dim, kOp, ": row stride ", a.row_stride, " < row size ", dim);
  check_on_device(a.x, kOp, "x");
  check_on_device(a.weight, kOp, "weight");
  check_on_device(a.out, kOp, "out");
  const int64_t stride = a.row_stride == 0 ? dim : a.row_stride;
  launch_norm<Residual::kNone>({.x = a.x.data, .residual = nullptr, .weight = static_cast<const float*>(a.weight.data),
                                .out = a.out.data, .rows = a.x.shape[0], .dim = dim, .x_row_stride = stride,
                                .residual_row_stride = 0, .out_row_stride = stride, .eps = a.eps},
                               DType::kF32, kOp, stream);
}

}  // namespace deepinfer::cuda
