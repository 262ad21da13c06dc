// 4-bit integer weights: the two checkpoint layouts the loader reads (compressed-tensors' pack-quantized W4A16 and
// AutoAWQ's GEMM layout), and round-to-nearest quantization of a float weight at load. The CPU backend computes with
// the dequantized values in float32; these functions produce them.
//
// A linear weight W is [N, K] (N output channels, K inputs); groups of `group_size` consecutive inputs of one output
// channel share a scale (and a zero point), W[n][k] = (q[n][k] - z[n][k / G]) * s[n][k / G].
//
// compressed-tensors (pack_to_int32 / unpack_from_int32 in compressed_tensors/compressors/pack_quantized/helpers.py):
//   weight_packed      int32 [N, ceil(K / 8)]   element k of row n is nibble k % 8 (bits 4 (k % 8) .. +3, the low
//                                               nibble first) of word k / 8, holding q + 8 (q signed, in [-8, 7])
//   weight_scale       float [N, K / G]         (G = K for the "channel" strategy)
//   weight_zero_point  int32 [ceil(N / 8), K / G]  asymmetric only: packed along N (packed_dim=0): the zero point of
//                                               row n is nibble n % 8 of word [n / 8][g], holding z + 8; symmetric: z = 0
//   weight_shape       int [2]                  {N, K}
// AutoAWQ GEMM (WQLinear_GEMM.from_linear in awq/modules/linear/gemm.py; unpacked by dequantize_gemm in
// awq/utils/packing_utils.py and by compressed-tensors' AutoAWQConverter):
//   qweight  int32 [K, N / 8]    packed along N: output channel n of input k is nibble kAwqNibbleOfColumn[n % 8] of
//                                word [k][n / 8] (the order 0 2 4 6 1 3 5 7 the kernels interleave), unsigned q in [0, 15]
//   qzeros   int32 [K / G, N / 8]  the zero points, packed the same way, unsigned
//   scales   float [K / G, N]      (fp16 as AutoAWQ writes them)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

// Nibble j of an AWQ word holds column kAwqColumnOfNibble[j] of its 8; the inverse map below.
inline constexpr std::array<int, 8> kAwqColumnOfNibble = {0, 2, 4, 6, 1, 3, 5, 7};
inline constexpr std::array<int, 8> kAwqNibbleOfColumn = {0, 4, 1, 5, 2, 6, 3, 7};

// Value j (0..7) of a packed word, unsigned.
constexpr int nibble(uint32_t word, int64_t j) { return static_cast<int>((word >> (4 * j)) & 0xfu); }

enum class Int4Layout : uint8_t { kCompressedTensors, kAwq };

// One stored 4-bit weight, over the checkpoint's bytes (the mapping may leave int32 tensors unaligned, so the words
// are read with memcpy). `scales` and `zeros` are laid out as the layout stores them (see above).
struct PackedInt4 {
  Int4Layout layout = Int4Layout::kCompressedTensors;
  int64_t rows = 0;        // N
  int64_t cols = 0;        // K
  int64_t group_size = 0;  // G, a divisor of K
  std::span<const std::byte> qweight;  // int32 words
  std::span<const std::byte> zeros;    // int32 words; empty: symmetric (compressed-tensors only)
  std::span<const float> scales;       // widened to float32

  // The number of int32 words each stored tensor must hold; validate() checks the spans against them.
  int64_t qweight_words() const;
  int64_t zero_words() const;
  int64_t scale_count() const { return rows * (cols / group_size); }
  void validate() const;  // throws naming the sizes that disagree
};

// Rows [first_row, first_row + num_rows) of the dequantized [N, K] weight into `out` (num_rows * K floats).
void dequantize_int4_rows(const PackedInt4& w, int64_t first_row, int64_t num_rows, std::span<float> out);

// Round-to-nearest 4-bit quantization of a float weight at load, dequantized again: what the engine computes with
// under quantization="int4" on a bf16/fp32 checkpoint. Each run of `group_size` consecutive values of a row (the
// whole row with group_size -1) is quantized on its own:
//   asymmetric: lo = min(0, min x), hi = max(0, max x) (so 0 is exact), s = (hi - lo) / 15, z = round(-lo / s),
//               q = clamp(round(x / s) + z, 0, 15), x' = (q - z) s
//   symmetric:  s = max|x| / 7, q = clamp(round(x / s), -8, 7), x' = q s
// round() is to nearest, ties to even (torch.round), every step in float32; a group of zeros stays zero.
struct Int4Rounding {
  int64_t group_size = 128;  // -1: one group per row (per output channel)
  bool symmetric = false;
};
// `values` holds rows of `cols` values (cols divisible by the group size); rounds them in place.
void round_int4(std::span<float> values, int64_t cols, const Int4Rounding& rounding);

// Whole rows of a 4-bit weight in the engine's terms (core/weight.h), a code a byte: what a source hands the loader
// for a device that keeps the weight packed. element [r, k] = (q[r, k] - z[r, k / G]) * scales[r, k / G].
// FP4 rows (e2m1) are the same with e2m1 codes in q, no zero points: element [r, k] = e2m1(q[r, k]) * scales[r, k / G].
struct Int4Rows {
  std::vector<uint8_t> q;      // [rows, cols] unsigned codes in [0, 15] (e2m1: e2m1 codes)
  std::vector<float> scales;   // [rows, cols / group_size]
  std::vector<uint8_t> zeros;  // [rows, cols / group_size] in [0, 15]; empty: symmetric (z = 8)
  int64_t rows = 0, cols = 0, group_size = 0;
  bool e2m1 = false;           // FP4 codes (always symmetric)

  int64_t groups() const { return cols / group_size; }
  bool symmetric() const { return zeros.empty(); }
  void resize(int64_t num_rows, int64_t num_cols, int64_t group, bool is_symmetric);  // INT4 codes (e2m1 false)
  // Columns [first, first + count) of every row (on group edges), as rows of their own.
  Int4Rows columns(int64_t first, int64_t count) const;
  void dequantize(std::span<float> out) const;  // rows * cols floats
};

// What a 4-bit weight's rows look like: its group size, whether it has zero points, whether its codes are e2m1 (FP4).
struct Int4Form {
  int64_t group_size = 0;
  bool symmetric = false;
  bool e2m1 = false;
  bool operator==(const Int4Form&) const = default;
};

// Rows [first_row, first_row + num_rows) of a stored weight as Int4Rows: compressed-tensors' signed codes shifted to
// unsigned (q + 8, z + 8; symmetric z = 8), AWQ's transposed words gathered.
void unpack_int4_rows(const PackedInt4& w, int64_t first_row, int64_t num_rows, Int4Rows& out);

// round_int4's quantization of rows of `cols` values, as codes and scales: dequantized, they are round_int4's values
// bit for bit (a group of zeros gets scale 0).
void quantize_int4_rows(std::span<const float> values, int64_t cols, const Int4Rounding& rounding, Int4Rows& out);

// The engine's packed words of `rows` (core/weight.h; core/int4.h dequantizes them): codes [rows, cols / 8] (cols a multiple of 8), zero points
// [rows, int4_zero_words(groups)] (asymmetric rows only).
void pack_int4_codes(const Int4Rows& rows, std::span<int32_t> words);
void pack_int4_zeros(const Int4Rows& rows, std::span<int32_t> words);

}  // namespace deepinfer
