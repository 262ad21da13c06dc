#include "model/int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

uint32_t word_at(std::span<const std::byte> words, int64_t i) {
  uint32_t w;
  std::memcpy(&w, words.data() + 4 * i, sizeof(w));
  return w;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t PackedInt4::qweight_words() const {
  if (layout == Int4Layout::kCompressedTensors) return rows * ceil_div(cols, 8);
  return cols * (rows / 8);
}

int64_t PackedInt4::zero_words() const {
  if (layout == Int4Layout::kCompressedTensors) return zeros.empty() ? 0 : ceil_div(rows, 8) * (cols / group_size);
  return (cols / group_size) * (rows / 8);
}

void PackedInt4::validate() const {
  DI_CHECK(rows > 0 && cols > 0 && group_size > 0 && cols % group_size == 0, "INT4 weight [", rows, ", ", cols,
           "] with group size ", group_size, ": the group size must divide K");
  DI_CHECK(layout == Int4Layout::kCompressedTensors || rows % 8 == 0, "AWQ weight [", rows, ", ", cols,
           "]: N must be a multiple of 8 (eight output channels a word)");
  DI_CHECK(layout == Int4Layout::kCompressedTensors || !zeros.empty(), "AWQ weight: zero points missing");
  DI_CHECK(static_cast<int64_t>(qweight.size()) == 4 * qweight_words() &&
               static_cast<int64_t>(zeros.size()) == 4 * zero_words() &&
               static_cast<int64_t>(scales.size()) == scale_count(),
           "INT4 weight [", rows, ", ", cols, "] group ", group_size, ": ", qweight.size() / 4, " weight words, ",
           zeros.size() / 4, " zero-point words and ", scales.size(), " scales; expected ", qweight_words(), ", ",
           zero_words(), " and ", scale_count());
}

void dequantize_int4_rows(const PackedInt4& w, int64_t first_row, int64_t num_rows, std::span<float> out) {
  w.validate();
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= w.rows, "rows [", first_row, ", ",
           first_row + num_rows, ") out of range for an INT4 weight of ", w.rows, " rows");
  DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * w.cols, "output holds ", out.size(), " floats for ",
           num_rows, " rows of ", w.cols);
  const int64_t k_dim = w.cols, groups = k_dim / w.group_size;
  if (w.layout == Int4Layout::kCompressedTensors) {
    const int64_t row_words = ceil_div(k_dim, 8);
#pragma omp parallel for schedule(static) if (num_rows * k_dim >= (int64_t{1} << 18))
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n = first_row + r;
      float* dst = out.data() + r * k_dim;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = w.scales[static_cast<size_t>(n * groups + g)];
        const int z = w.zeros.empty() ? 0 : nibble(word_at(w.zeros, (n / 8) * groups + g), n % 8) - 8;
        for (int64_t k = g * w.group_size; k < (g + 1) * w.group_size; ++k) {
          const int q = nibble(word_at(w.qweight, n * row_words + k / 8), k % 8) - 8;
          dst[k] = static_cast<float>(q - z) * s;
        }
      }
    }
    return;
  }
  // AWQ stores W transposed ([K, N] words packed along N): walk k outside so each row of words is read in order.
  const int64_t row_words = w.rows / 8;
  for (int64_t k = 0; k < k_dim; ++k) {
    const int64_t g = k / w.group_size;
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n = first_row + r, word = n / 8;
      const int j = kAwqNibbleOfColumn[static_cast<size_t>(n % 8)];
      const int q = nibble(word_at(w.qweight, k * row_words + word), j);
      const int z = nibble(word_at(w.zeros, g * row_words + word), j);
      out[static_cast<size_t>(r * k_dim + k)] = static_cast<float>(q - z) * w.scales[static_cast<size_t>(g * w.rows + n)];
    }
  }
}

void round_int4(std::span<float> values, int64_t cols, const Int4Rounding& rounding) {
  const int64_t group = rounding.group_size == -1 ? cols : rounding.group_size;
  DI_CHECK(cols > 0 && group > 0 && cols % group == 0, "INT4 rounding: group size ", rounding.group_size,
           " does not divide rows of ", cols);
  const auto n = static_cast<int64_t>(values.size());
  DI_CHECK(n % cols == 0, "INT4 rounding: ", n, " values are not whole rows of ", cols);
  const int64_t num_groups = n / group;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 18))
  for (int64_t g = 0; g < num_groups; ++g) {
    float* x = values.data() + g * group;
    if (rounding.symmetric) {
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
      if (amax == 0.0f) continue;
      const float s = amax / 7.0f;
      for (int64_t i = 0; i < group; ++i) x[i] = std::clamp(std::nearbyint(x[i] / s), -8.0f, 7.0f) * s;
      continue;
    }
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < group; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    if (hi == lo) continue;  // all zeros
    const float s = (hi - lo) / 15.0f;
    const float z = std::nearbyint(-lo / s);  // in [0, 15]: -lo / s <= (hi - lo) / s = 15
    for (int64_t i = 0; i < group; ++i) x[i] = (std::clamp(std::nearbyint(x[i] / s) + z, 0.0f, 15.0f) - z) * s;
  }
}

}  // namespace deepinfer
