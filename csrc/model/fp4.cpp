#include "model/fp4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/fp8.h"

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

uint8_t nearest_e2m1(float v) {
  const float m = std::min(std::fabs(v), 6.0f);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(kE2m1ToFloat[static_cast<size_t>(i)] - m);
    const float d_best = std::fabs(kE2m1ToFloat[static_cast<size_t>(best)] - m);
    if (d < d_best || (d == d_best && i % 2 == 0)) best = i;  // a tie: the even mantissa (index 2k)
  }
  return static_cast<uint8_t>(best | (std::signbit(v) && best != 0 ? 8 : 0));
}

void round_fp4(std::span<const float> values, int64_t cols, int64_t group_size, Fp4Scaling scaling,
               std::span<uint8_t> codes, std::span<float> scales) {
  DI_CHECK(cols > 0 && group_size > 0 && cols % group_size == 0 && values.size() % static_cast<size_t>(cols) == 0,
           "FP4 rounding: ", values.size(), " values in rows of ", cols, " with groups of ", group_size);
  const auto groups = static_cast<int64_t>(values.size()) / group_size;
  DI_CHECK(codes.size() == values.size() && static_cast<int64_t>(scales.size()) == groups, "FP4 rounding: ",
           codes.size(), " codes and ", scales.size(), " scales for ", values.size(), " values in groups of ",
           group_size);
#pragma omp parallel for schedule(static) if (values.size() >= (size_t{1} << 18))
  for (int64_t g = 0; g < groups; ++g) {
    const float* v = values.data() + g * group_size;
    float amax = 0.0f;
    for (int64_t i = 0; i < group_size; ++i) amax = std::max(amax, std::fabs(v[i]));
    float scale = 1.0f;
    if (amax > 0.0f && std::isfinite(amax)) {
      scale = scaling == Fp4Scaling::kNvfp4 ? e4m3_to_float(float_to_e4m3(amax / 6.0f))
                                            : std::ldexp(1.0f, std::ilogb(amax) - 2);
      if (scale == 0.0f) scale = 1.0f;  // amax / 6 below e4m3's smallest subnormal: the codes are zeros anyway
    }
    scales[static_cast<size_t>(g)] = scale;
    for (int64_t i = 0; i < group_size; ++i) {
      codes[static_cast<size_t>(g * group_size + i)] = nearest_e2m1(v[i] / scale);
    }
  }
}

}  // namespace deepinfer
