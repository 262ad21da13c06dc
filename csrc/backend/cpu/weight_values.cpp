#include "backend/cpu/weight_values.h"

#include <span>

#include "core/error.h"
#include "core/fp8.h"
#include "core/int4.h"

namespace deepinfer::cpu {

const float* weight_values(const WeightView& w, std::vector<float>& scratch) {
  if (w.is_packed4()) {
    DI_CHECK(w.shape.ndim() == 2 && w.device == Device::kCpu, "cpu: a packed 4-bit weight is read as a 2-D host ",
             "matrix, got ", w.shape.str(), " on ", device_name(w.device));
    const int64_t rows = w.shape[0], cols = w.shape[1];
    scratch.resize(static_cast<size_t>(rows * cols));
    const std::span<const int32_t> words{w.as<int32_t>(), static_cast<size_t>(rows * cols / 8)};
    const std::span<const float> scales{w.scale_inv.as<float>(), static_cast<size_t>(w.scale_inv.numel())};
    if (w.is_fp4()) {
      dequantize_packed_fp4(words, scales, rows, cols, w.group_size(), scratch);
    } else {
      dequantize_packed_int4(words, scales, {w.zeros.as<int32_t>(), static_cast<size_t>(w.zeros.numel())}, rows,
                             cols, w.group_size(), scratch);
    }
    return scratch.data();
  }
  if (!w.is_fp8()) return w.f32();
  DI_CHECK(w.shape.ndim() == 2 && w.device == Device::kCpu, "cpu: an FP8 weight is read as a 2-D host matrix, got ",
           w.shape.str(), " on ", device_name(w.device));
  const int64_t rows = w.shape[0], cols = w.shape[1];
  scratch.resize(static_cast<size_t>(rows * cols));
  dequantize_fp8_blocks({w.as<uint8_t>(), static_cast<size_t>(rows * cols)}, rows, cols,
                        {w.scale_inv.as<float>(), static_cast<size_t>(w.scale_inv.numel())}, {kFp8Block, kFp8Block},
                        scratch);
  return scratch.data();
}

}  // namespace deepinfer::cpu
