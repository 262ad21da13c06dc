// The FP8 latent cache (kv_cache_dtype "fp8"): one token's row of one layer, the layout FlashMLA reads.
//
//   bytes [0, rank)                       c_kv as e4m3fn codes
//   then ceil(rank / 128) float32 scales  c_kv[i] = e4m3(code[i]) * scale[i / 128]
//   then rope_dim bfloat16 values         k_pe (rotated), kept in bf16: rope needs its precision
//   then zero padding to a multiple of 16 bytes
// DeepSeek's dims (rank 512, rope 64) give 512 + 16 + 128 = 656 bytes a token a layer, against 1,152 in bf16, so the
// same memory holds 1.756x the tokens. A cache in this layout is a tensor of dtype kF8E4M3 and shape
// [num_pages, page_size, row_bytes]: the dtype names the layout, the last dimension counts bytes.
//
// Each scale is a power of two, the smallest 2^k with amax / 2^k <= 448 (an all-zero group gets 1; DeepSeek's
// "ue8m0" scale format). A code times a power of two is exactly a bfloat16 (e4m3 has 3 mantissa bits, bf16 7, and
// the exponent stays in range for any latent a model produces), so a kernel widens a row to bf16 without rounding and
// every backend reads the same values. The cost against a float scale (amax / 448) is at most one binade of the top
// code range left unused in a group; e4m3's relative precision is the same in every normal binade.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace deepinfer {

struct LatentFp8Layout {
  static constexpr int64_t kGroup = 128;  // c_kv values a scale covers
  int64_t rank = 0;                       // kv_lora_rank
  int64_t rope_dim = 0;                   // qk_rope_head_dim

  int64_t num_groups() const { return (rank + kGroup - 1) / kGroup; }
  int64_t scales_offset() const { return rank; }
  int64_t rope_offset() const { return scales_offset() + 4 * num_groups(); }
  int64_t row_bytes() const { return (rope_offset() + 2 * rope_dim + 15) / 16 * 16; }
};

// True when `cache` ([num_pages, page_size, last]) is in the FP8 layout (its dtype is kF8E4M3).
inline bool is_fp8_latent_cache(const ConstTensorView& cache) { return cache.dtype == DType::kF8E4M3; }

// The scale of a group whose largest magnitude is `amax`: the smallest power of two 2^k with amax / 2^k <= 448,
// 1 for 0 (and for a non-finite amax, whose codes are then NaN).
float latent_fp8_scale(float amax);

// One row: latent = c_kv (rank values) | k_pe (rope_dim values) into `row` (row_bytes bytes), and back. The codes
// round to nearest even; k_pe rounds to bfloat16 (nearest even).
void quantize_latent_fp8_row(std::span<const float> latent, const LatentFp8Layout& layout, std::span<uint8_t> row);
void dequantize_latent_fp8_row(std::span<const uint8_t> row, const LatentFp8Layout& layout, std::span<float> latent);

}  // namespace deepinfer
