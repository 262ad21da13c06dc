// Parameters of the FP8 skinny GEMM: decode-sized token counts times block-scaled FP8 weights (e4m3 codes with one
// float32 scale_inv per 128 x 128 block, core/weight.h), up to kFp8SkinnyMaxProblems products of the same activations
// in one launch:
//   acc[t, n] = sum_k x[t, k] * e4m3(w[n, k]) * scale_inv[n / 128, k / 128]     (fp32 accumulation)
// with the skinny GEMM's epilogues (skinny_gemm_params.h): kStore, kAccumulate, kSiluMul (w = [gate; up], the scale
// grid that of the 2 * n_out rows). x is bf16, row-major with K contiguous; out bf16 or fp32. The kernel reads x as
// fp16, rescaled per token by a power of two (fp8_convert.cuh), into buffers the caller provides.
#pragma once

#include <cstdint>

#include "backend/cuda/gemm/skinny_gemm_params.h"

namespace deepinfer::cuda {

inline constexpr int kFp8SkinnyMaxProblems = 3;

struct Fp8SkinnyProblem {
  const uint8_t* w = nullptr;          // [rows, k_dim] e4m3 codes, rows = n_out (kSiluMul: 2 * n_out)
  const float* scale_inv = nullptr;    // [ceil(rows / 128), k_dim / 128]
  void* out = nullptr;                 // bf16 or fp32 (out_f32)
  int64_t n_out = 0;                   // output columns
  int64_t out_row_stride = 0;          // elements
  SkinnyEpilogue epilogue = SkinnyEpilogue::kStore;
  bool out_f32 = false;
};

struct Fp8SkinnyGemmParams {
  const uint16_t* x = nullptr;  // [tokens, k_dim] bf16, rows x_row_stride elements apart
  int64_t tokens = 0;           // 1..kFp8SkinnyMaxTokens
  int64_t k_dim = 0;            // a multiple of 128
  int64_t x_row_stride = 0;
  int num_problems = 0;
  Fp8SkinnyProblem problems[kFp8SkinnyMaxProblems];
  uint16_t* x_f16 = nullptr;   // [tokens, k_dim] fp16, 16-byte aligned: x rescaled, written by fp8_skinny_gemm
  float* x_unscale = nullptr;  // [tokens]: the inverse of each token's power-of-two scale, likewise
  int32_t num_sms = 132;
};

}  // namespace deepinfer::cuda
