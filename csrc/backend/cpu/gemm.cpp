#include "backend/cpu/gemm.h"

#ifdef DEEPINFER_HAVE_CBLAS
#include <cblas.h>
#endif

namespace deepinfer::cpu {

void sgemm(const SgemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
#ifdef DEEPINFER_HAVE_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, g.transpose_b == Transpose::kYes ? CblasTrans : CblasNoTrans,
              static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, g.a,
              static_cast<int>(g.lda), g.b, static_cast<int>(g.ldb), g.beta, g.c, static_cast<int>(g.ldc));
#else
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < g.k; ++p) {
        const float bv = g.transpose_b == Transpose::kYes ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc += g.a[i * g.lda + p] * bv;
      }
      float& c = g.c[i * g.ldc + j];
      c = g.alpha * acc + (g.beta == 0.0f ? 0.0f : g.beta * c);
    }
  }
#endif
}

}  // namespace deepinfer::cpu
