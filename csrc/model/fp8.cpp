#include "model/fp8.h"

#include "core/error.h"

namespace deepinfer {

void dequantize_fp8_blocks(std::span<const uint8_t> weight, int64_t rows, int64_t cols,
                           std::span<const float> scale_inv, std::array<int64_t, 2> block,
                           std::span<float> out) {
  DI_CHECK(rows >= 0 && cols >= 0, "invalid FP8 weight shape [", rows, ", ", cols, "]");
  DI_CHECK(block[0] > 0 && block[1] > 0, "invalid FP8 block size [", block[0], ", ", block[1], "]");
  const int64_t numel = rows * cols;
  const int64_t scale_rows = (rows + block[0] - 1) / block[0];
  const int64_t scale_cols = (cols + block[1] - 1) / block[1];
  DI_CHECK(static_cast<int64_t>(weight.size()) == numel, "FP8 weight has ", weight.size(),
           " elements, expected ", numel, " for shape [", rows, ", ", cols, "]");
  DI_CHECK(static_cast<int64_t>(out.size()) == numel, "FP8 dequantization output has ", out.size(),
           " elements, expected ", numel);
  DI_CHECK(static_cast<int64_t>(scale_inv.size()) == scale_rows * scale_cols, "FP8 scale_inv has ",
           scale_inv.size(), " elements, expected ", scale_rows * scale_cols, " ([", scale_rows, ", ",
           scale_cols, "] blocks of ", block[0], "x", block[1], ")");

  const uint8_t* w = weight.data();
  const float* s = scale_inv.data();
  float* o = out.data();
  const int64_t block_rows = block[0];
  const int64_t block_cols = block[1];
#pragma omp parallel for schedule(static) if (numel >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = s + (r / block_rows) * scale_cols;
    const uint8_t* w_row = w + r * cols;
    float* o_row = o + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      o_row[c] = kE4m3ToFloat[w_row[c]] * scale_row[c / block_cols];
    }
  }
}

}  // namespace deepinfer
