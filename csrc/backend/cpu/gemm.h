// Row-major single-precision GEMM on the host: C[M, N] = alpha * A[M, K] · op(B) + beta * C.
#pragma once

#include <cstdint>

namespace deepinfer::cpu {

enum class Transpose : uint8_t { kNo, kYes };

struct SgemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // [M, K], leading dimension lda
  int64_t lda = 0;
  const float* b = nullptr;  // [K, N] (kNo) or [N, K] (kYes), leading dimension ldb
  int64_t ldb = 0;
  Transpose transpose_b = Transpose::kYes;
  float* c = nullptr;        // [M, N], leading dimension ldc
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// OpenBLAS when built with it, otherwise a simple OpenMP loop.
void sgemm(const SgemmArgs& a);

}  // namespace deepinfer::cpu
