// Data movement on the CPU: row gathers and strided 2-D copies, byte for byte.
#include <cstddef>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void gather_rows(const GatherRowsArgs& a) {
  a.validate();
  expect_host(a.out, "gather_rows");
  const size_t row_bytes = static_cast<size_t>(a.src.shape[1]) * dtype_size(a.src.dtype);
  const auto* src = static_cast<const std::byte*>(a.src.data);
  auto* out = static_cast<std::byte*>(a.out.data);
  const int32_t* indices = a.indices.as<int32_t>();
  for (int64_t i = 0; i < a.out.shape[0]; ++i) {
    std::memcpy(out + static_cast<size_t>(i) * row_bytes, src + static_cast<size_t>(indices[i]) * row_bytes,
                row_bytes);
  }
}

void copy_strided(const CopyStridedArgs& a) {
  a.validate();
  expect_host(a.dst, "copy_strided");
  const int64_t rows = a.src.shape[0], cols = a.src.shape[1];
  const size_t elem = dtype_size(a.src.dtype);
  const size_t src_stride = static_cast<size_t>(a.src_row_stride == 0 ? cols : a.src_row_stride) * elem;
  const size_t dst_stride = static_cast<size_t>(a.dst_row_stride == 0 ? cols : a.dst_row_stride) * elem;
  const auto* src = static_cast<const std::byte*>(a.src.data);
  auto* dst = static_cast<std::byte*>(a.dst.data);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * dst_stride, src + static_cast<size_t>(r) * src_stride,
                static_cast<size_t>(cols) * elem);
  }
}

}  // namespace deepinfer::cpu
