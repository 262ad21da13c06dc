// Parameters of the INT4 skinny GEMM: decode-sized token counts times packed 4-bit weights (W4A16; the packing, the
// group scales and the zero points are core/weight.h's), up to kInt4SkinnyMaxProblems products of the same activations
// in one launch:
//   acc[t, n] = sum_k x[t, k] * (q[n, k] - z[n, k / G]) * scale[n, k / G]     (fp32 accumulation)
// or, for FP4 weights (e2m1, the same packing, no zero points), x[t, k] * e2m1(q[n, k]) * scale[n, k / G].
// with the skinny GEMM's epilogues (skinny_gemm_params.h): kStore, kAccumulate, kSiluMul (w = [gate; up], the groups
// those of the 2 * n_out rows). x is bf16, row-major with K contiguous; out bf16 or fp32.
#pragma once

#include <cstdint>

#include "backend/cuda/gemm/skinny_gemm_params.h"

namespace deepinfer::cuda {

inline constexpr int kInt4SkinnyMaxProblems = 3;

struct Int4SkinnyProblem {
  const uint32_t* w = nullptr;       // [rows, k_dim / 8] packed words, rows = n_out (kSiluMul: 2 * n_out)
  const float* scales = nullptr;     // [rows, k_dim / group_size]
  const int32_t* zeros = nullptr;    // [rows, ceil(k_dim / group_size / 8)] packed zero points; null: symmetric
  void* out = nullptr;               // bf16 or fp32 (out_f32)
  int64_t n_out = 0;                 // output columns
  int64_t out_row_stride = 0;        // elements
  int64_t group_size = 0;            // INT4: a multiple of 32 dividing k_dim; FP4: a power of two >= 16 dividing it
  SkinnyEpilogue epilogue = SkinnyEpilogue::kStore;
  bool out_f32 = false;
};

struct Int4SkinnyGemmParams {
  const uint16_t* x = nullptr;  // [tokens, k_dim] bf16, rows x_row_stride elements apart
  int64_t tokens = 0;           // 1..kInt4SkinnyMaxTokens
  int64_t k_dim = 0;            // a multiple of 128
  int64_t x_row_stride = 0;
  int num_problems = 0;
  bool e2m1 = false;            // every problem's weight is FP4 (else every one is INT4)
  Int4SkinnyProblem problems[kInt4SkinnyMaxProblems];
  int32_t num_sms = 132;
};

}  // namespace deepinfer::cuda
