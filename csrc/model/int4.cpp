#include "model/int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/e2m1.h"
#include "core/error.h"
#include "core/weight.h"

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
  DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * w.cols, "output holds ", out.size(), " floats for ",
           num_rows, " rows of ", w.cols);
  Int4Rows rows;
  unpack_int4_rows(w, first_row, num_rows, rows);  // (q - z) is the same unsigned as in the stored signed form
  rows.dequantize(out);
}

namespace {

// One group's round-to-nearest codes (round_int4's math): q[i], the scale and the zero point.
void quantize_group(const float* x, int64_t n, bool symmetric, uint8_t* q, float& scale, uint8_t& zero) {
  if (symmetric) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    zero = kInt4SymmetricZero;
    scale = amax / 7.0f;
    for (int64_t i = 0; i < n; ++i) {
      q[i] = static_cast<uint8_t>(amax == 0.0f ? 8.0f : std::clamp(std::nearbyint(x[i] / scale), -8.0f, 7.0f) + 8.0f);
    }
    return;
  }
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi == lo) {  // all zeros
    scale = 0.0f;
    zero = 0;
    std::fill_n(q, n, uint8_t{0});
    return;
  }
  scale = (hi - lo) / 15.0f;
  const float z = std::nearbyint(-lo / scale);  // in [0, 15]: -lo / s <= (hi - lo) / s = 15
  zero = static_cast<uint8_t>(z);
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(x[i] / scale) + z, 0.0f, 15.0f));
}

}  // namespace

void round_int4(std::span<float> values, int64_t cols, const Int4Rounding& rounding) {
  Int4Rows rows;
  quantize_int4_rows(values, cols, rounding, rows);
  rows.dequantize(values);
}

void Int4Rows::resize(int64_t num_rows, int64_t num_cols, int64_t group, bool is_symmetric) {
  DI_CHECK(num_rows >= 0 && num_cols > 0 && group > 0 && num_cols % group == 0, "INT4 rows of ", num_cols,
           " values with group size ", group, ": the group size must divide the row");
  rows = num_rows;
  cols = num_cols;
  group_size = group;
  e2m1 = false;  // the FP4 reader sets it after sizing
  q.resize(static_cast<size_t>(rows * cols));
  scales.resize(static_cast<size_t>(rows * groups()));
  zeros.resize(is_symmetric ? 0 : static_cast<size_t>(rows * groups()));
}

Int4Rows Int4Rows::columns(int64_t first, int64_t count) const {
  DI_CHECK(first >= 0 && count > 0 && first + count <= cols && first % group_size == 0 && count % group_size == 0,
           "INT4 columns [", first, ", ", first + count, ") of rows of ", cols, " do not fall on groups of ",
           group_size);
  Int4Rows out;
  out.resize(rows, count, group_size, symmetric());
  out.e2m1 = e2m1;
  const int64_t g0 = first / group_size, ng = count / group_size;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(q.data() + r * cols + first, count, out.q.data() + r * count);
    std::copy_n(scales.data() + r * groups() + g0, ng, out.scales.data() + r * ng);
    if (!symmetric()) std::copy_n(zeros.data() + r * groups() + g0, ng, out.zeros.data() + r * ng);
  }
  return out;
}

void Int4Rows::dequantize(std::span<float> out) const {
  DI_CHECK(static_cast<int64_t>(out.size()) == rows * cols, "INT4 rows: ", out.size(), " floats for ", rows,
           " rows of ", cols);
  const int64_t ng = groups();
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const float s = scales[static_cast<size_t>(r * ng + g)];
      const int z = symmetric() ? kInt4SymmetricZero : zeros[static_cast<size_t>(r * ng + g)];
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) {
        const uint8_t code = q[static_cast<size_t>(r * cols + k)];
        out[static_cast<size_t>(r * cols + k)] =
            (e2m1 ? kE2m1ToFloat[code & 0xfu] : static_cast<float>(code - z)) * s;
      }
    }
  }
}

void quantize_int4_rows(std::span<const float> values, int64_t cols, const Int4Rounding& rounding, Int4Rows& out) {
  const int64_t group = rounding.group_size == -1 ? cols : rounding.group_size;
  DI_CHECK(cols > 0 && group > 0 && cols % group == 0, "INT4 rounding: group size ", rounding.group_size,
           " does not divide rows of ", cols);
  const auto n = static_cast<int64_t>(values.size());
  DI_CHECK(n % cols == 0, "INT4 rounding: ", n, " values are not whole rows of ", cols);
  out.resize(n / cols, cols, group, rounding.symmetric);
  const int64_t num_groups = n / group;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 18))
  for (int64_t g = 0; g < num_groups; ++g) {
    uint8_t z = 0;
    quantize_group(values.data() + g * group, group, rounding.symmetric, out.q.data() + g * group,
                   out.scales[static_cast<size_t>(g)], z);
    if (!rounding.symmetric) out.zeros[static_cast<size_t>(g)] = z;
  }
}

