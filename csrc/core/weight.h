// A linear layer's weight as the ops read it: a bf16/fp32 matrix, or DeepSeek's block-scaled FP8 (e4m3 codes and one
// float32 scale_inv per kFp8Block x kFp8Block block). `Weight` owns one; `WeightView` borrows it.
//
// Dequantized, element [.., r, c] of an FP8 weight is e4m3(codes[.., r, c]) * scale_inv[.., r / 128, c / 128]. A 3-D
// weight (the stacked experts, [E, R, C]) has one block grid per matrix: scale_inv [E, ceil(R / 128), ceil(C / 128)].
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace deepinfer {

// The block edge of every FP8 weight: what DeepSeek's checkpoints use, and what the kernels are written for.
inline constexpr int64_t kFp8Block = 128;

constexpr int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// The scale grid of an FP8 weight of `shape` (2-D or 3-D).
inline Shape fp8_scale_shape(const Shape& shape) {
  DI_CHECK(shape.ndim() == 2 || shape.ndim() == 3, "an FP8 weight is 2-D or 3-D, got shape ", shape.str());
  if (shape.ndim() == 2) return {fp8_blocks(shape[0]), fp8_blocks(shape[1])};
  return {shape[0], fp8_blocks(shape[1]), fp8_blocks(shape[2])};
}

// The codes (or values) of the weight, with its scales beside them. A plain tensor view converts to a WeightView
// without scales, so the ops take bf16 and FP8 weights through one argument.
struct WeightView : ConstTensorView {
  ConstTensorView scale_inv;  // float32 fp8_scale_shape(shape) when dtype is kF8E4M3; empty otherwise
  // FP8 only: W8A8, the activations quantized per token per 128 channels before a tensor-core FP8 product (what
  // DeepSeek's inference does); false: W8A16, the weight dequantized against bf16 activations.
  bool fp8_activations = false;

  WeightView() = default;
  WeightView(const ConstTensorView& values) : ConstTensorView(values) {}  // NOLINT: a plain weight
  WeightView(const TensorView& values) : ConstTensorView(values) {}       // NOLINT: a plain weight
  WeightView(const ConstTensorView& codes, const ConstTensorView& scales, bool w8a8 = false)
      : ConstTensorView(codes), scale_inv(scales), fp8_activations(w8a8) {}

  bool is_fp8() const { return dtype == DType::kF8E4M3; }
  // Matrix `e` of a 3-D weight, with its scales.
  WeightView matrix(int64_t e) const {
    const ConstTensorView values = rows(e, 1).reshaped({shape[1], shape[2]});
    if (!is_fp8()) return values;
    return {values, scale_inv.rows(e, 1).reshaped({scale_inv.shape[1], scale_inv.shape[2]}), fp8_activations};
  }
  // The bytes the weight occupies, scales included.
  int64_t bytes() const {
    return numel() * static_cast<int64_t>(dtype_size(dtype)) + scale_inv.numel() * static_cast<int64_t>(sizeof(float));
  }
};

// An owned weight: values (or codes) and, for FP8, the scales.
struct Weight {
  Tensor values;
  Tensor scale_inv;  // empty unless values are kF8E4M3
  bool fp8_activations = false;  // WeightView::fp8_activations

  Weight() = default;
  Weight(Tensor v) : values(std::move(v)) {}  // NOLINT: a plain weight is a tensor
  Weight(Tensor codes, Tensor scales, bool w8a8)
      : values(std::move(codes)), scale_inv(std::move(scales)), fp8_activations(w8a8) {}

  WeightView cview() const {
    if (values.dtype() != DType::kF8E4M3) return WeightView(values.cview());
    return {values.cview(), scale_inv.cview(), fp8_activations};
  }
  const Shape& shape() const { return values.shape(); }
  DType dtype() const { return values.dtype(); }
  Device device() const { return values.device(); }
  int64_t numel() const { return values.numel(); }
  bool defined() const { return values.defined(); }
  bool is_fp8() const { return values.dtype() == DType::kF8E4M3; }
};

}  // namespace deepinfer
