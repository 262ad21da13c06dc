#include "core/int4.h"

#include "core/e2m1.h"
#include "core/error.h"
#include "core/weight.h"

namespace deepinfer {
namespace {

constexpr int nibble_of(uint32_t word, int j) { return static_cast<int>((word >> (4 * j)) & 0xfu); }

}  // namespace

void dequantize_packed_int4(std::span<const int32_t> words, std::span<const float> scales,
                            std::span<const int32_t> zeros, int64_t rows, int64_t cols, int64_t group_size,
                            std::span<float> out) {
  DI_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0 && group_size > 0 && cols % group_size == 0, "packed INT4 [", rows,
           ", ", cols, "] with group size ", group_size);
  const int64_t groups = cols / group_size, zero_words = int4_zero_words(groups);
  DI_CHECK(static_cast<int64_t>(words.size()) == rows * cols / 8 &&
               static_cast<int64_t>(scales.size()) == rows * groups &&
               (zeros.empty() || static_cast<int64_t>(zeros.size()) == rows * zero_words) &&
               static_cast<int64_t>(out.size()) == rows * cols,
           "packed INT4 [", rows, ", ", cols, "] group ", group_size, ": ", words.size(), " words, ", scales.size(),
           " scales, ", zeros.size(), " zero-point words, ", out.size(), " outputs");
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t g = k / group_size;
      const auto word = static_cast<uint32_t>(words[static_cast<size_t>(r * cols / 8 + k / 8)]);
      const int q = nibble_of(word, kInt4NibbleOfInput[k % 8]);
      const int z = zeros.empty() ? kInt4SymmetricZero
                                  : nibble_of(static_cast<uint32_t>(zeros[static_cast<size_t>(r * zero_words + g / 8)]),
                                              static_cast<int>(g % 8));
      out[static_cast<size_t>(r * cols + k)] = static_cast<float>(q - z) * scales[static_cast<size_t>(r * groups + g)];
    }
  }
}

void dequantize_packed_fp4(std::span<const int32_t> words, std::span<const float> scales, int64_t rows, int64_t cols,
                           int64_t group_size, std::span<float> out) {
  DI_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0 && group_size > 0 && cols % group_size == 0, "packed FP4 [", rows,
           ", ", cols, "] with group size ", group_size);
  const int64_t groups = cols / group_size;
  DI_CHECK(static_cast<int64_t>(words.size()) == rows * cols / 8 &&
               static_cast<int64_t>(scales.size()) == rows * groups && static_cast<int64_t>(out.size()) == rows * cols,
           "packed FP4 [", rows, ", ", cols, "] group ", group_size, ": ", words.size(), " words, ", scales.size(),
           " scales, ", out.size(), " outputs");
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const auto word = static_cast<uint32_t>(words[static_cast<size_t>(r * cols / 8 + k / 8)]);
      const int code = nibble_of(word, kInt4NibbleOfInput[k % 8]);
      out[static_cast<size_t>(r * cols + k)] =
          kE2m1ToFloat[static_cast<size_t>(code)] * scales[static_cast<size_t>(r * groups + k / group_size)];
    }
  }
}

}  // namespace deepinfer
