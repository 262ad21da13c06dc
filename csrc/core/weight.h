// A linear layer's weight as the ops read it: a bf16/fp32 matrix, DeepSeek's block-scaled FP8 (e4m3 codes and one
// float32 scale_inv per kFp8Block x kFp8Block block), or 4-bit integers with a scale (and a zero point) per group of
// G consecutive inputs (W4A16). `Weight` owns one; `WeightView` borrows it.
//
// Dequantized, element [.., r, c] of an FP8 weight is e4m3(codes[.., r, c]) * scale_inv[.., r / 128, c / 128]. A 3-D
// weight (the stacked experts, [E, R, C]) has one block grid per matrix: scale_inv [E, ceil(R / 128), ceil(C / 128)].
//
// An INT4 weight of logical shape [.., N, K] (K a multiple of 8, G a multiple of 8 dividing K) is, in memory,
//   codes      int32 [.., N, K / 8]        word w of row n holds inputs 8w .. 8w + 7, unsigned q in [0, 15], input
//                                          8w + kInt4InputOfNibble[j] in nibble j (bits 4j .. 4j + 3): AutoAWQ's
//                                          interleaved order, in which the kernels' shift-and-mask unpacking yields
//                                          consecutive pairs of inputs (backend/cuda/gemm/int4_unpack.cuh)
//   scale_inv  float32 [.., N, K / G]      the group's scale (a multiplier, as FP8's scale_inv)
//   zeros      int32 [.., N, ceil(K / G / 8)]  group g's zero point z in nibble g % 8 of word g / 8 (plain order);
//                                          none: symmetric, z = 8
// and element [.., n, k] is (q[.., n, k] - z[.., n, k / G]) * scale_inv[.., n, k / G]. Its view has the logical shape
// and dtype kU4, so the ops check an INT4 weight's shape as any other's.
//
// An FP4 weight (NVFP4, MXFP4: weight-only, Hopper has no FP4 tensor cores) is packed as an INT4 one, its nibbles
// e2m1 codes (a sign bit 3 and a magnitude index 0..7 into {0, 0.5, 1, 1.5, 2, 3, 4, 6}) in the same interleaved
// order, with a float32 scale per group (NVFP4: its e4m3 group scale times the tensor's factor, G = 16; MXFP4: its
// power of two, G = 32) and no zero points: element [.., n, k] is e2m1(q[.., n, k]) * scale_inv[.., n, k / G]. Its
// view has dtype kE2M1. The two share everything but the meaning of a nibble: "packed 4-bit" below is either.
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace deepinfer {

// The block edge of every FP8 weight: what DeepSeek's checkpoints use, and what the kernels are written for.
inline constexpr int64_t kFp8Block = 128;

constexpr int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// INT4 packing (above): nibble j of a word holds input kInt4InputOfNibble[j] of its 8; the inverse beside it.
inline constexpr int kInt4InputOfNibble[8] = {0, 2, 4, 6, 1, 3, 5, 7};
inline constexpr int kInt4NibbleOfInput[8] = {0, 4, 1, 5, 2, 6, 3, 7};
inline constexpr int kInt4SymmetricZero = 8;
constexpr int64_t int4_zero_words(int64_t groups) { return (groups + 7) / 8; }

// The scale grid of an FP8 weight of `shape` (2-D or 3-D).
inline Shape fp8_scale_shape(const Shape& shape) {
  DI_CHECK(shape.ndim() == 2 || shape.ndim() == 3, "an FP8 weight is 2-D or 3-D, got shape ", shape.str());
  if (shape.ndim() == 2) return {fp8_blocks(shape[0]), fp8_blocks(shape[1])};
  return {shape[0], fp8_blocks(shape[1]), fp8_blocks(shape[2])};
}

// The codes (or values) of the weight, with its scales beside them. A plain tensor view converts to a WeightView
// without scales, so the ops take bf16 and FP8 weights through one argument.
struct WeightView : ConstTensorView {
  ConstTensorView scale_inv;  // float32 fp8_scale_shape(shape) when dtype is kF8E4M3; INT4: the group scales
  ConstTensorView zeros;      // INT4 only: the packed zero points; empty: symmetric
  // FP8 only: W8A8, the activations quantized per token per 128 channels before a tensor-core FP8 product (what
  // DeepSeek's inference does); false: W8A16, the weight dequantized against bf16 activations.
  bool fp8_activations = false;

  WeightView() = default;
  WeightView(const ConstTensorView& values) : ConstTensorView(values) {}  // NOLINT: a plain weight
  WeightView(const TensorView& values) : ConstTensorView(values) {}       // NOLINT: a plain weight
  WeightView(const ConstTensorView& codes, const ConstTensorView& scales, bool w8a8 = false)
      : ConstTensorView(codes), scale_inv(scales), fp8_activations(w8a8) {}
  // Packed 4-bit: `codes` is the logical kU4 (INT4) or kE2M1 (FP4) view over the packed words.
  WeightView(const ConstTensorView& codes, const ConstTensorView& scales, const ConstTensorView& zero_points)
      : ConstTensorView(codes), scale_inv(scales), zeros(zero_points) {}

  bool is_fp8() const { return dtype == DType::kF8E4M3; }
  bool is_int4() const { return dtype == DType::kU4; }
  bool is_fp4() const { return dtype == DType::kE2M1; }
  bool is_packed4() const { return is_int4() || is_fp4(); }
  bool symmetric() const { return zeros.data == nullptr; }
  // Packed 4-bit: the inputs a scale covers.
  int64_t group_size() const {
    const int64_t groups = scale_inv.shape[scale_inv.shape.ndim() - 1];
    return groups > 0 ? shape[shape.ndim() - 1] / groups : 0;
  }
  // Matrix `e` of a 3-D weight, with its scales (and zero points).
  WeightView matrix(int64_t e) const {
    if (is_packed4()) {
      const int64_t n = shape[1], k = shape[2];
      const ConstTensorView codes(static_cast<const int32_t*>(data) + e * n * (k / 8), dtype, {n, k}, device);
      const ConstTensorView z = symmetric() ? ConstTensorView() : zeros.rows(e, 1).reshaped({zeros.shape[1], zeros.shape[2]});
      return {codes, scale_inv.rows(e, 1).reshaped({scale_inv.shape[1], scale_inv.shape[2]}), z};
    }
    const ConstTensorView values = rows(e, 1).reshaped({shape[1], shape[2]});
    if (!is_fp8()) return values;
    return {values, scale_inv.rows(e, 1).reshaped({scale_inv.shape[1], scale_inv.shape[2]}), fp8_activations};
  }
  // The bytes the weight occupies, scales (and zero points) included.
  int64_t bytes() const {
    const int64_t values = is_packed4() ? numel() / 2 : numel() * static_cast<int64_t>(dtype_size(dtype));
    return values + scale_inv.numel() * static_cast<int64_t>(sizeof(float)) +
           zeros.numel() * static_cast<int64_t>(sizeof(int32_t));
  }
};

// An owned weight: values (or codes) and, for FP8 and packed 4-bit, the scales (INT4: and the zero points).
struct Weight {
  Tensor values;     // packed 4-bit: the int32 words [.., N, K / 8]
  Tensor scale_inv;  // empty unless the weight is FP8 or packed 4-bit
  Tensor zeros;      // INT4 with zero points only
  bool fp8_activations = false;  // WeightView::fp8_activations
  bool int4 = false;  // packed 4-bit words: INT4 codes, or e2m1 ones when fp4
  bool fp4 = false;

  Weight() = default;
  Weight(Tensor v) : values(std::move(v)) {}  // NOLINT: a plain weight is a tensor
  Weight(Tensor codes, Tensor scales, bool w8a8)
      : values(std::move(codes)), scale_inv(std::move(scales)), fp8_activations(w8a8) {}
  // INT4: `words` int32 [.., N, K / 8], `scales` float32 [.., N, K / G], `zero_points` empty or int32
  // [.., N, int4_zero_words(K / G)].
  static Weight int4_packed(Tensor words, Tensor scales, Tensor zero_points) {
    Weight w;
    w.values = std::move(words);
    w.scale_inv = std::move(scales);
    w.zeros = std::move(zero_points);
    w.int4 = true;
    return w;
  }
  // FP4: `words` int32 [.., N, K / 8] of e2m1 codes, `scales` float32 [.., N, K / G]; no zero points.
  static Weight fp4_packed(Tensor words, Tensor scales) {
    Weight w = int4_packed(std::move(words), std::move(scales), Tensor());
    w.fp4 = true;
    return w;
  }

  WeightView cview() const {
    if (int4) {
      const ConstTensorView codes(values.cview().data, dtype(), shape(), values.device());
      return {codes, scale_inv.cview(), has_zeros() ? zeros.cview() : ConstTensorView()};
    }
    if (values.dtype() != DType::kF8E4M3) return WeightView(values.cview());
    return {values.cview(), scale_inv.cview(), fp8_activations};
  }
  // The logical shape ([.., N, K] for INT4 too).
  Shape shape() const {
    const Shape& s = values.shape();
    return int4 ? s.with_dim(-1, s[s.ndim() - 1] * 8) : s;
  }
  DType dtype() const { return fp4 ? DType::kE2M1 : int4 ? DType::kU4 : values.dtype(); }
  Device device() const { return values.device(); }
  int64_t numel() const { return int4 ? values.numel() * 8 : values.numel(); }
  bool defined() const { return values.defined(); }
  bool is_fp8() const { return values.dtype() == DType::kF8E4M3; }
  bool is_int4() const { return int4 && !fp4; }
  bool is_fp4() const { return fp4; }
  bool is_packed4() const { return int4; }
  // INT4 with zero points (asymmetric); a symmetric weight's zeros tensor is empty.
  bool has_zeros() const { return int4 && zeros.numel() > 0; }
};

}  // namespace deepinfer
