// Strided 2-D copy: a grid-stride loop over (row, unit) pairs, in the widest unit (16, 8, 4, 2 or 1 bytes) that the
// row size, both strides and both base addresses allow. Consecutive threads take consecutive units of a row, so a
// warp's loads and stores are contiguous within each row.
#include "backend/cuda/memory/copy_strided.cuh"

#include <cstddef>

#include "backend/cuda/memory/copy_strided_params.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda {
namespace {

template <typename Unit>
using CopyTraits = CopyUnitTraits<Unit, 256>;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) copy_strided_kernel(__grid_constant__ const CopyStridedParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  using Unit = typename Traits::Unit;
  const int64_t units_per_row = p.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t items = p.rows * units_per_row;
  const GridStride<Traits::kThreads> grid;
  const auto* src = static_cast<const std::byte*>(p.src);
  auto* dst = static_cast<std::byte*>(p.dst);
  for (int64_t w = grid.first; w < items; w += grid.step) {
    const int64_t row = w / units_per_row;
    const int64_t offset = (w - row * units_per_row) * static_cast<int64_t>(sizeof(Unit));
    *reinterpret_cast<Unit*>(dst + row * p.dst_stride_bytes + offset) =
        *reinterpret_cast<const Unit*>(src + row * p.src_stride_bytes + offset);
  }
}

}  // namespace

void copy_strided(const CopyStridedArgs& a, LaunchStream stream) {
  constexpr const char* kOp = "cuda copy_strided";
  DI_CHECK(a.src.shape.ndim() == 2 && a.dst.shape == a.src.shape, kOp, ": src ", a.src.shape.str(), " dst ",
           a.dst.shape.str());
  const int64_t rows = a.src.shape[0], cols = a.src.shape[1];
  DI_CHECK((a.src_row_stride == 0 || a.src_row_stride >= cols) && (a.dst_row_stride == 0 || a.dst_row_stride >= cols),
           kOp, ": row strides ", a.src_row_stride, " and ", a.dst_row_stride, " for rows of ", cols);
  DI_CHECK(a.src.dtype == a.dst.dtype, kOp, ": src is ", dtype_name(a.src.dtype), " but dst is ",
           dtype_name(a.dst.dtype));
  DI_CHECK(a.src.device == Device::kCuda && a.dst.device == Device::kCuda, kOp,
           ": src and dst must be in device memory");
  const auto elem = static_cast<int64_t>(dtype_size(a.src.dtype));
  const CopyStridedParams p{.src = a.src.data, .dst = a.dst.data, .rows = rows, .row_bytes = cols * elem,
                            .src_stride_bytes = (a.src_row_stride == 0 ? cols : a.src_row_stride) * elem,
                            .dst_stride_bytes = (a.dst_row_stride == 0 ? cols : a.dst_row_stride) * elem};
  if (p.rows == 0 || p.row_bytes == 0) return;
  // One unit size for every row: it must divide the row size, both strides and both base addresses.
  const int unit = copy_unit_bytes(p.src, p.dst, p.row_bytes | p.src_stride_bytes | p.dst_stride_bytes);
  dispatch_copy_unit(unit, [&](auto u) {
    using Traits = CopyTraits<decltype(u)>;
    const int64_t items = p.rows * (p.row_bytes / static_cast<int64_t>(sizeof(u)));
    launch_pdl(copy_strided_kernel<Traits>, grid_stride_shape<Traits::kThreads>(items), stream, p);
  });
}

}  // namespace deepinfer::cuda