void unpack_int4_rows(const PackedInt4& w, int64_t first_row, int64_t num_rows, Int4Rows& out) {
  w.validate();
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= w.rows, "rows [", first_row, ", ",
           first_row + num_rows, ") out of range for an INT4 weight of ", w.rows, " rows");
  const int64_t k_dim = w.cols, groups = k_dim / w.group_size;
  const bool symmetric = w.layout == Int4Layout::kCompressedTensors && w.zeros.empty();
  out.resize(num_rows, k_dim, w.group_size, symmetric);
  if (w.layout == Int4Layout::kCompressedTensors) {
    // Stored codes and zero points are q + 8 and z + 8 of signed values: q - z is the same unsigned.
    const int64_t row_words = ceil_div(k_dim, 8);
#pragma omp parallel for schedule(static) if (num_rows * k_dim >= (int64_t{1} << 18))
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n = first_row + r;
      for (int64_t k = 0; k < k_dim; ++k) {
        out.q[static_cast<size_t>(r * k_dim + k)] =
            static_cast<uint8_t>(nibble(word_at(w.qweight, n * row_words + k / 8), k % 8));
      }
      for (int64_t g = 0; g < groups; ++g) {
        out.scales[static_cast<size_t>(r * groups + g)] = w.scales[static_cast<size_t>(n * groups + g)];
        if (!symmetric) {
          out.zeros[static_cast<size_t>(r * groups + g)] =
              static_cast<uint8_t>(nibble(word_at(w.zeros, (n / 8) * groups + g), n % 8));
        }
      }
    }
    return;
  }
  const int64_t row_words = w.rows / 8;
  for (int64_t k = 0; k < k_dim; ++k) {
    const int64_t g = k / w.group_size;
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n = first_row + r, word = n / 8;
      const int j = kAwqNibbleOfColumn[static_cast<size_t>(n % 8)];
      out.q[static_cast<size_t>(r * k_dim + k)] =
          static_cast<uint8_t>(nibble(word_at(w.qweight, k * row_words + word), j));
      if (k % w.group_size == 0) {
        out.zeros[static_cast<size_t>(r * groups + g)] =
            static_cast<uint8_t>(nibble(word_at(w.zeros, g * row_words + word), j));
        out.scales[static_cast<size_t>(r * groups + g)] = w.scales[static_cast<size_t>(g * w.rows + n)];
      }
    }
  }
}

void pack_int4_codes(const Int4Rows& rows, std::span<int32_t> words) {
  DI_CHECK(rows.cols % 8 == 0 && static_cast<int64_t>(words.size()) == rows.rows * rows.cols / 8,
           "INT4 packing: ", words.size(), " words for ", rows.rows, " rows of ", rows.cols,
           " values (a multiple of 8)");
  const int64_t n = rows.rows * rows.cols / 8;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t w = 0; w < n; ++w) {
    uint32_t word = 0;
    for (int j = 0; j < 8; ++j) {
      word |= static_cast<uint32_t>(rows.q[static_cast<size_t>(8 * w + kInt4InputOfNibble[j])] & 0xfu) << (4 * j);
    }
    words[static_cast<size_t>(w)] = static_cast<int32_t>(word);
  }
}

void pack_int4_zeros(const Int4Rows& rows, std::span<int32_t> words) {
  const int64_t groups = rows.groups(), row_words = int4_zero_words(groups);
  DI_CHECK(!rows.symmetric() && static_cast<int64_t>(words.size()) == rows.rows * row_words,
           "INT4 zero-point packing: ", words.size(), " words for ", rows.rows, " rows of ", groups, " groups");
  for (int64_t r = 0; r < rows.rows; ++r) {
    for (int64_t w = 0; w < row_words; ++w) {
      uint32_t word = 0;
      for (int64_t j = 0; j < 8 && 8 * w + j < groups; ++j) {
        word |= static_cast<uint32_t>(rows.zeros[static_cast<size_t>(r * groups + 8 * w + j)] & 0xfu) << (4 * j);
      }
      words[static_cast<size_t>(r * row_words + w)] = static_cast<int32_t>(word);
    }
  }
}

}  // namespace deepinfer
