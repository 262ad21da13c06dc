// Where one FP8 cache row's bytes go in a pipeline stage of the FP8 MLA decode kernel (mla_decode_fp8_kernel.cuh);
// included by mla_decode_kernels.cuh, whose tile loads copy rows of either format.
//
// A row (backend/ops/latent_fp8.h at DeepSeek's dims) is 41 chunks of 16 bytes: 32 of e4m3 codes, 1 of four float32
// scales, 8 of bf16 k_pe. A stage holds a tile's 64 rows in three regions, each laid out for the reads that use it:
//   codes   [64][512] bytes: chunk c of row r at chunk c ^ 4 (r & 1). The QK loop reads 16 codes a lane, the four
//           lanes of a row the four chunks of a 64-code block; the eight lanes of a quarter warp (one 16-byte read
//           each) cover rows 2q and 2q + 1, and the XOR puts the odd row's chunks in the other half of the 128-byte
//           bank line, so they read 8 distinct bank groups.
//   scales  [64][4] float32, 16 bytes a row: eight rows of a read are eight distinct bank groups.
//   rope    [64][64] bf16 in the swizzle of one column block of the bf16 tile (tile_offset), read by ldmatrix.
// 32 KB + 1 KB + 8 KB = 64 rows of 656 bytes: nothing is padded, so a stage is 57% of a bf16 tile.
#pragma once

#include <cstdint>

#include "backend/cuda/mla/mla_decode_internal.h"
#include "backend/cuda/mla/mla_decode_params.h"

namespace deepinfer::cuda::mla_detail {

struct Fp8Stage {
  static constexpr int kGroup = 128;                                    // codes a scale covers
  static constexpr int kCodeChunks = kValueDim / 16;                    // 32
  static constexpr int kScaleChunks = kValueDim / kGroup * 4 / 16;      // 1
  static constexpr int kRopeChunks = (kHeadDim - kValueDim) * 2 / 16;   // 8
  static constexpr int kRowChunks = kCodeChunks + kScaleChunks + kRopeChunks;  // 41
  static constexpr int kRowBytes = kRowChunks * 16;                     // 656
  static constexpr int kCodes = 0;                                      // [64][512] e4m3, swizzled
  static constexpr int kScales = kCodes + kBlockN * kCodeChunks * 16;   // [64][4] float32
  static constexpr int kRope = kScales + kBlockN * kScaleChunks * 16;   // [64][64] bf16, swizzled
  static constexpr int kBytes = kRope + kBlockN * kRopeChunks * 16;     // 41,984
  static_assert(kRowBytes == kMlaDecodeFp8RowBytes, "DeepSeek's FP8 row: 512 codes, 4 scales, 64 bf16 values");
  static_assert(kScaleChunks == 1, "a row's scales fill one chunk");
  static_assert(kBytes == kBlockN * kRowBytes, "a stage is its rows' bytes, unpadded");
  static_assert(kRope % 1024 == 0 && kBytes % 128 == 0, "regions and stages keep the swizzles' alignment");
};

// Byte offset, in a stage, of the 16 codes in chunk `chunk` (of 32) of row `row`.
__device__ __forceinline__ uint32_t fp8_codes_offset(int row, int chunk) {
  return static_cast<uint32_t>(Fp8Stage::kCodes + row * (Fp8Stage::kCodeChunks * 16) +
                               ((chunk ^ ((row & 1) << 2)) << 4));
}
// ... of row `row`'s four scales.
__device__ __forceinline__ uint32_t fp8_scales_offset(int row) {
  return static_cast<uint32_t>(Fp8Stage::kScales + row * 16);
}
// ... of rope chunk `chunk` (of 8: k_pe values 8 chunk .. + 8) of row `row`.
__device__ __forceinline__ uint32_t fp8_rope_offset(int row, int chunk) {
  return static_cast<uint32_t>(Fp8Stage::kRope + row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Where chunk `chunk` (of 41) of a cache row goes.
__device__ __forceinline__ uint32_t fp8_row_chunk_offset(int row, int chunk) {
  if (chunk < Fp8Stage::kCodeChunks) return fp8_codes_offset(row, chunk);
  if (chunk < Fp8Stage::kCodeChunks + Fp8Stage::kScaleChunks) return fp8_scales_offset(row);
  return fp8_rope_offset(row, chunk - Fp8Stage::kCodeChunks - Fp8Stage::kScaleChunks);
}

}  // namespace deepinfer::cuda::mla_detail
