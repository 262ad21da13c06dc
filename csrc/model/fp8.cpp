#include "model/fp8.h"

#include "core/error.h"

namespace deepinfer {

void dequantize_fp8_rows(const Fp8BlockWeight& w, int64_t first_row, int64_t num_rows, std::span<float> out) {
  const int64_t rows = w.rows, cols = w.cols;
  DI_CHECK(rows >= 0 && cols >= 0, "invalid FP8 weight shape [", rows, ", ", cols, "]");
  DI_CHECK(w.block[0] > 0 && w.block[1] > 0, "invalid FP8 block size [", w.block[0], ", ", w.block[1], "]");
  const int64_t numel = rows * cols;
  const int64_t scale_rows = (rows + w.block[0] - 1) / w.block[0];
  const int64_t scale_cols = (cols + w.block[1] - 1) / w.block[1];
  DI_CHECK(static_cast<int64_t>(w.codes.size()) == numel, "FP8 weight has ", w.codes.size(),
           " elements, expected ", numel, " for shape [", rows, ", ", cols, "]");
  DI_CHECK(static_cast<int64_t>(w.scale_inv.size()) == scale_rows * scale_cols, "FP8 scale_inv has ",
           w.scale_inv.size(), " elements, expected ", scale_rows * scale_cols, " ([", scale_rows, ", ",
           scale_cols, "] blocks of ", w.block[0], "x", w.block[1], ")");
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= rows, "FP8 rows [", first_row, ", ",
           first_row + num_rows, ") out of range for shape [", rows, ", ", cols, "]");
  DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * cols, "FP8 dequantization output has ", out.size(),
           " elements, expected ", num_rows * cols);

  const uint8_t* codes = w.codes.data();
  const float* s = w.scale_inv.data();
  float* o = out.data();
  const int64_t block_rows = w.block[0];
  const int64_t block_cols = w.block[1];
#pragma omp parallel for schedule(static) if (num_rows * cols >= (int64_t{1} << 18))
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t r = first_row + i;
    const float* scale_row = s + (r / block_rows) * scale_cols;
    const uint8_t* w_row = codes + r * cols;
    float* o_row = o + i * cols;
    for (int64_t c = 0; c < cols; ++c) {
      o_row[c] = kE4m3ToFloat[w_row[c]] * scale_row[c / block_cols];
    }
  }
}

void dequantize_fp8_blocks(std::span<const uint8_t> weight, int64_t rows, int64_t cols,
                           std::span<const float> scale_inv, std::array<int64_t, 2> block,
                           std::span<float> out) {
  dequantize_fp8_rows({.codes = weight, .rows = rows, .cols = cols, .scale_inv = scale_inv, .block = block}, 0,
                      rows, out);
}

}  // namespace deepinfer
