#include "model/fp4.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace deepinfer {

float e8m0_to_float(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

void PackedFp4::validate() const {
  DI_CHECK(rows > 0 && cols > 0 && cols % 2 == 0, "FP4 weight [", rows, ", ", cols, "]: K must be even (two ",
           "values a byte)");
  DI_CHECK(group_size > 0 && cols % group_size == 0, "FP4 weight [", rows, ", ", cols, "] with group size ",
           group_size, ": the group size must divide K");
  DI_CHECK(static_cast<int64_t>(codes.size()) == rows * cols / 2 &&
               static_cast<int64_t>(scales.size()) == rows * (cols / group_size),
           "FP4 weight [", rows, ", ", cols, "] group ", group_size, ": ", codes.size(), " code bytes and ",
           scales.size(), " scales; expected ", rows * cols / 2, " and ", rows * (cols / group_size));
}

void dequantize_fp4_rows(const PackedFp4& w, int64_t first_row, int64_t num_rows, std::span<float> out) {
  w.validate();
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= w.rows, "rows [", first_row, ", ",
           first_row + num_rows, ") out of range for an FP4 weight of ", w.rows, " rows");
  DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * w.cols, "output holds ", out.size(), " floats for ",
           num_rows, " rows of ", w.cols);
  const int64_t k_dim = w.cols, groups = k_dim / w.group_size;
#pragma omp parallel for schedule(static) if (num_rows * k_dim >= (int64_t{1} << 18))
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t n = first_row + r;
    const auto* row = reinterpret_cast<const uint8_t*>(w.codes.data()) + n * (k_dim / 2);
    float* dst = out.data() + r * k_dim;
    for (int64_t k = 0; k < k_dim; ++k) {
      const uint8_t byte = row[k / 2];
      const int code = (k % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      dst[k] = kE2m1ToFloat[static_cast<size_t>(code)] * w.scales[static_cast<size_t>(n * groups + k / w.group_size)];
    }
  }
}

}  // namespace deepinfer
