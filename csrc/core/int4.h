// The engine's packed 4-bit weights (core/weight.h: INT4, and FP4 in the same packing) dequantized on the host: what
// the CPU ops compute with when they are handed one (backend/cpu/weight_values.cpp), and what the tests compare the
// GPU kernels with.
#pragma once

#include <cstdint>
#include <span>

namespace deepinfer {

// The dequantized [rows, cols] float32 matrix of packed words [rows, cols / 8], scales [rows, cols / group_size] and
// zero points [rows, int4_zero_words(cols / group_size)] (empty: symmetric, z = 8). Throws when the sizes disagree.
void dequantize_packed_int4(std::span<const int32_t> words, std::span<const float> scales,
                            std::span<const int32_t> zeros, int64_t rows, int64_t cols, int64_t group_size,
                            std::span<float> out);

// The same for packed FP4 words (e2m1 codes in INT4's nibble order) and their scales; no zero points.
void dequantize_packed_fp4(std::span<const int32_t> words, std::span<const float> scales, int64_t rows, int64_t cols,
                           int64_t group_size, std::span<float> out);

}  // namespace deepinfer
