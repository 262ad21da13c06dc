// Dense CPU ops: linear, per-head linear, embedding, norms, activation.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/weight_values.h"

namespace deepinfer::cpu {

void linear(const LinearArgs& a) {
  a.validate();
  expect_host(a.out, "linear");
  std::vector<float> dequantized;
  sgemm({.m = a.x.shape[0], .n = a.w.shape[0], .k = a.x.shape[1], .a = a.x.f32(), .lda = a.x.shape[1],
         .b = weight_values(a.w, dequantized), .ldb = a.w.shape[1], .transpose_b = Transpose::kYes, .c = a.out.f32(),
         .ldc = a.out.shape[1], .beta = a.accumulate ? 1.0f : 0.0f});
}

void head_linear(const HeadLinearArgs& a) {
  a.validate();
  expect_host(a.out, "head_linear");
  const int64_t tokens = a.x.shape[0], heads = a.x.shape[1], in = a.x.shape[2], out = a.w.shape[1];
  const int64_t x_stride = a.x_head_stride == 0 ? in : a.x_head_stride;
  const int64_t out_stride = a.out_head_stride == 0 ? out : a.out_head_stride;
  // One strided GEMM per head: the rows of head h are `heads * stride` apart in both x and out.
  for (int64_t h = 0; h < heads; ++h) {
    sgemm({.m = tokens, .n = out, .k = in, .a = a.x.f32() + h * x_stride, .lda = heads * x_stride,
           .b = a.w.f32() + h * out * in, .ldb = in, .transpose_b = Transpose::kYes, .c = a.out.f32() + h * out_stride,
           .ldc = heads * out_stride});
  }
}

void embedding(const EmbeddingArgs& a) {
  a.validate();
  expect_host(a.out, "embedding");
  const int64_t dim = a.table.shape[1];
  const float* table = a.table.f32();
  const int32_t* ids = a.token_ids.as<int32_t>();
  float* out = a.out.f32();
  const int64_t rows = a.table.shape[0];
  for (int64_t t = 0; t < a.out.shape[0]; ++t) {
    const int64_t row = static_cast<int64_t>(ids[t]) - a.first_row;
    if (row < 0 || row >= rows) {
      std::memset(out + t * dim, 0, sizeof(float) * dim);  // another rank's row
    } else {
      std::memcpy(out + t * dim, table + row * dim, sizeof(float) * dim);
    }
  }
}

namespace {
void normalize_row(const float* x, const float* w, float* out, int64_t dim, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) out[i] = w[i] * (x[i] * inv_rms);
}
}  // namespace

void rms_norm(const RmsNormArgs& a) {
  a.validate();
  expect_host(a.x, "rms_norm");
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  const int64_t stride = a.row_stride == 0 ? dim : a.row_stride;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    normalize_row(a.x.f32() + r * stride, a.weight.f32(), a.out.f32() + r * stride, dim, a.eps);
  }
}

void add_rms_norm(const AddRmsNormArgs& a) {
  a.validate();
  expect_host(a.residual, "add_rms_norm");
  const int64_t rows = a.residual.shape[0], dim = a.residual.shape[1];
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = a.residual.f32() + r * dim;
    const float* x = a.x.f32() + r * dim;
    for (int64_t i = 0; i < dim; ++i) res[i] += x[i];
    normalize_row(res, a.weight.f32(), a.out.f32() + r * dim, dim, a.eps);
  }
}

void silu_mul(const SiluMulArgs& a) {
  a.validate();
  expect_host(a.out, "silu_mul");
  const int64_t rows = a.out.shape[0], inter = a.out.shape[1];
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = a.gate_up.f32() + r * 2 * inter;
    const float* up = gate + inter;
    float* out = a.out.f32() + r * inter;
    for (int64_t i = 0; i < inter; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

void add(const AddArgs& a) {
  a.validate();
  expect_host(a.x, "add");
  float* x = a.x.f32();
  const float* y = a.y.f32();
  const int64_t n = a.x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace deepinfer::cpu
