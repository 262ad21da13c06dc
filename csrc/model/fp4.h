// 4-bit floating-point weights (FP4, e2m1): the checkpoint layouts the loader reads, and their dequantization. Hopper
// has no FP4 tensor cores, so these are weight-only formats here: the values are widened (the CPU backend computes
// with them in float32) and activations stay in the compute dtype.
//
// A linear weight W is [N, K]; groups of `group_size` consecutive inputs of one output channel share a scale,
// W[n][k] = e2m1(q[n][k]) * s[n][k / G]. The e2m1 codes are packed two a byte along K, element k in the low nibble
// when k is even (bits 0..3) and the high nibble when odd; a code is a sign bit (bit 3) and a magnitude index (bits
// 0..2) into {0, 0.5, 1, 1.5, 2, 3, 4, 6}. The layouts differ in their scales:
//   NVFP4 (G = 16): s = e4m3 block scale * a per-tensor float32 factor.
//     compressed-tensors (nvfp4-pack-quantized): weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
//       weight_global_scale F32 [1], which divides: s = scale / global_scale.
//     ModelOpt (quant_algo NVFP4, the NVIDIA FP4 DeepSeek releases): weight U8 [N, K/2], weight_scale F8_E4M3
//       [N, K/16], weight_scale_2 F32 (one value), which multiplies: s = scale * scale_2. input_scale, for FP4
//       activations, is not used.
//   MXFP4 (G = 32, OCP microscaling): s = 2^(e - 127) from a biased exponent byte (E8M0).
//     compressed-tensors (mxfp4-pack-quantized): weight_packed U8 [N, K/2], weight_scale U8 (or F8_E8M0) [N, K/32].
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/e2m1.h"

namespace deepinfer {

// The scale an E8M0 byte encodes: 2^(code - 127); code 255 is NaN in the OCP format.
float e8m0_to_float(uint8_t code);

// One stored FP4 weight: its packed codes (over the checkpoint's bytes) and its group scales, already decoded to
// float32 (NVFP4's tensor factor applied).
struct PackedFp4 {
  int64_t rows = 0;        // N
  int64_t cols = 0;        // K, even
  int64_t group_size = 0;  // G, a divisor of K
  std::span<const std::byte> codes;  // N * K / 2 bytes
  std::span<const float> scales;     // N * K / G

  void validate() const;  // throws naming the sizes that disagree
};

// Rows [first_row, first_row + num_rows) of the dequantized [N, K] weight into `out` (num_rows * K floats).
void dequantize_fp4_rows(const PackedFp4& w, int64_t first_row, int64_t num_rows, std::span<float> out);

// The e2m1 code nearest to v (clamped to +-6; a tie goes to the code of even mantissa, as IEEE rounding does).
uint8_t nearest_e2m1(float v);

// How round_fp4 picks a group's scale from its largest magnitude amax, as each format stores it:
//   kNvfp4: amax / 6 rounded to e4m3 (the per-tensor factor taken as 1);
//   kMxfp4: the power of two 2^(floor(log2 amax) - 2) (OCP microscaling: e2m1's largest exponent is 2).
// A group of zeros gets scale 1 and zero codes.
enum class Fp4Scaling : uint8_t { kNvfp4, kMxfp4 };

// Round-to-nearest FP4 of `values` (rows of `cols`, groups of `group_size` along each row): codes a byte each
// ([rows, cols]) and group scales ([rows, cols / group_size]); dequantized, codes * scales.
void round_fp4(std::span<const float> values, int64_t cols, int64_t group_size, Fp4Scaling scaling,
               std::span<uint8_t> codes, std::span<float> scales);

}  // namespace deepinfer
