// Backend op tests. Every op of the CPU reference runs against a naive formula written here (straight loops, double
// accumulation; mla_prepare's lives in mla_prepare_cases.h, shared with the CUDA tests, MoE's in moe_cases.h and
// sampling's in sample_cases.h) on random inputs, odd and zero-length shapes included; the MLA cases use a paged
// cache with scattered pages, NaN-poisoned unused pages and slots, and invalid unused page-table entries. The cases live in one registry
// (op_test_harness.h), so a device backend runs the same cases against the CPU; a coverage check fails any OpKind
// without a case. With CUDA, the first device kernels run against the CPU reference when a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/counter_rng.h"
#include "core/fp8.h"
#include "core/half.h"
#include "mla_prepare_cases.h"
#include "moe_cases.h"
#include "op_test_harness.h"
#include "sample_cases.h"

#ifdef DEEPINFER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/norm/rms_norm.cuh"
#include "cuda_device_required.h"
#endif

namespace deepinfer::op_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<double> widen(std::span<const float> v) { return {v.begin(), v.end()}; }

// Splits a flat buffer into the elements `mask` selects (compared with the threshold) and the rest (compared exactly:
// an op must leave them untouched).
Outputs split_by_mask(std::span<const double> values, const std::vector<bool>& mask, const std::string& selected,
                      const std::string& rest) {
  Output in{.name = selected, .values = {}}, out{.name = rest, .values = {}, .compare = Compare::kExact};
  for (size_t i = 0; i < values.size(); ++i) (mask[i] ? in : out).values.push_back(values[i]);
  return {in, out};
}

// ---------------------------------------------------------------------------------------------------------------
// Dense ops

void add_linear(CaseRegistry& r, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rng.uniform(m * k), w = rng.uniform(n * k);
  r.add({.op = OpKind::kLinear,
         .name = str_cat("linear_", m, "x", n, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, n}, DType::kF32);
           run.backend().linear({.x = run.upload(HostTensor::f32({m, k}, x)),
                                 .w = run.upload(HostTensor::f32({n, k}, w)), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out(m * n);
           for (int64_t i = 0; i < m; ++i) {
             for (int64_t j = 0; j < n; ++j) {
               double acc = 0.0;
               for (int64_t p = 0; p < k; ++p) acc += double(x[i * k + p]) * w[j * k + p];
               out[i * n + j] = acc;
             }
           }
           return {{"out", out}};
         }});
}

// out += x · w^T: the product added to what out holds.
void add_linear_accumulate(CaseRegistry& r, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rng.uniform(m * k), w = rng.uniform(n * k), prior = rng.uniform(m * n, -3.0f, 3.0f);
  r.add({.op = OpKind::kLinear,
         .name = str_cat("linear_accumulate_", m, "x", n, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.upload(HostTensor::f32({m, n}, prior), Access::kReadWrite);
           run.backend().linear({.x = run.upload(HostTensor::f32({m, k}, x)),
                                 .w = run.upload(HostTensor::f32({n, k}, w)), .out = out, .accumulate = true});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out = widen(prior);
           for (int64_t i = 0; i < m; ++i) {
             for (int64_t j = 0; j < n; ++j) {
               for (int64_t p = 0; p < k; ++p) out[i * n + j] += double(x[i * k + p]) * w[j * k + p];
             }
           }
           return {{"out", out}};
         }});
}

// out[i, j] = silu(x_i · w_j) * (x_i · w_{I + j}): gate rows first, then as many up rows.
void add_linear_silu_mul(CaseRegistry& r, int64_t m, int64_t inter, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rng.uniform(m * k), w = rng.uniform(2 * inter * k);
  r.add({.op = OpKind::kLinearSiluMul,
         .name = str_cat("linear_silu_mul_", m, "x", inter, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, inter}, DType::kF32);
           run.backend().linear_silu_mul({.x = run.upload(HostTensor::f32({m, k}, x)),
                                          .w = run.upload(HostTensor::f32({2 * inter, k}, w)), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out(m * inter);
           for (int64_t i = 0; i < m; ++i) {
             for (int64_t j = 0; j < inter; ++j) {
               double gate = 0.0, up = 0.0;
               for (int64_t p = 0; p < k; ++p) {
                 gate += double(x[i * k + p]) * w[j * k + p];
                 up += double(x[i * k + p]) * w[(inter + j) * k + p];
               }
               out[i * inter + j] = gate / (1.0 + std::exp(-gate)) * up;
             }
           }
           return {{"out", out}};
         }});
}

// Two or three products of one x: a plain one, a gated one (silu(gate) * up) and, with three, another plain one.
void add_multi_linear(CaseRegistry& r, int64_t m, int64_t k, std::vector<int64_t> widths, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rng.uniform(m * k);
  std::vector<std::vector<float>> ws;
  std::vector<int64_t> rows;  // weight rows of each target; target 1 is gated: [gate; up]
  for (size_t i = 0; i < widths.size(); ++i) rows.push_back(i == 1 ? 2 * widths[i] : widths[i]);
  for (size_t i = 0; i < widths.size(); ++i) ws.push_back(rng.uniform(rows[i] * k));
  r.add({.op = OpKind::kMultiLinear,
         .name = str_cat("multi_linear_", m, "x", k, "_", widths.size(), "_targets"),
         .run = [=](OpRunner& run) -> Outputs {
           std::vector<LinearTarget> targets;
           for (size_t i = 0; i < widths.size(); ++i) {
             targets.push_back({.w = run.upload(HostTensor::f32({rows[i], k}, ws[i])),
                                .out = run.output({m, widths[i]}, DType::kF32), .silu_mul = i == 1});
           }
           run.backend().multi_linear({.x = run.upload(HostTensor::f32({m, k}, x)), .targets = targets});
           Outputs outs;
           for (size_t i = 0; i < widths.size(); ++i) outs.push_back({str_cat("out", i), run.fetch(targets[i].out)});
           return outs;
         },
         .naive = [=]() -> Outputs {
           Outputs outs;
           for (size_t i = 0; i < widths.size(); ++i) {
             std::vector<double> out(m * widths[i]);
             const auto dot = [&](int64_t token, int64_t row) {
               double acc = 0.0;
               for (int64_t p = 0; p < k; ++p) acc += double(x[token * k + p]) * ws[i][row * k + p];
               return acc;
             };
             for (int64_t t = 0; t < m; ++t) {
               for (int64_t j = 0; j < widths[i]; ++j) {
                 if (i == 1) {
                   const double gate = dot(t, j);
                   out[t * widths[i] + j] = gate / (1.0 + std::exp(-gate)) * dot(t, widths[i] + j);
                 } else {
                   out[t * widths[i] + j] = dot(t, j);
                 }
               }
             }
             outs.push_back({str_cat("out", i), out});
           }
           return outs;
         }});
}

// x rows (t, h) `x_stride` elements apart (0 = K) and out rows `out_stride` apart (0 = N), as in the absorbed decode:
// x the q_nope columns of the queries, out the q_latent columns of the decode query. The values between out rows
// must stay untouched.
void add_head_linear(CaseRegistry& r, int64_t t, int64_t h, int64_t k, int64_t n, int64_t x_stride,
                     int64_t out_stride, uint64_t seed) {
  Rng rng(seed);
  const int64_t xs = x_stride == 0 ? k : x_stride, os = out_stride == 0 ? n : out_stride;
  const std::vector<float> x = rng.uniform(t * h * xs), w = rng.uniform(h * n * k);
  const std::vector<float> prior_out = rng.uniform(t * h * os, 7.0f, 8.0f);
  std::vector<bool> written(static_cast<size_t>(t * h * os));
  for (int64_t i = 0; i < t * h * os; ++i) written[i] = i % os < n;
  r.add({.op = OpKind::kHeadLinear,
         .name = str_cat("head_linear_", t, "x", h, "x", k, "x", n, x_stride ? str_cat("_xstride", x_stride) : "",
                         out_stride ? str_cat("_outstride", out_stride) : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView x_buf = run.upload(HostTensor::f32({t, h, xs}, x));
           const TensorView out_buf = run.upload(HostTensor::f32({t, h, os}, prior_out), Access::kReadWrite);
           run.backend().head_linear({.x = x_buf.columns(0, k), .w = run.upload(HostTensor::f32({h, n, k}, w)),
                                      .out = out_buf.columns(0, n), .x_head_stride = x_stride,
                                      .out_head_stride = out_stride});
           return split_by_mask(run.fetch(out_buf), written, "out", "between_rows");
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out = widen(prior_out);
           for (int64_t i = 0; i < t; ++i) {
             for (int64_t hh = 0; hh < h; ++hh) {
               for (int64_t j = 0; j < n; ++j) {
                 double acc = 0.0;
                 for (int64_t p = 0; p < k; ++p) acc += double(x[(i * h + hh) * xs + p]) * w[(hh * n + j) * k + p];
                 out[(i * h + hh) * os + j] = acc;
               }
             }
           }
           return split_by_mask(out, written, "out", "between_rows");
         }});
}

void add_embedding(CaseRegistry& r, const std::string& tag, int64_t vocab, int64_t dim, std::vector<int32_t> ids,
                   Expect expect, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> table = rng.uniform(vocab * dim);
  const int64_t t = static_cast<int64_t>(ids.size());
  r.add({.op = OpKind::kEmbedding,
         .name = str_cat("embedding_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({t, dim}, DType::kF32);
           run.backend().embedding({.token_ids = run.upload(HostTensor::i32({t}, ids)),
                                    .table = run.upload(HostTensor::f32({vocab, dim}, table)), .out = out});
           return {{"out", run.fetch(out), Compare::kExact}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out;
           for (int32_t id : ids) {
             for (int64_t d = 0; d < dim; ++d) out.push_back(table[id * dim + d]);
           }
           return {{"out", out, Compare::kExact}};
         },
         .expect = expect});
}

// out[i] = src[indices[i]]: the logits rows out of the hidden states (repeats allowed).
void add_gather_rows(CaseRegistry& r, const std::string& tag, int64_t rows, int64_t dim, std::vector<int32_t> indices,
                     Expect expect, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> src = rng.uniform(rows * dim);
  const int64_t m = static_cast<int64_t>(indices.size());
  r.add({.op = OpKind::kGatherRows,
         .name = str_cat("gather_rows_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, dim}, DType::kF32);
           run.backend().gather_rows({.src = run.upload(HostTensor::f32({rows, dim}, src)),
                                      .indices = run.upload(HostTensor::i32({m}, indices)), .out = out});
           return {{"out", run.fetch(out), Compare::kExact}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out;
           for (int32_t i : indices) {
             for (int64_t d = 0; d < dim; ++d) out.push_back(src[i * dim + d]);
           }
           return {{"out", out, Compare::kExact}};
         },
         .expect = expect});
}

// A [rows, cols] block copied from columns [src_col, src_col + cols) of rows `src_stride` wide into columns
// [dst_col, ...) of rows `dst_stride` wide; the rest of dst keeps its values.
struct StridedCopy {
  int64_t rows = 0, cols = 0;
  int64_t src_stride = 0, src_col = 0;
  int64_t dst_stride = 0, dst_col = 0;
};

void add_copy_strided(CaseRegistry& r, const std::string& tag, StridedCopy l, Expect expect, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> src = rng.uniform(l.rows * l.src_stride);
  const std::vector<float> prior = rng.uniform(l.rows * l.dst_stride, 5.0f, 6.0f);
  std::vector<bool> copied(static_cast<size_t>(l.rows * l.dst_stride));
  for (int64_t i = 0; i < l.rows * l.dst_stride; ++i) {
    copied[i] = i % l.dst_stride >= l.dst_col && i % l.dst_stride < l.dst_col + l.cols;
  }
  r.add({.op = OpKind::kCopyStrided,
         .name = str_cat("copy_strided_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView src_buf = run.upload(HostTensor::f32({l.rows, l.src_stride}, src));
           const TensorView dst_buf = run.upload(HostTensor::f32({l.rows, l.dst_stride}, prior), Access::kReadWrite);
           run.backend().copy_strided({.src = src_buf.columns(l.src_col, l.cols),
                                       .dst = dst_buf.columns(l.dst_col, l.cols),
                                       .src_row_stride = expect == Expect::kThrows ? l.cols - 1 : l.src_stride,
                                       .dst_row_stride = l.dst_stride});
           return split_by_mask(run.fetch(dst_buf), copied, "copied", "untouched");
         },
         .naive = [=]() -> Outputs {
           std::vector<double> dst = widen(prior);
           for (int64_t i = 0; i < l.rows; ++i) {
             for (int64_t j = 0; j < l.cols; ++j) {
               dst[i * l.dst_stride + l.dst_col + j] = src[i * l.src_stride + l.src_col + j];
             }
           }
           return split_by_mask(dst, copied, "copied", "untouched");
         },
         .tolerance = 0.0,
         .expect = expect});
}

// Rows of `dim` values, `row_stride` apart (0 = dim), normalized in place or into a separate buffer of the same
// layout; the values between rows must stay untouched.
enum class Placement : uint8_t { kInPlace, kOutOfPlace };

void add_rms_norm(CaseRegistry& r, int64_t rows, int64_t dim, int64_t row_stride, Placement placement, float eps,
                  float x_scale, uint64_t seed) {
  Rng rng(seed);
  const int64_t stride = row_stride == 0 ? dim : row_stride;
  const std::vector<float> x = rng.uniform(rows * stride, -x_scale, x_scale);
  const std::vector<float> w = rng.uniform(dim, 0.5f, 1.5f);
  const std::vector<float> prior_out = rng.uniform(rows * stride);  // what the out-of-place buffer held before
  std::vector<bool> head(static_cast<size_t>(rows * stride));
  for (int64_t i = 0; i < rows * stride; ++i) head[i] = i % stride < dim;
  const bool in_place = placement == Placement::kInPlace;
  r.add({.op = OpKind::kRmsNorm,
         .name = str_cat("rms_norm_", rows, "x", dim, "_stride", row_stride, in_place ? "_inplace" : "", "_eps",
                         eps >= 0.1f ? "big" : "small"),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView x_buf =
               run.upload(HostTensor::f32({rows, stride}, x), in_place ? Access::kReadWrite : Access::kReadOnly);
           const TensorView out_buf =
               in_place ? x_buf : run.upload(HostTensor::f32({rows, stride}, prior_out), Access::kReadWrite);
           const TensorView x_view{x_buf.data, DType::kF32, {rows, dim}, run.device()};
           const TensorView out_view{out_buf.data, DType::kF32, {rows, dim}, run.device()};
           run.backend().rms_norm({.x = x_view, .weight = run.upload(HostTensor::f32({dim}, w)), .out = out_view,
                                   .eps = eps, .row_stride = row_stride});
           return split_by_mask(run.fetch(out_buf), head, "normalized", "between_rows");
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out = widen(in_place ? x : prior_out);
           for (int64_t i = 0; i < rows; ++i) {
             double sum_sq = 0.0;
             for (int64_t d = 0; d < dim; ++d) sum_sq += double(x[i * stride + d]) * x[i * stride + d];
             const double inv_rms = 1.0 / std::sqrt(sum_sq / double(dim) + eps);
             for (int64_t d = 0; d < dim; ++d) out[i * stride + d] = double(w[d]) * x[i * stride + d] * inv_rms;
           }
           return split_by_mask(out, head, "normalized", "between_rows");
         }});
}

void add_add_rms_norm(CaseRegistry& r, int64_t rows, int64_t dim, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> residual = rng.uniform(rows * dim, -2.0f, 2.0f), x = rng.uniform(rows * dim);
  const std::vector<float> w = rng.uniform(dim, 0.5f, 1.5f);
  const float eps = 1e-5f;
  r.add({.op = OpKind::kAddRmsNorm,
         .name = str_cat("add_rms_norm_", rows, "x", dim),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView res = run.upload(HostTensor::f32({rows, dim}, residual), Access::kReadWrite);
           const TensorView out = run.output({rows, dim}, DType::kF32);
           run.backend().add_rms_norm({.residual = res, .x = run.upload(HostTensor::f32({rows, dim}, x)),
                                       .weight = run.upload(HostTensor::f32({dim}, w)), .out = out, .eps = eps});
           return {{"residual", run.fetch(res)}, {"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> res(rows * dim), out(rows * dim);
           for (int64_t i = 0; i < rows; ++i) {
             double sum_sq = 0.0;
             for (int64_t d = 0; d < dim; ++d) {
               res[i * dim + d] = double(residual[i * dim + d]) + x[i * dim + d];
               sum_sq += res[i * dim + d] * res[i * dim + d];
             }
             const double inv_rms = 1.0 / std::sqrt(sum_sq / double(dim) + eps);
             for (int64_t d = 0; d < dim; ++d) out[i * dim + d] = double(w[d]) * res[i * dim + d] * inv_rms;
           }
           return {{"residual", res}, {"out", out}};
         }});
}

void add_silu_mul(CaseRegistry& r, int64_t rows, int64_t inter, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> gate_up = rng.uniform(rows * 2 * inter, -8.0f, 8.0f);
  r.add({.op = OpKind::kSiluMul,
         .name = str_cat("silu_mul_", rows, "x", inter),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({rows, inter}, DType::kF32);
           run.backend().silu_mul({.gate_up = run.upload(HostTensor::f32({rows, 2 * inter}, gate_up)), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out(rows * inter);
           for (int64_t i = 0; i < rows; ++i) {
             for (int64_t j = 0; j < inter; ++j) {
               const double g = gate_up[i * 2 * inter + j], u = gate_up[i * 2 * inter + inter + j];
               out[i * inter + j] = g / (1.0 + std::exp(-g)) * u;
             }
           }
           return {{"out", out}};
         }});
}

void add_add(CaseRegistry& r, Shape shape, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rng.uniform(shape.numel()), y = rng.uniform(shape.numel());
  std::string name = "add";
  for (int64_t d : shape.dims()) name += str_cat("_", d);
  r.add({.op = OpKind::kAdd,
         .name = name,
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView xv = run.upload(HostTensor::f32(shape, x), Access::kReadWrite);
           run.backend().add({.x = xv, .y = run.upload(HostTensor::f32(shape, y))});
           return {{"x", run.fetch(xv)}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out(x.size());
           for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) + y[i];
           return {{"x", out}};
         }});
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE: explicit cos/sin math. The angle is position * inv_freq rounded to fp32 (the op's contract, as in the
// reference models); cos and sin of it are taken in double and scaled by attention_scaling.

void add_rope(CaseRegistry& r, const std::string& tag, RopeLayout l, bool interleaved, float scaling, uint64_t seed) {
  Rng rng(seed);
  const int64_t size = l.tokens * l.token_stride;
  const std::vector<float> x = rng.uniform(size);
  std::vector<int32_t> positions(static_cast<size_t>(l.tokens));
  for (int32_t& p : positions) p = rng.integer(0, 5000);
  if (l.tokens > 0) positions[0] = 0;
  const std::vector<float> inv_freq = rope_inv_freq(l.rot_dim);
  const std::vector<bool> rotated = rope_rotated_mask(l);
  r.add({.op = OpKind::kRope,
         .name = str_cat("rope_", tag, interleaved ? "_interleaved" : "_half", scaling == 1.0f ? "" : "_scaled"),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView buf = run.upload(HostTensor::f32({size}, x), Access::kReadWrite);
           run.backend().rope({.x = buf.columns(l.offset, size - l.offset).data, .dtype = DType::kF32,
                               .device = run.device(), .num_heads = l.heads, .rot_dim = l.rot_dim,
                               .token_stride = l.token_stride, .head_stride = l.head_stride,
                               .positions = run.upload(HostTensor::i32({l.tokens}, positions)),
                               .inv_freq = run.upload(HostTensor::f32({l.rot_dim / 2}, inv_freq)),
                               .attention_scaling = scaling, .interleaved = interleaved});
           return split_by_mask(run.fetch(buf), rotated, "rotated", "untouched");
         },
         .naive = [=]() -> Outputs {
           std::vector<double> out = widen(x);
           const int64_t half = l.rot_dim / 2;
           for (int64_t t = 0; t < l.tokens; ++t) {
             for (int64_t h = 0; h < l.heads; ++h) {
               const int64_t base = t * l.token_stride + h * l.head_stride + l.offset;
               for (int64_t i = 0; i < half; ++i) {
                 const float angle = static_cast<float>(positions[t]) * inv_freq[i];
                 const double c = std::cos(double(angle)) * scaling, s = std::sin(double(angle)) * scaling;
                 const int64_t i0 = interleaved ? base + 2 * i : base + i;
                 const int64_t i1 = interleaved ? base + 2 * i + 1 : base + i + half;
                 out[i0] = double(x[i0]) * c - double(x[i1]) * s;
                 out[i1] = double(x[i1]) * c + double(x[i0]) * s;
               }
             }
           }
           return split_by_mask(out, rotated, "rotated", "untouched");
         }});
}

// ---------------------------------------------------------------------------------------------------------------
// MLA over a paged latent cache

struct MlaDims {
  int64_t heads = 0, rank = 0, rope = 0, nope = 0, v = 0, page_size = 0;
  int64_t latent_dim() const { return rank + rope; }
  int64_t qk_dim() const { return nope + rope; }
  std::string str() const { return str_cat("h", heads, "_r", rank, "_p", rope, "_n", nope, "_v", v, "_ps", page_size); }
};

// Sequences in a paged cache: each sequence's pages are scattered over the pool in random order, a few pages stay
// unused; unused page-table entries are -1 or out of range. The cache the run starts from is NaN everywhere, so
// unused pages and the slots past each context stay NaN after the cache write.
struct PagedBatch {
  int64_t page_size = 0, num_pages = 0, latent_dim = 0;
  int64_t rank = 0;   // with fp8: the FP8 layout (ops/latent_fp8.h), c_kv in the first `rank` columns
  bool fp8 = false;
  int32_t max_pages = 0;
  std::vector<int32_t> context_lens, query_start, page_table;
  std::vector<int32_t> token_start;  // [num_seqs + 1] sequence s's cached tokens: rows of `latents`
  std::vector<int32_t> slots;        // the cache slot of every cached token, in `latents` row order
  std::vector<float> latents;        // [cached tokens, latent_dim]: c_kv | k_pe
  std::vector<float> cached;         // what the cache keeps of them: latents, or their FP8 values

  // Bytes of one cache row in the FP8 layout: rank codes, a float32 scale per 128, rope bf16, padded to 16.
  int64_t fp8_row_bytes() const { return (rank + 4 * ((rank + 127) / 128) + 2 * (latent_dim - rank) + 15) / 16 * 16; }
  int64_t row_elements() const { return fp8 ? fp8_row_bytes() : latent_dim; }

  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  int64_t num_queries() const { return query_start.back(); }
  int64_t poisoned_slots() const { return num_pages * page_size - static_cast<int64_t>(slots.size()); }
  // The metadata, its arrays uploaded to the runner's memory.
  AttentionMetadata meta(OpRunner& run) const {
    const int32_t seqs = num_seqs();
    return {.query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)),
            .context_lens = run.upload(HostTensor::i32({seqs}, context_lens)),
            .page_table = run.upload(HostTensor::i32({seqs, max_pages}, page_table)),
            .num_seqs = seqs,
            .max_pages_per_seq = max_pages,
            .max_context_len = context_lens.empty() ? 0 : *std::max_element(context_lens.begin(), context_lens.end()),
            .total_context_len = std::accumulate(context_lens.begin(), context_lens.end(), int64_t{0})};
  }
};

// The FP8 cache's values of latent rows, written out from its definition (ops/latent_fp8.h): c_kv in groups of 128
// through e4m3 with the scale 2^ceil(log2(amax / 448)) (1 for an all-zero group), k_pe through bfloat16.
std::vector<float> fp8_cached_values(std::span<const float> latents, int64_t rank, int64_t dim) {
  std::vector<float> out(latents.begin(), latents.end());
  for (size_t row = 0; row * dim < out.size(); ++row) {
    float* x = out.data() + row * dim;
    for (int64_t g = 0; g < rank; g += 128) {
      const int64_t end = std::min(rank, g + 128);
      double amax = 0.0;
      for (int64_t i = g; i < end; ++i) amax = std::max(amax, std::fabs(double(x[i])));
      const double scale = amax > 0.0 ? std::exp2(std::ceil(std::log2(double(float(amax) / 448.0f)))) : 1.0;
      for (int64_t i = g; i < end; ++i) {
        x[i] = static_cast<float>(e4m3_to_float(float_to_e4m3(static_cast<float>(x[i] / scale))) * scale);
      }
    }
    for (int64_t i = rank; i < dim; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
  }
  return out;
}

// fp8: the cache in the FP8 layout, rank its c_kv columns.
PagedBatch make_paged_batch(Rng& rng, const std::vector<int32_t>& context_lens, const std::vector<int32_t>& queries,
                            int64_t page_size, int64_t latent_dim, bool fp8 = false, int64_t rank = 0) {
  PagedBatch b{.page_size = page_size, .latent_dim = latent_dim, .rank = rank, .fp8 = fp8,
               .context_lens = context_lens};
  const int32_t seqs = b.num_seqs();
  int64_t used_pages = 0, max_needed = 0;
  for (int32_t ctx : context_lens) {
    const int64_t pages = (ctx + page_size - 1) / page_size;
    used_pages += pages;
    max_needed = std::max(max_needed, pages);
  }
  b.num_pages = used_pages + 3;  // spare pages stay poisoned
  b.max_pages = static_cast<int32_t>(max_needed + 2);
  std::vector<int32_t> pool(static_cast<size_t>(b.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  b.page_table.assign(static_cast<size_t>(seqs) * b.max_pages, 0);
  b.query_start.push_back(0);
  b.token_start.push_back(0);
  size_t next_page = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    const int64_t pages = (context_lens[s] + page_size - 1) / page_size;
    for (int32_t p = 0; p < b.max_pages; ++p) {
      int32_t& entry = b.page_table[static_cast<size_t>(s) * b.max_pages + p];
      entry = p < pages ? pool[next_page++] : (p % 2 == 0 ? -1 : static_cast<int32_t>(b.num_pages + 5 + s));
    }
    for (int32_t j = 0; j < context_lens[s]; ++j) {
      b.slots.push_back(static_cast<int32_t>(b.page_table[static_cast<size_t>(s) * b.max_pages + j / page_size] *
                                             page_size + j % page_size));
    }
    b.query_start.push_back(b.query_start.back() + queries[s]);
    b.token_start.push_back(b.token_start.back() + context_lens[s]);
  }
  b.latents = rng.uniform(static_cast<int64_t>(b.slots.size()) * latent_dim);
  b.cached = fp8 ? fp8_cached_values(b.latents, rank, latent_dim) : b.latents;
  return b;
}

// The poisoned cache (NaN; in the FP8 layout all bytes 0xff, NaN as e4m3, bf16 and float32), then this batch's
// latents written through the backend's mla_cache_write.
TensorView write_paged_cache(OpRunner& run, const PagedBatch& b) {
  const Shape shape{b.num_pages, b.page_size, b.row_elements()};
  TensorView cache;
  if (b.fp8) {
    const std::vector<uint8_t> poison(static_cast<size_t>(shape.numel()), 0xff);
    cache = run.upload(HostTensor::from_raw(shape, DType::kF8E4M3, poison.data()), Access::kReadWrite);
  } else {
    const std::vector<float> poison(static_cast<size_t>(shape.numel()), kNaN);
    cache = run.upload(HostTensor::f32(shape, poison), Access::kReadWrite);
  }
  const int64_t tokens = static_cast<int64_t>(b.slots.size());
  run.backend().mla_cache_write({.latent = run.upload(HostTensor::f32({tokens, b.latent_dim}, b.latents)),
                                 .cache = cache, .slot_mapping = run.upload(HostTensor::i32({tokens}, b.slots)),
                                 .kv_lora_rank = b.rank});
  return cache;
}

// Cache rows that are entirely poison after the write (NaN; in the FP8 layout 0xff bytes): exactly the unused ones,
// or the poison was not real.
Output poisoned_rows(OpRunner& run, const TensorView& cache) {
  const int64_t row = cache.shape[2];
  int64_t count = 0;
  if (cache.dtype == DType::kF8E4M3) {
    const HostTensor c = run.download(cache);
    for (size_t r = 0; r * row < c.bytes.size(); ++r) {
      count += std::all_of(c.bytes.begin() + r * row, c.bytes.begin() + (r + 1) * row,
                           [](std::byte v) { return v == std::byte{0xff}; });
    }
  } else {
    const std::vector<double> c = run.fetch(cache);
    for (size_t r = 0; r * row < c.size(); ++r) {
      count += std::all_of(c.begin() + r * row, c.begin() + (r + 1) * row, [](double v) { return std::isnan(v); });
    }
  }
  return {"poisoned_rows", {double(count)}, Compare::kExact};
}

struct NaiveMla {
  std::vector<double> out;         // [T, H, v]     softmax · V with V decompressed per head
  std::vector<double> latent_out;  // [T, H, rank]  softmax · c_kv
};

// Naive causal MLA: K and V decompressed explicitly, per head, from the latents (not from the cache):
// k_j = [c_kv_j · W_UK^T | k_pe_j], v_j = c_kv_j · W_UV^T; query i of sequence s sits at position ctx - nq + i.
NaiveMla naive_mla(const PagedBatch& b, const MlaDims& d, std::span<const float> q, std::span<const float> kv_b,
                   double scale) {
  const int64_t tokens = b.num_queries(), kv_rows = d.nope + d.v, dim = d.latent_dim();
  NaiveMla result{.out = std::vector<double>(tokens * d.heads * d.v, 0.0),
                  .latent_out = std::vector<double>(tokens * d.heads * d.rank, 0.0)};
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t ctx = b.context_lens[s], nq = b.query_start[s + 1] - b.query_start[s];
    const float* lat = b.cached.data() + int64_t(b.token_start[s]) * dim;
    std::vector<double> k_nope(ctx * d.heads * d.nope), v(ctx * d.heads * d.v);
    for (int64_t j = 0; j < ctx; ++j) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t row = 0; row < kv_rows; ++row) {
          const float* w = kv_b.data() + (h * kv_rows + row) * d.rank;
          double acc = 0.0;
          for (int64_t c = 0; c < d.rank; ++c) acc += double(lat[j * dim + c]) * w[c];
          if (row < d.nope) {
            k_nope[(j * d.heads + h) * d.nope + row] = acc;
          } else {
            v[(j * d.heads + h) * d.v + row - d.nope] = acc;
          }
        }
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t row = b.query_start[s] + i, visible = ctx - nq + i + 1;
      for (int64_t h = 0; h < d.heads; ++h) {
        const float* qh = q.data() + (row * d.heads + h) * d.qk_dim();
        std::vector<double> p(visible);
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d.nope; ++e) dot += double(qh[e]) * k_nope[(j * d.heads + h) * d.nope + e];
          for (int64_t e = 0; e < d.rope; ++e) dot += double(qh[d.nope + e]) * lat[j * dim + d.rank + e];
          p[j] = dot * scale;
        }
        const double max_score = *std::max_element(p.begin(), p.end());
        double sum = 0.0;
        for (double& x : p) sum += (x = std::exp(x - max_score));
        for (int64_t j = 0; j < visible; ++j) {
          const double pj = p[j] / sum;
          for (int64_t e = 0; e < d.v; ++e) result.out[(row * d.heads + h) * d.v + e] += pj * v[(j * d.heads + h) * d.v + e];
          for (int64_t c = 0; c < d.rank; ++c) {
            result.latent_out[(row * d.heads + h) * d.rank + c] += pj * lat[j * dim + c];
          }
        }
      }
    }
  }
  return result;
}

// kv_b_proj [H * (nope + v), rank] split into the absorbed decode's per-head weights.
void split_kv_b(const MlaDims& d, const std::vector<float>& kv_b, std::vector<float>& w_uk_t, std::vector<float>& w_uv) {
  const int64_t kv_rows = d.nope + d.v;
  w_uk_t.assign(static_cast<size_t>(d.heads * d.rank * d.nope), 0.0f);  // [H, rank, nope]
  w_uv.assign(static_cast<size_t>(d.heads * d.v * d.rank), 0.0f);       // [H, v, rank]
  for (int64_t h = 0; h < d.heads; ++h) {
    for (int64_t c = 0; c < d.rank; ++c) {
      for (int64_t e = 0; e < d.nope; ++e) w_uk_t[(h * d.rank + c) * d.nope + e] = kv_b[(h * kv_rows + e) * d.rank + c];
      for (int64_t e = 0; e < d.v; ++e) w_uv[(h * d.v + e) * d.rank + c] = kv_b[(h * kv_rows + d.nope + e) * d.rank + c];
    }
  }
}

double mla_scale(const MlaDims& d) { return 1.3 / std::sqrt(double(d.qk_dim())); }

void add_mla_cache_write(CaseRegistry& r, int64_t num_pages, int64_t page_size, int64_t dim, int64_t tokens,
                         uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> prior = rng.uniform(num_pages * page_size * dim, 5.0f, 6.0f);
  const std::vector<float> latent = rng.uniform(tokens * dim);
  std::vector<int32_t> all_slots(static_cast<size_t>(num_pages * page_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + tokens);
  r.add({.op = OpKind::kMlaCacheWrite,
         .name = str_cat("mla_cache_write_", tokens, "_tokens_", num_pages, "x", page_size, "x", dim),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView cache = run.upload(HostTensor::f32({num_pages, page_size, dim}, prior), Access::kReadWrite);
           run.backend().mla_cache_write({.latent = run.upload(HostTensor::f32({tokens, dim}, latent)),
                                          .cache = cache,
                                          .slot_mapping = run.upload(HostTensor::i32({tokens}, slots))});
           return {{"cache", run.fetch(cache), Compare::kExact}};
         },
         .naive = [=]() -> Outputs {
           std::vector<double> cache = widen(prior);
           for (int64_t t = 0; t < tokens; ++t) {
             for (int64_t e = 0; e < dim; ++e) cache[slots[t] * dim + e] = latent[t * dim + e];
           }
           return {{"cache", cache, Compare::kExact}};
         }});
}

// Latent rows into an FP8 cache: the bytes read back, parsed by the layout's definition (codes, then a float32 scale
// per 128, then bf16 k_pe), must give the values fp8_cached_values derives, every scale a power of two, and the rows
// no token wrote still all 0xff.
void add_mla_cache_write_fp8(CaseRegistry& r, int64_t num_pages, int64_t page_size, int64_t rank, int64_t rope,
                             int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  const int64_t dim = rank + rope;
  std::vector<float> latent = rng.uniform(tokens * dim, -3.0f, 3.0f);
  if (tokens > 1) std::fill(latent.begin() + dim, latent.begin() + dim + std::min<int64_t>(rank, 128), 0.0f);  // a zero group
  std::vector<int32_t> all_slots(static_cast<size_t>(num_pages * page_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + tokens);
  const PagedBatch layout{.latent_dim = dim, .rank = rank, .fp8 = true};
  const int64_t row_bytes = layout.fp8_row_bytes(), groups = (rank + 127) / 128;
  r.add({.op = OpKind::kMlaCacheWrite,
         .name = str_cat("mla_cache_write_fp8_", tokens, "_tokens_", num_pages, "x", page_size, "_r", rank, "_p", rope),
         .run = [=](OpRunner& run) -> Outputs {
           const Shape shape{num_pages, page_size, row_bytes};
           const std::vector<uint8_t> poison(static_cast<size_t>(shape.numel()), 0xff);
           const TensorView cache =
               run.upload(HostTensor::from_raw(shape, DType::kF8E4M3, poison.data()), Access::kReadWrite);
           run.backend().mla_cache_write({.latent = run.upload(HostTensor::f32({tokens, dim}, latent)),
                                          .cache = cache,
                                          .slot_mapping = run.upload(HostTensor::i32({tokens}, slots)),
                                          .kv_lora_rank = rank});
           const HostTensor bytes = run.download(cache);
           const auto* base = reinterpret_cast<const uint8_t*>(bytes.bytes.data());
           std::vector<double> values;
           double non_power_scales = 0.0;
           for (int64_t t = 0; t < tokens; ++t) {
             const uint8_t* row = base + static_cast<int64_t>(slots[t]) * row_bytes;
             for (int64_t i = 0; i < rank; ++i) {
               float scale;
               std::memcpy(&scale, row + rank + 4 * (i / 128), 4);
               values.push_back(double(e4m3_to_float(row[i])) * scale);
             }
             for (int64_t g = 0; g < groups; ++g) {
               float scale;
               std::memcpy(&scale, row + rank + 4 * g, 4);
               int exponent = 0;
               non_power_scales += std::frexp(scale, &exponent) != 0.5f;
             }
             for (int64_t i = 0; i < rope; ++i) {
               uint16_t v;
               std::memcpy(&v, row + rank + 4 * groups + 2 * i, 2);
               values.push_back(bf16_to_float(v));
             }
           }
           return {{"values", values, Compare::kExact},
                   {"non_power_of_two_scales", {non_power_scales}, Compare::kExact},
                   poisoned_rows(run, cache)};
         },
         .naive = [=]() -> Outputs {
           return {{"values", widen(fp8_cached_values(latent, rank, dim)), Compare::kExact},
                   {"non_power_of_two_scales", {0.0}, Compare::kExact},
                   {"poisoned_rows", {double(num_pages * page_size - tokens)}, Compare::kExact}};
         }});
}

// The key test of MLA: absorbed decode == naive attention. One query per sequence; q_nope goes to latent space
// with W_UK (head_linear), mla_decode attends over the shared latent rows, W_UV (head_linear) brings the output
// back. Also checked: the latent output itself, and mla_prefill on the same queries (the decompressing path).
// fp8: over the FP8 cache, against naive attention over the values it keeps.
void add_mla_decode(CaseRegistry& r, const MlaDims& d, const std::vector<int32_t>& context_lens, uint64_t seed,
                    bool fp8 = false) {
  Rng rng(seed);
  const int64_t seqs = static_cast<int64_t>(context_lens.size());
  const PagedBatch b = make_paged_batch(rng, context_lens, std::vector<int32_t>(context_lens.size(), 1), d.page_size,
                                        d.latent_dim(), fp8, d.rank);
  const std::vector<float> q = rng.uniform(seqs * d.heads * d.qk_dim());
  const float w_range = static_cast<float>(std::sqrt(3.0 / double(d.rank)));
  const std::vector<float> kv_b = rng.uniform(d.heads * (d.nope + d.v) * d.rank, -w_range, w_range);
  std::vector<float> w_uk_t, w_uv;
  split_kv_b(d, kv_b, w_uk_t, w_uv);
  const float scale = static_cast<float>(mla_scale(d));
  std::string lens;
  for (int32_t c : context_lens) lens += str_cat("_", c);
  r.add({.op = OpKind::kMlaDecode,
         .name = str_cat("mla_decode_absorbed_", d.str(), "_ctx", lens, fp8 ? "_fp8_cache" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView cache = write_paged_cache(run, b);
           const AttentionMetadata meta = b.meta(run);
           Backend& be = run.backend();
           // The model's pipeline: q_abs [S, H, rank + rope] = [q_nope · W_UK | q_pe], built in place by a strided
           // head_linear and a strided copy, then the decode, then W_UV.
           const TensorView q_in = run.upload(HostTensor::f32({seqs, d.heads, d.qk_dim()}, q));
           const TensorView q_abs = run.output({seqs, d.heads, d.latent_dim()}, DType::kF32);
           be.head_linear({.x = q_in.columns(0, d.nope),
                           .w = run.upload(HostTensor::f32({d.heads, d.rank, d.nope}, w_uk_t)),
                           .out = q_abs.columns(0, d.rank), .x_head_stride = d.qk_dim(),
                           .out_head_stride = d.latent_dim()});
           be.copy_strided({.src = q_in.reshaped({seqs * d.heads, d.qk_dim()}).columns(d.nope, d.rope),
                            .dst = q_abs.reshaped({seqs * d.heads, d.latent_dim()}).columns(d.rank, d.rope),
                            .src_row_stride = d.qk_dim(), .dst_row_stride = d.latent_dim()});
           const TensorView o_latent = run.output({seqs, d.heads, d.rank}, DType::kF32);
           be.mla_decode({.q = q_abs, .cache = cache, .out_latent = o_latent, .meta = meta, .kv_lora_rank = d.rank,
                          .softmax_scale = scale});
           const TensorView out = run.output({seqs, d.heads, d.v}, DType::kF32);
           const TensorView w_uv_dev = run.upload(HostTensor::f32({d.heads, d.v, d.rank}, w_uv));
           be.head_linear({.x = o_latent, .w = w_uv_dev, .out = out});
           // The same decode with its value projection in the op (MlaDecodeArgs::w_uv), on scratch of its own.
           const TensorView scratch = run.output({seqs, d.heads, d.rank}, DType::kF32);
           const TensorView out_projected = run.output({seqs, d.heads, d.v}, DType::kF32);
           be.mla_decode({.q = q_abs, .cache = cache, .out_latent = scratch, .meta = meta, .kv_lora_rank = d.rank,
                          .softmax_scale = scale, .w_uv = w_uv_dev, .out = out_projected});
           const TensorView out_prefill = run.output({seqs, d.heads, d.v}, DType::kF32);
           be.mla_prefill({.q = q_in, .cache = cache,
                           .kv_b = run.upload(HostTensor::f32({d.heads * (d.nope + d.v), d.rank}, kv_b)),
                           .out = out_prefill, .meta = meta, .kv_lora_rank = d.rank, .qk_nope_head_dim = d.nope,
                           .v_head_dim = d.v, .softmax_scale = scale});
           return {{"latent_out", run.fetch(o_latent)},
                   {"out_absorbed", run.fetch(out)},
                   {"out_projected", run.fetch(out_projected)},
                   {"out_prefill", run.fetch(out_prefill)},
                   poisoned_rows(run, cache)};
         },
         .naive = [=]() -> Outputs {
           const NaiveMla n = naive_mla(b, d, q, kv_b, scale);
           return {{"latent_out", n.latent_out},
                   {"out_absorbed", n.out},
                   {"out_projected", n.out},
                   {"out_prefill", n.out},
                   {"poisoned_rows", {double(b.poisoned_slots())}, Compare::kExact}};
         }});
}

// Prefill and chunked prefill: sequence s has queries[s] new tokens at the end of context_lens[s] cached ones.
void add_mla_prefill(CaseRegistry& r, const MlaDims& d, const std::vector<int32_t>& context_lens,
                     const std::vector<int32_t>& queries, uint64_t seed, bool fp8 = false) {
  Rng rng(seed);
  const PagedBatch b = make_paged_batch(rng, context_lens, queries, d.page_size, d.latent_dim(), fp8, d.rank);
  const int64_t tokens = b.num_queries();
  const std::vector<float> q = rng.uniform(tokens * d.heads * d.qk_dim());
  const float w_range = static_cast<float>(std::sqrt(3.0 / double(d.rank)));
  const std::vector<float> kv_b = rng.uniform(d.heads * (d.nope + d.v) * d.rank, -w_range, w_range);
  const float scale = static_cast<float>(mla_scale(d));
  std::string lens;
  for (size_t s = 0; s < context_lens.size(); ++s) lens += str_cat("_", queries[s], "of", context_lens[s]);
  r.add({.op = OpKind::kMlaPrefill,
         .name = str_cat("mla_prefill_", d.str(), "_q", lens, fp8 ? "_fp8_cache" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView cache = write_paged_cache(run, b);
           const TensorView out = run.output({tokens, d.heads, d.v}, DType::kF32);
           run.backend().mla_prefill({.q = run.upload(HostTensor::f32({tokens, d.heads, d.qk_dim()}, q)),
                                      .cache = cache,
                                      .kv_b = run.upload(HostTensor::f32({d.heads * (d.nope + d.v), d.rank}, kv_b)),
                                      .out = out, .meta = b.meta(run), .kv_lora_rank = d.rank,
                                      .qk_nope_head_dim = d.nope, .v_head_dim = d.v, .softmax_scale = scale});
           return {{"out", run.fetch(out)}, poisoned_rows(run, cache)};
         },
         .naive = [=]() -> Outputs {
           return {{"out", naive_mla(b, d, q, kv_b, scale).out},
                   {"poisoned_rows", {double(b.poisoned_slots())}, Compare::kExact}};
         }});
}

// validate() must reject a page id out of range in a used page-table entry (and a decode sequence with two queries)
// when the metadata is in host memory.
enum class BadMeta : uint8_t { kPageTooLarge, kPageNegative, kTwoQueries };

void add_mla_bad_meta(CaseRegistry& r, OpKind op, BadMeta bad, uint64_t seed) {
  Rng rng(seed);
  const MlaDims d{.heads = 2, .rank = 8, .rope = 4, .nope = 4, .v = 6, .page_size = 4};
  std::vector<int32_t> queries = {1, 1, 1};
  if (bad == BadMeta::kTwoQueries) queries[1] = 2;
  PagedBatch b = make_paged_batch(rng, {3, 9, 6}, queries, d.page_size, d.latent_dim());
  if (bad == BadMeta::kPageTooLarge) b.page_table[1 * b.max_pages + 2] = static_cast<int32_t>(b.num_pages);
  if (bad == BadMeta::kPageNegative) b.page_table[2 * b.max_pages + 0] = -1;
  const int64_t tokens = b.num_queries();
  const char* what = bad == BadMeta::kPageTooLarge ? "page_too_large" : bad == BadMeta::kPageNegative ? "page_negative"
                                                                                                       : "two_queries";
  r.add({.op = op,
         .name = str_cat(op_name(op), "_rejects_", what),
         .run = [=](OpRunner& run) -> Outputs {
           const std::vector<float> cache_values(static_cast<size_t>(b.num_pages * d.page_size * d.latent_dim()), 0.5f);
           const TensorView cache = run.upload(HostTensor::f32({b.num_pages, d.page_size, d.latent_dim()}, cache_values));
           if (op == OpKind::kMlaDecode) {
             const int64_t seqs = b.num_seqs();  // one query row per sequence; query_start says otherwise
             const std::vector<float> q(static_cast<size_t>(seqs * d.heads * d.latent_dim()), 0.1f);
             run.backend().mla_decode({.q = run.upload(HostTensor::f32({seqs, d.heads, d.latent_dim()}, q)),
                                       .cache = cache, .out_latent = run.output({seqs, d.heads, d.rank}, DType::kF32),
                                       .meta = b.meta(run), .kv_lora_rank = d.rank});
           } else {
             const std::vector<float> q(static_cast<size_t>(tokens * d.heads * d.qk_dim()), 0.1f);
             const std::vector<float> kv_b(static_cast<size_t>(d.heads * (d.nope + d.v) * d.rank), 0.1f);
             run.backend().mla_prefill({.q = run.upload(HostTensor::f32({tokens, d.heads, d.qk_dim()}, q)),
                                        .cache = cache,
                                        .kv_b = run.upload(HostTensor::f32({d.heads * (d.nope + d.v), d.rank}, kv_b)),
                                        .out = run.output({tokens, d.heads, d.v}, DType::kF32), .meta = b.meta(run),
                                        .kv_lora_rank = d.rank, .qk_nope_head_dim = d.nope, .v_head_dim = d.v});
           }
           return {};
         },
         .expect = Expect::kThrowsOnHost});
}

// mla_decode's value projection given badly: w_uv without out, or w_uv whose width is not kv_lora_rank. The op
// throws before it writes anything.
void add_mla_decode_bad_projection(CaseRegistry& r, bool missing_out, uint64_t seed) {
  Rng rng(seed);
  const MlaDims d{.heads = 2, .rank = 8, .rope = 4, .nope = 4, .v = 6, .page_size = 4};
  const PagedBatch b = make_paged_batch(rng, {3, 9}, {1, 1}, d.page_size, d.latent_dim());
  const int64_t seqs = b.num_seqs();
  r.add({.op = OpKind::kMlaDecode,
         .name = str_cat("mla_decode_rejects_", missing_out ? "w_uv_without_out" : "w_uv_of_wrong_width"),
         .run = [=](OpRunner& run) -> Outputs {
           const std::vector<float> cache_values(static_cast<size_t>(b.num_pages * d.page_size * d.latent_dim()), 0.5f);
           const std::vector<float> q(static_cast<size_t>(seqs * d.heads * d.latent_dim()), 0.1f);
           const int64_t width = missing_out ? d.rank : d.rank + 1;
           const std::vector<float> w_uv(static_cast<size_t>(d.heads * d.v * width), 0.1f);
           run.backend().mla_decode(
               {.q = run.upload(HostTensor::f32({seqs, d.heads, d.latent_dim()}, q)),
                .cache = run.upload(HostTensor::f32({b.num_pages, d.page_size, d.latent_dim()}, cache_values)),
                .out_latent = run.output({seqs, d.heads, d.rank}, DType::kF32), .meta = b.meta(run),
                .kv_lora_rank = d.rank, .w_uv = run.upload(HostTensor::f32({d.heads, d.v, width}, w_uv)),
                .out = missing_out ? TensorView() : run.output({seqs, d.heads, d.v}, DType::kF32)});
           return {};
         },
         .expect = Expect::kThrows});
}

// ---------------------------------------------------------------------------------------------------------------
// The registry

CaseRegistry build_registry() {
  CaseRegistry r;
  // linear, head_linear: odd shapes, single elements, zero rows / columns / inner size
  add_linear(r, 5, 7, 11, 1);
  add_linear(r, 1, 1, 1, 2);
  add_linear(r, 3, 64, 33, 3);
  add_linear(r, 0, 7, 11, 4);
  add_linear(r, 5, 0, 11, 5);
  add_linear(r, 5, 7, 0, 6);
  add_linear_accumulate(r, 4, 9, 13, 7);
  add_linear_accumulate(r, 2, 3, 0, 8);
  add_linear_silu_mul(r, 5, 7, 11, 9);
  add_linear_silu_mul(r, 1, 1, 1, 13);
  add_linear_silu_mul(r, 0, 4, 3, 14);
  add_multi_linear(r, 3, 11, {5, 4}, 15);
  add_multi_linear(r, 1, 7, {2, 3, 9}, 16);
  add_multi_linear(r, 0, 4, {3, 2}, 17);
  add_head_linear(r, 5, 7, 11, 3, 0, 0, 10);
  add_head_linear(r, 1, 1, 1, 1, 0, 0, 11);
  add_head_linear(r, 3, 16, 128, 64, 0, 0, 12);
  add_head_linear(r, 0, 3, 5, 7, 0, 0, 13);
  add_head_linear(r, 4, 3, 6, 10, 9, 13, 14);   // q_nope of [T, H, 6 + 3] into q_latent of [T, H, 10 + 3]
  add_head_linear(r, 3, 5, 16, 32, 24, 0, 15);  // strided input only
  add_head_linear(r, 2, 4, 7, 5, 0, 8, 16);     // strided output only
  // embedding: random ids including both ends; no tokens; ids outside [0, V) throw
  add_embedding(r, "13x7", 13, 7, {0, 12, 5, 5, 3}, Expect::kMatch, 20);
  add_embedding(r, "no_tokens", 13, 7, {}, Expect::kMatch, 21);
  add_embedding(r, "rejects_id_V", 13, 7, {0, 13}, Expect::kThrowsOnHost, 22);
  add_embedding(r, "rejects_id_minus_1", 13, 7, {-1}, Expect::kThrowsOnHost, 23);
  // gather_rows: repeated and unordered rows, one row, no rows, an index outside [0, N)
  add_gather_rows(r, "9x5_of_7", 9, 5, {8, 0, 3, 3, 7, 1, 2}, Expect::kMatch, 140);
  add_gather_rows(r, "one_of_1", 1, 3, {0}, Expect::kMatch, 141);
  add_gather_rows(r, "none", 4, 6, {}, Expect::kMatch, 142);
  add_gather_rows(r, "rejects_index_N", 4, 6, {1, 4}, Expect::kThrowsOnHost, 143);
  // copy_strided: q_pe into the decode query, odd widths and offsets, dense to strided, no rows, a bad stride
  add_copy_strided(r, "q_pe_into_q_abs", {.rows = 6, .cols = 4, .src_stride = 12, .src_col = 8, .dst_stride = 20,
                                          .dst_col = 16}, Expect::kMatch, 144);
  add_copy_strided(r, "odd", {.rows = 5, .cols = 3, .src_stride = 7, .src_col = 1, .dst_stride = 5, .dst_col = 2},
                   Expect::kMatch, 145);
  add_copy_strided(r, "dense_src", {.rows = 3, .cols = 4, .src_stride = 4, .src_col = 0, .dst_stride = 9,
                                    .dst_col = 5}, Expect::kMatch, 146);
  add_copy_strided(r, "no_rows", {.rows = 0, .cols = 4, .src_stride = 6, .src_col = 2, .dst_stride = 4,
                                  .dst_col = 0}, Expect::kMatch, 147);
  add_copy_strided(r, "rejects_short_stride", {.rows = 2, .cols = 3, .src_stride = 5, .src_col = 0, .dst_stride = 3,
                                               .dst_col = 0}, Expect::kThrows, 148);
  // rms_norm: odd, zero rows, one column, strided rows of a wider buffer (the c_kv half of a latent row), in place
  add_rms_norm(r, 5, 7, 0, Placement::kOutOfPlace, 1e-6f, 1.0f, 30);
  add_rms_norm(r, 5, 7, 0, Placement::kInPlace, 1e-6f, 50.0f, 31);
  add_rms_norm(r, 0, 7, 0, Placement::kOutOfPlace, 1e-6f, 1.0f, 32);
  add_rms_norm(r, 3, 1, 0, Placement::kOutOfPlace, 1e-6f, 1.0f, 33);
  add_rms_norm(r, 5, 7, 11, Placement::kInPlace, 1e-6f, 1.0f, 34);
  add_rms_norm(r, 6, 512, 576, Placement::kInPlace, 1e-6f, 1.0f, 35);
  add_rms_norm(r, 5, 7, 11, Placement::kOutOfPlace, 1e-6f, 1.0f, 36);
  add_rms_norm(r, 4, 9, 0, Placement::kOutOfPlace, 0.5f, 0.1f, 37);  // eps comparable to the mean square
  add_add_rms_norm(r, 5, 7, 40);
  add_add_rms_norm(r, 3, 300, 41);
  add_add_rms_norm(r, 0, 7, 42);
  add_silu_mul(r, 5, 7, 50);
  add_silu_mul(r, 1, 1, 51);
  add_silu_mul(r, 0, 7, 52);
  add_add(r, {5, 7, 11}, 60);
  add_add(r, {0, 7}, 61);
  add_add(r, {1}, 62);
  // rope: q heads (rope slice after nope, with values after it), k_pe in a latent row, interleaved and half-split
  for (const bool interleaved : {true, false}) {
    add_rope(r, "q_5x3_nope6_rot8", {.tokens = 5, .heads = 3, .rot_dim = 8, .offset = 6, .head_stride = 17,
                                     .token_stride = 3 * 17}, interleaved, 1.0f, 70);
    add_rope(r, "q_5x3_nope6_rot8", {.tokens = 5, .heads = 3, .rot_dim = 8, .offset = 6, .head_stride = 17,
                                     .token_stride = 3 * 17}, interleaved, 1.2f, 71);
    add_rope(r, "k_pe_7_rank16_rot64", {.tokens = 7, .heads = 1, .rot_dim = 64, .offset = 16, .head_stride = 0,
                                        .token_stride = 16 + 64}, interleaved, 1.0f, 72);
    add_rope(r, "q_0_tokens", {.tokens = 0, .heads = 2, .rot_dim = 4, .offset = 0, .head_stride = 4,
                               .token_stride = 8}, interleaved, 1.0f, 73);
    add_rope(r, "q_2x2_rot2", {.tokens = 2, .heads = 2, .rot_dim = 2, .offset = 1, .head_stride = 3,
                               .token_stride = 7}, interleaved, 0.9f, 74);
  }
  // MLA: cache write; absorbed decode == naive (several heads, ranks, page sizes; contexts of 1, page-aligned,
  // non-aligned); prefill and chunked prefill; validation of page ids
  add_mla_cache_write(r, 7, 4, 10, 9, 80);
  add_mla_cache_write(r, 3, 5, 6, 0, 81);
  add_mla_cache_write(r, 2, 1, 3, 2, 82);
  // The FP8 layout: DeepSeek's dims, a rank under one group, and one whose last group is partial.
  add_mla_cache_write_fp8(r, 5, 64, 512, 64, 100, 83);
  add_mla_cache_write_fp8(r, 3, 5, 16, 8, 7, 84);
  add_mla_cache_write_fp8(r, 4, 3, 200, 6, 11, 85);
  add_mla_cache_write_fp8(r, 2, 1, 8, 4, 0, 86);
  // mla_prepare (norm, both ropes, cache write, q_abs rope columns) against its formula, at the shapes the CUDA
  // tests run; and the arguments it rejects
  add_mla_prepare_cases(r, DType::kF32, 1e-5, 200);
  for (const BadPrepare bad : {BadPrepare::kMoreDecodeThanTokens, BadPrepare::kQAbsWidth, BadPrepare::kOddRope,
                               BadPrepare::kNormWeightSize, BadPrepare::kSlotOutsideCache}) {
    add_mla_prepare_rejects(r, bad);
  }
  add_mla_decode(r, {.heads = 3, .rank = 16, .rope = 8, .nope = 8, .v = 12, .page_size = 4}, {1, 4, 5, 11, 23}, 90);
  add_mla_decode(r, {.heads = 1, .rank = 32, .rope = 16, .nope = 16, .v = 16, .page_size = 1}, {1, 2, 7}, 91);
  add_mla_decode(r, {.heads = 5, .rank = 64, .rope = 32, .nope = 24, .v = 40, .page_size = 16}, {17, 33, 1, 48}, 92);
  add_mla_decode(r, {.heads = 16, .rank = 512, .rope = 64, .nope = 128, .v = 128, .page_size = 64}, {1, 64, 65, 130},
                 93);
  add_mla_decode(r, {.heads = 4, .rank = 24, .rope = 8, .nope = 16, .v = 8, .page_size = 3}, {}, 94);
  // Over the FP8 cache (against naive attention over the values it keeps): a partial group, DeepSeek's dims.
  add_mla_decode(r, {.heads = 3, .rank = 16, .rope = 8, .nope = 8, .v = 12, .page_size = 4}, {1, 4, 5, 11, 23}, 95,
                 true);
  add_mla_decode(r, {.heads = 2, .rank = 200, .rope = 8, .nope = 8, .v = 12, .page_size = 7}, {1, 9, 30}, 96, true);
  add_mla_decode(r, {.heads = 16, .rank = 512, .rope = 64, .nope = 128, .v = 128, .page_size = 64}, {1, 64, 65, 130},
                 97, true);
  add_mla_prefill(r, {.heads = 3, .rank = 16, .rope = 8, .nope = 8, .v = 12, .page_size = 4},
                  {1, 5, 11, 9, 23, 4}, {1, 5, 3, 0, 23, 1}, 100);
  add_mla_prefill(r, {.heads = 4, .rank = 64, .rope = 32, .nope = 32, .v = 24, .page_size = 16}, {40, 33, 16},
                  {40, 7, 16}, 101);
  add_mla_prefill(r, {.heads = 2, .rank = 512, .rope = 64, .nope = 128, .v = 128, .page_size = 64}, {70, 65},
                  {70, 9}, 102);
  add_mla_prefill(r, {.heads = 1, .rank = 8, .rope = 4, .nope = 4, .v = 4, .page_size = 1}, {3, 1}, {2, 1}, 103);
  add_mla_prefill(r, {.heads = 2, .rank = 8, .rope = 4, .nope = 4, .v = 4, .page_size = 2}, {}, {}, 104);
  add_mla_prefill(r, {.heads = 3, .rank = 16, .rope = 8, .nope = 8, .v = 12, .page_size = 4},
                  {1, 5, 11, 9, 23, 4}, {1, 5, 3, 0, 23, 1}, 105, true);
  add_mla_prefill(r, {.heads = 2, .rank = 512, .rope = 64, .nope = 128, .v = 128, .page_size = 64}, {70, 65},
                  {70, 9}, 106, true);
  add_mla_bad_meta(r, OpKind::kMlaDecode, BadMeta::kPageTooLarge, 110);
  add_mla_bad_meta(r, OpKind::kMlaDecode, BadMeta::kPageNegative, 111);
  add_mla_bad_meta(r, OpKind::kMlaDecode, BadMeta::kTwoQueries, 112);
  add_mla_decode_bad_projection(r, true, 117);
  add_mla_decode_bad_projection(r, false, 118);
  add_mla_bad_meta(r, OpKind::kMlaPrefill, BadMeta::kPageTooLarge, 113);
  add_mla_bad_meta(r, OpKind::kMlaPrefill, BadMeta::kPageNegative, 114);
  // moe_route: V3 (sigmoid, bias, grouped top-2 sums, -inf masking, normalized, scaled) and V2 (softmax; greedy;
  // group-limited by group max)
  add_random_moe_route(r, "v3_e16_g4_keep2_k4", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                                 .experts = 16, .n_group = 4, .topk_group = 2, .top_k = 4,
                                                 .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
                       5, true, 120);
  add_random_moe_route(r, "v3_e256_g8_keep4_k8", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                                  .experts = 256, .n_group = 8, .topk_group = 4, .top_k = 8,
                                                  .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
                       7, true, 121);
  add_random_moe_route(r, "v3_e12_ungrouped_unnormalized", {.scoring = ExpertScoring::kSigmoid,
                                                            .method = TopkMethod::kNoauxTc, .experts = 12,
                                                            .n_group = 1, .topk_group = 1, .top_k = 3,
                                                            .norm_topk_prob = false, .routed_scaling_factor = 1.5f},
                       6, true, 122);
  add_random_moe_route(r, "v3_no_tokens", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                           .experts = 16, .n_group = 4, .topk_group = 2, .top_k = 4,
                                           .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
                       0, true, 123);
  add_random_moe_route(r, "v2_greedy_e10_k3", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy,
                                               .experts = 10, .n_group = 1, .topk_group = 1, .top_k = 3,
                                               .norm_topk_prob = false, .routed_scaling_factor = 16.0f},
                       5, false, 124);
  add_random_moe_route(r, "v2_lite_greedy_e64_k6", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy,
                                                    .experts = 64, .n_group = 1, .topk_group = 1, .top_k = 6,
                                                    .norm_topk_prob = false, .routed_scaling_factor = 1.0f},
                       9, false, 125);
  add_random_moe_route(r, "v2_group_limited_e12_g4_keep2_k3",
                       {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy, .experts = 12,
                        .n_group = 4, .topk_group = 2, .top_k = 3, .norm_topk_prob = false,
                        .routed_scaling_factor = 16.0f},
                       7, false, 126);
  add_random_moe_route(r, "v2_group_limited_normalized", {.scoring = ExpertScoring::kSoftmax,
                                                          .method = TopkMethod::kGroupLimitedGreedy, .experts = 20,
                                                          .n_group = 5, .topk_group = 3, .top_k = 4,
                                                          .norm_topk_prob = true, .routed_scaling_factor = 1.0f},
                       4, false, 127);
  add_tied_moe_route(r, "v2_lite_greedy_e64_k6_ties", {.scoring = ExpertScoring::kSoftmax,
                                                       .method = TopkMethod::kGreedy, .experts = 64, .n_group = 1,
                                                       .topk_group = 1, .top_k = 6, .norm_topk_prob = false,
                                                       .routed_scaling_factor = 1.0f, .num_shared = 2},
                     5, 128);
  add_tied_moe_route(r, "v3_e256_g8_keep4_k8_ties", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                                     .experts = 256, .n_group = 8, .topk_group = 4, .top_k = 8,
                                                     .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
                     3, 129);
  {
    std::vector<float> logits, bias;
    masked_group_inputs(6, logits, bias);
    add_moe_route(r, "v3_dropped_group_holds_the_best_expert", kMaskedGroupRoute, 6, logits, bias);
  }
  // ... and with the shared experts appended (V3: one; V2 and V2-Lite: two), over one route block, a few (the
  // fused scatter on a GPU) and many (the scatter kernel; 9 pairs a token take two rounds of it)
  constexpr RouteConfig kV3Shared{.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc, .experts = 256,
                                  .n_group = 8, .topk_group = 4, .top_k = 8, .norm_topk_prob = true,
                                  .routed_scaling_factor = 2.5f, .num_shared = 1};
  add_random_moe_route(r, "v3_e256_g8_keep4_k8", kV3Shared, 7, true, 135);
  add_random_moe_route(r, "v3_e256_g8_keep4_k8_t70", kV3Shared, 70, true, 136);
  add_random_moe_route(r, "v3_e256_g8_keep4_k8_t300", kV3Shared, 300, true, 137);
  add_random_moe_route(r, "v3_no_tokens", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                                           .experts = 16, .n_group = 4, .topk_group = 2, .top_k = 4,
                                           .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .num_shared = 1},
                       0, true, 138);
  add_random_moe_route(r, "v2_lite_greedy_e64_k6", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy,
                                                    .experts = 64, .n_group = 1, .topk_group = 1, .top_k = 6,
                                                    .norm_topk_prob = false, .routed_scaling_factor = 1.0f,
                                                    .num_shared = 2},
                       40, false, 139);
  add_random_moe_route(r, "v2_group_limited_e160_g8_keep3_k6",
                       {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy, .experts = 160,
                        .n_group = 8, .topk_group = 3, .top_k = 6, .norm_topk_prob = false,
                        .routed_scaling_factor = 16.0f, .num_shared = 2},
                       20, false, 140);
  add_random_moe_route(r, "v2_group_limited_e12_g4_keep2_k3",
                       {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy, .experts = 12,
                        .n_group = 4, .topk_group = 2, .top_k = 3, .norm_topk_prob = true,
                        .routed_scaling_factor = 16.0f, .num_shared = 2},
                       7, false, 141);
  {
    std::vector<float> logits, bias;
    masked_group_inputs(6, logits, bias);
    RouteConfig masked_shared = kMaskedGroupRoute;
    masked_shared.num_shared = 1;
    add_moe_route(r, "v3_dropped_group_holds_the_best_expert", masked_shared, 6, logits, bias);
  }
  add_moe_experts(r, {.tokens = 5, .dim = 7, .inter = 11, .routed = 6, .top_k = 2}, 130);
  add_moe_experts(r, {.tokens = 2, .dim = 7, .inter = 11, .routed = 6, .top_k = 2}, 131);  // some experts get no token
  add_moe_experts(r, {.tokens = 9, .dim = 64, .inter = 32, .routed = 8, .top_k = 3}, 132);
  add_moe_experts(r, {.tokens = 1, .dim = 3, .inter = 1, .routed = 1, .top_k = 1}, 133);
  add_moe_experts(r, {.tokens = 0, .dim = 7, .inter = 11, .routed = 6, .top_k = 2}, 134);
  // FP8 expert weights (128 x 128 block scales; partial blocks at the edges of 200 and 72), with a shared expert.
  add_moe_experts_fp8(r, {.tokens = 6, .dim = 200, .inter = 72, .routed = 5, .top_k = 2, .shared = 1}, 135);
  // moe_experts with the shared experts stacked after the routed ones (every token uses them, weight 1): odd sizes,
  // V3-like (256 + 1 experts, 8 + 1 pairs) and V2-Lite-like (64 + 2, 6 + 2) at small widths, no tokens
  add_moe_experts(r, {.tokens = 5, .dim = 7, .inter = 11, .routed = 6, .top_k = 2, .shared = 2}, 142);
  add_moe_experts(r, {.tokens = 3, .dim = 16, .inter = 8, .routed = 256, .top_k = 8, .shared = 1}, 143);
  add_moe_experts(r, {.tokens = 9, .dim = 32, .inter = 16, .routed = 64, .top_k = 6, .shared = 2}, 144);
  add_moe_experts(r, {.tokens = 0, .dim = 7, .inter = 11, .routed = 6, .top_k = 2, .shared = 1}, 145);
  // moe (routing, then the experts on its result): V3 routing with one shared expert, V2-Lite's greedy softmax with
  // two, V2's group-limited routing without shared experts, and no tokens
  add_moe(r, "v3", kV3Shared, 4, 16, 8, true, 146);
  const RouteConfig v2_lite_shared{.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .experts = 64,
                                   .top_k = 6, .num_shared = 2};
  add_moe(r, "v2_lite", v2_lite_shared, 5, 32, 16, false, 147);
  add_moe(r, "v2_group_limited", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy,
                                  .experts = 12, .n_group = 4, .topk_group = 2, .top_k = 3},
          9, 7, 11, false, 148);
  add_moe(r, "v2_lite_no_tokens", v2_lite_shared, 0, 32, 16, false, 149);
  // ... and with the router weight given instead of the logits (the op computes them): V3 and V2-Lite routing
  add_moe(r, "v3", kV3Shared, 3, 16, 8, true, 150, /*router=*/true);
  add_moe(r, "v2_lite", v2_lite_shared, 4, 32, 16, false, 151, /*router=*/true);
  // Expert parallelism: each shard of 2 and 4 even splits of the routed experts, the shared ones on one shard only.
  // moe_experts on given (global) ids: V2-Lite-like (64 + 2) and V3-like (256 + 1); a shard none of whose experts any
  // pair names (every row zero); FP8 weights over an uneven split (5 routed experts into 2 and 3).
  for (const int64_t count : {int64_t{2}, int64_t{4}}) {
    const int64_t shared_on = count == 2 ? 0 : count - 1;
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t seed = 400 + static_cast<uint64_t>(10 * count + i);
      add_moe_experts(r, {.tokens = 9, .dim = 32, .inter = 16, .routed = 64, .top_k = 6, .shared = 2}, seed,
                      even_shard(64, i, count, shared_on));
      add_moe_experts(r, {.tokens = 3, .dim = 16, .inter = 8, .routed = 256, .top_k = 8, .shared = 1}, seed + 100,
                      even_shard(256, i, count, shared_on));
      // moe: V3 routing with its shared expert, V2-Lite's greedy softmax with two
      add_moe(r, "v3", kV3Shared, 4, 16, 8, true, seed + 200, false, even_shard(256, i, count, shared_on));
      add_moe(r, "v2_lite", v2_lite_shared, 5, 32, 16, false, seed + 300, false, even_shard(64, i, count, shared_on));
    }
  }
  add_moe_experts(r, {.tokens = 5, .dim = 7, .inter = 11, .routed = 8, .top_k = 2, .shared = 1}, 460,
                  even_shard(8, 0, 2, 1), PairsHeld::kNone);
  for (int64_t i = 0; i < 2; ++i) {
    add_moe_experts_fp8(r, {.tokens = 6, .dim = 200, .inter = 72, .routed = 5, .top_k = 2, .shared = 1},
                        461 + static_cast<uint64_t>(i), even_shard(5, i, 2, 1));
  }
  // ... V2's group-limited routing without shared experts, and the router given, on two shards
  for (int64_t i = 0; i < 2; ++i) {
    add_moe(r, "v2_group_limited", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy,
                                    .experts = 12, .n_group = 4, .topk_group = 2, .top_k = 3},
            9, 7, 11, false, 470 + static_cast<uint64_t>(i), false, even_shard(12, i, 2, 0));
    add_moe(r, "v3", kV3Shared, 3, 16, 8, true, 472 + static_cast<uint64_t>(i), /*router=*/true,
            even_shard(256, i, 2, 0));
  }
  // sample: greedy, temperature, top_k / top_p / min_p alone and together, penalties, masks, logprobs, odd
  // vocabularies, ties at every boundary, mixed rows, validation
  add_sample_cases(r);
  return r;
}

const CaseRegistry& registry() {
  static const CaseRegistry r = build_registry();
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Tests

class CpuVsNaive : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuVsNaive, Case) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  HostMemory memory;
  expect_matches_naive(registry().cases()[GetParam()], *cpu, memory);
}

INSTANTIATE_TEST_SUITE_P(BackendOps, CpuVsNaive, ::testing::Range<size_t>(0, registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return registry().cases()[info.param].name;
                         });

// Every OpKind, up to the first value op_name does not know, has at least one case.
TEST(BackendOps, EveryOpKindHasACase) {
  int kinds = 0;
  for (int i = 0; i < 256; ++i) {
    const auto op = static_cast<OpKind>(i);
    if (op_name(op) == "unknown") break;
    ++kinds;
    EXPECT_GT(registry().count(op), 0) << "no test case for op " << op_name(op);
  }
  EXPECT_GT(kinds, static_cast<int>(OpKind::kSample)) << "op_name misses an OpKind";
}

// The harness itself: a guard overwrite, a write to a read-only input and a NaN output are caught.
TEST(BackendOps, HarnessCatchesBadWritesAndNaN) {
  HostMemory memory;
  OpRunner run(memory);
  const std::vector<float> values = {1, 2, 3};
  const TensorView in = run.upload(HostTensor::f32({3}, values));
  const TensorView out = run.output({3}, DType::kF32);
  EXPECT_TRUE(run.memory_errors().empty());
  in.f32()[0] = 7.0f;
  out.f32()[3] = 1.0f;  // one past the end: into the guard band
  EXPECT_EQ(run.memory_errors().size(), 2u);
  const Outputs ref = {{"out", {1.0, 2.0, 3.0}}};
  EXPECT_FALSE(compare_outputs({{"out", run.fetch(out)}}, ref, 1e-5).empty());  // NaN: never written
  EXPECT_FALSE(compare_outputs({{"out", {1.0, 2.0, 3.001}}}, ref, 1e-5).empty());
  EXPECT_TRUE(compare_outputs({{"out", {1.0, 2.0, 3.00001}}}, ref, 1e-5).empty());
  EXPECT_FALSE(compare_outputs({{"out", {1.0, 2.0, std::numeric_limits<double>::infinity()}}}, ref, 1e-5).empty());
}

// The CPU backend's memory is host memory: an upload that needs no conversion hands the tensor back (no copy), a
// float32 -> bfloat16 upload narrows like float_to_bf16, and copies are plain copies.
TEST(BackendOps, CpuMemoryIsHostMemory) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  EXPECT_EQ(cpu->activation_dtype(), DType::kF32);
  Tensor host = Tensor::empty({4}, DType::kI32);
  for (int32_t i = 0; i < 4; ++i) host.view().as<int32_t>()[i] = 10 * i;
  const void* data = host.view().data;
  const Tensor same = cpu->upload(std::move(host), DType::kI32);
  EXPECT_EQ(same.view().data, data);
  EXPECT_EQ(same.view().as<int32_t>()[3], 30);

  Tensor weights = Tensor::empty({3}, DType::kF32);
  const float values[] = {1.0f, 3.14159f, -1e-3f};
  std::copy(std::begin(values), std::end(values), weights.f32());
  const Tensor narrowed = cpu->upload(std::move(weights), DType::kBF16);
  ASSERT_EQ(narrowed.dtype(), DType::kBF16);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(narrowed.view().as<uint16_t>()[i], float_to_bf16(values[i]));

  const Tensor zeros = cpu->zeros({2, 3}, DType::kF32);
  for (float v : zeros.f32_span()) EXPECT_EQ(v, 0.0f);
  Tensor dst = cpu->empty({3}, DType::kF32);
  cpu->copy_to_device(ConstTensorView(values, DType::kF32, {3}, Device::kCpu), dst.view());
  std::vector<float> back(3);
  cpu->copy_to_host(dst.cview(), TensorView{back.data(), DType::kF32, {3}, Device::kCpu});
  EXPECT_EQ(back, std::vector<float>(std::begin(values), std::end(values)));
  EXPECT_THROW(cpu->copy_to_host(dst.cview(), TensorView{back.data(), DType::kF32, {2}, Device::kCpu}), Error);
}

// The V3 masking property, stated directly: experts of dropped groups are never chosen, although group 0 holds the
// best unbiased score and every kept biased score is below zero.
TEST(BackendOps, MoeRouteNeverPicksADroppedGroup) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t tokens = 6;
  std::vector<float> logits, bias;
  masked_group_inputs(tokens, logits, bias);
  Tensor ids = Tensor::empty({tokens, kMaskedGroupRoute.top_k}, DType::kI32);
  Tensor weights = Tensor::empty({tokens, kMaskedGroupRoute.top_k}, DType::kF32);
  cpu->moe_route({.logits = {logits.data(), DType::kF32, {tokens, 16}, Device::kCpu},
                  .correction_bias = {bias.data(), DType::kF32, {16}, Device::kCpu}, .topk_ids = ids.view(),
                  .topk_weights = weights.view(), .scoring = kMaskedGroupRoute.scoring,
                  .method = kMaskedGroupRoute.method, .n_group = kMaskedGroupRoute.n_group,
                  .topk_group = kMaskedGroupRoute.topk_group, .norm_topk_prob = kMaskedGroupRoute.norm_topk_prob,
                  .routed_scaling_factor = kMaskedGroupRoute.routed_scaling_factor});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t group = ids.view().as<int32_t>()[i] / 4;
    EXPECT_TRUE(group == 1 || group == 2) << "token " << i / 4 << " chose expert " << ids.view().as<int32_t>()[i];
  }
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0.0;
    for (int64_t k = 0; k < 4; ++k) sum += weights.f32()[t * 4 + k];
    EXPECT_NEAR(sum, 2.5, 1e-5);  // normalized, then scaled by routed_scaling_factor
  }
}

// With shared experts, each token's routed pairs are those of the same routing without them, bit for bit, and the
// shared ids E .. E + s - 1 follow with weight exactly 1 (not normalized, not scaled).
TEST(BackendOps, MoeRouteAppendsTheSharedExperts) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t tokens = 5, experts = 16, top_k = 4, shared = 2;
  Rng rng(91);
  std::vector<float> logits = rng.uniform(tokens * experts, -4.0f, 4.0f), bias = rng.uniform(experts, -0.5f, 0.5f);
  const auto route = [&](int64_t num_shared, Tensor& ids, Tensor& weights) {
    cpu->moe_route({.logits = {logits.data(), DType::kF32, {tokens, experts}, Device::kCpu},
                    .correction_bias = {bias.data(), DType::kF32, {experts}, Device::kCpu}, .topk_ids = ids.view(),
                    .topk_weights = weights.view(), .scoring = ExpertScoring::kSigmoid,
                    .method = TopkMethod::kNoauxTc, .n_group = 4, .topk_group = 2, .norm_topk_prob = true,
                    .routed_scaling_factor = 2.5f, .num_shared_experts = num_shared});
  };
  Tensor ids = Tensor::empty({tokens, top_k}, DType::kI32), weights = Tensor::empty({tokens, top_k}, DType::kF32);
  Tensor ids_s = Tensor::empty({tokens, top_k + shared}, DType::kI32);
  Tensor weights_s = Tensor::empty({tokens, top_k + shared}, DType::kF32);
  route(0, ids, weights);
  route(shared, ids_s, weights_s);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      EXPECT_EQ(ids_s.view().as<int32_t>()[t * (top_k + shared) + k], ids.view().as<int32_t>()[t * top_k + k]);
      EXPECT_EQ(weights_s.f32()[t * (top_k + shared) + k], weights.f32()[t * top_k + k]);
    }
    for (int64_t j = 0; j < shared; ++j) {
      EXPECT_EQ(ids_s.view().as<int32_t>()[t * (top_k + shared) + top_k + j], experts + j);
      EXPECT_EQ(weights_s.f32()[t * (top_k + shared) + top_k + j], 1.0f);
    }
  }
}

TEST(BackendOps, MoeRouteRejectsSharedCountsThatDoNotFit) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::vector<float> logits(3 * 4, 0.0f);
  const auto route = [&](int64_t pairs, int64_t num_shared) {
    Tensor ids = Tensor::empty({3, pairs}, DType::kI32), weights = Tensor::empty({3, pairs}, DType::kF32);
    cpu->moe_route({.logits = {logits.data(), DType::kF32, {3, 4}, Device::kCpu}, .topk_ids = ids.view(),
                    .topk_weights = weights.view(), .scoring = ExpertScoring::kSoftmax,
                    .method = TopkMethod::kGreedy, .num_shared_experts = num_shared});
  };
  EXPECT_NO_THROW(route(6, 2));
  EXPECT_THROW(route(1, 2), Error);   // fewer pairs than shared experts
  EXPECT_THROW(route(7, 2), Error);   // 5 routed of 4 experts
  EXPECT_THROW(route(2, -1), Error);  // a negative count
}

// moe checks both halves before it writes anything: experts' weights that do not hold the routed experts and then
// the shared ones, or an output of the wrong shape, throw with the routing outputs untouched.
TEST(BackendOps, MoeRejectsWeightsWithoutTheSharedExpertsBeforeRouting) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t tokens = 2, routed = 4, shared = 1, pairs = 3, dim = 8, inter = 4;
  std::vector<float> logits(tokens * routed, 0.5f), x(tokens * dim, 1.0f);
  const auto call = [&](int64_t weight_experts, int64_t out_dim) {
    Tensor ids = Tensor::zeros({tokens, pairs}, DType::kI32), weights = Tensor::zeros({tokens, pairs}, DType::kF32);
    Tensor w_gate_up = Tensor::zeros({weight_experts, 2 * inter, dim}, DType::kF32);
    Tensor w_down = Tensor::zeros({weight_experts, dim, inter}, DType::kF32);
    Tensor out = Tensor::zeros({tokens, out_dim}, DType::kF32);
    try {
      cpu->moe({.route = {.logits = {logits.data(), DType::kF32, {tokens, routed}, Device::kCpu},
                          .topk_ids = ids.view(), .topk_weights = weights.view(), .scoring = ExpertScoring::kSoftmax,
                          .method = TopkMethod::kGreedy, .num_shared_experts = shared},
                .x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu}, .w_gate_up = w_gate_up.view(),
                .w_down = w_down.view(), .out = out.view()});
    } catch (const Error&) {
      const std::span<const int32_t> written(ids.view().as<int32_t>(), static_cast<size_t>(tokens * pairs));
      EXPECT_TRUE(std::all_of(written.begin(), written.end(), [](int32_t v) { return v == 0; })) << "ids written";
      throw;
    }
  };
  EXPECT_NO_THROW(call(routed + shared, dim));
  EXPECT_THROW(call(routed, dim), Error);               // the shared expert is missing from the weights
  EXPECT_THROW(call(routed + shared, dim + 1), Error);  // out is not [T, D]
}

// moe with a router: the router must be [routed experts, D] in x's dtype and router_logits the float32 buffer that
// route.logits views (the op writes the logits there); router_logits without a router is refused.
TEST(BackendOps, MoeRouterArgumentsAreChecked) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t tokens = 2, routed = 4, pairs = 2, dim = 8, inter = 4;
  std::vector<float> x(tokens * dim, 1.0f);
  enum class Bad { kNone, kRouterRows, kRouterWidth, kOtherBuffer, kLogitsWithoutRouter };
  const auto call = [&](Bad bad) {
    Tensor logits = Tensor::zeros({tokens, routed}, DType::kF32), other = Tensor::zeros({tokens, routed}, DType::kF32);
    Tensor ids = Tensor::zeros({tokens, pairs}, DType::kI32), weights = Tensor::zeros({tokens, pairs}, DType::kF32);
    Tensor router = Tensor::zeros({bad == Bad::kRouterRows ? routed + 1 : routed,
                                   bad == Bad::kRouterWidth ? dim + 1 : dim}, DType::kF32);
    Tensor w_gate_up = Tensor::zeros({routed, 2 * inter, dim}, DType::kF32);
    Tensor w_down = Tensor::zeros({routed, dim, inter}, DType::kF32);
    Tensor out = Tensor::zeros({tokens, dim}, DType::kF32);
    cpu->moe({.route = {.logits = logits.view(), .topk_ids = ids.view(), .topk_weights = weights.view(),
                        .scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy},
              .x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu}, .w_gate_up = w_gate_up.view(),
              .w_down = w_down.view(), .out = out.view(),
              .router = bad == Bad::kLogitsWithoutRouter ? ConstTensorView{} : ConstTensorView(router.view()),
              .router_logits = bad == Bad::kOtherBuffer ? other.view() : logits.view()});
    const std::span<const int32_t> written(ids.view().as<int32_t>(), static_cast<size_t>(tokens * pairs));
    return std::any_of(written.begin(), written.end(), [](int32_t v) { return v != 0; });
  };
  EXPECT_TRUE(call(Bad::kNone));  // all-zero logits: experts 0 and 1 by the lower index
  EXPECT_THROW(call(Bad::kRouterRows), Error);
  EXPECT_THROW(call(Bad::kRouterWidth), Error);
  EXPECT_THROW(call(Bad::kOtherBuffer), Error);
  EXPECT_THROW(call(Bad::kLogitsWithoutRouter), Error);
}

// max |a - ref| / max |ref| (0 for an all-zero ref equal to a).
double relative_max_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(ref[i])));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// One expert matrix stack on the host, float32 or block-scaled FP8, viewed as the CPU backend's weight.
struct HostExperts {
  std::vector<float> values;  // float32: [experts, rows, cols]
  Fp8Experts fp8;             // FP8: codes and scales
  Shape shape;
  bool is_fp8 = false;

  static HostExperts make(const std::vector<float>& values, int64_t experts, int64_t rows, int64_t cols, bool fp8) {
    HostExperts w{.values = {}, .fp8 = {}, .shape = {experts, rows, cols}, .is_fp8 = fp8};
    if (fp8) {
      w.fp8 = Fp8Experts::quantize(values, experts, rows, cols);
    } else {
      w.values = values;
    }
    return w;
  }
  HostExperts shard(const ExpertShard& sh, int64_t routed, int64_t shared) const {
    const int64_t held = sh.num_held(shared);
    HostExperts w{.values = {}, .fp8 = {}, .shape = {held, shape[1], shape[2]}, .is_fp8 = is_fp8};
    if (is_fp8) {
      w.fp8 = fp8.shard(sh, routed, shared);
    } else {
      w.values = shard_values(values, shape[1] * shape[2], sh, routed, shared);
    }
    return w;
  }
  WeightView view() const {
    if (!is_fp8) return ConstTensorView(values.data(), DType::kF32, shape, Device::kCpu);
    return {ConstTensorView(fp8.codes.data(), DType::kF8E4M3, shape, Device::kCpu),
            ConstTensorView(fp8.scale_inv.data(), DType::kF32, fp8_scale_shape(shape), Device::kCpu), false};
  }
};

// Expert parallelism on the CPU: over V2-like and V3-like layers, 2 and 4 shards with the shared experts on one of
// them, float32 and FP8 weights, the shards' moe outputs sum to the unsharded op's; every shard writes the whole
// model's routing (global ids and weights); each shard's output is the unsharded experts op on the whole model's
// weights over the pairs the shard holds (the others' weights zeroed), and a token none of whose experts it holds
// gets a zero row.
TEST(BackendOps, MoeShardsSumToTheWholeLayer) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  struct Layer {
    const char* tag;
    RouteConfig route;
    int64_t tokens, dim, inter;
    bool bias;
  };
  const Layer layers[] = {
      {"v2_like", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .experts = 16, .top_k = 6,
                   .num_shared = 2}, 7, 64, 32, false},
      {"v2_group_limited_like", {.scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGroupLimitedGreedy,
                                 .experts = 16, .n_group = 4, .topk_group = 2, .top_k = 3,
                                 .routed_scaling_factor = 16.0f, .num_shared = 2}, 6, 48, 40, false},
      {"v3_like", {.scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc, .experts = 32, .n_group = 4,
                   .topk_group = 2, .top_k = 8, .norm_topk_prob = true, .routed_scaling_factor = 2.5f,
                   .num_shared = 1}, 9, 64, 32, true},
  };
  uint64_t seed = 500;
  int64_t zero_rows = 0;
  for (const Layer& l : layers) {
    const RouteConfig& c = l.route;
    const int64_t tokens = l.tokens, dim = l.dim, inter = l.inter, experts = c.experts + c.num_shared;
    const int64_t pairs = c.pairs();
    Rng rng(++seed);
    const std::vector<float> logits = rng.uniform(tokens * c.experts, -4.0f, 4.0f);
    const std::vector<float> bias = l.bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{};
    const std::vector<float> x = rng.uniform(tokens * dim);
    const std::vector<float> gate_up_values = rng.uniform(experts * 2 * inter * dim);
    const std::vector<float> down_values = rng.uniform(experts * dim * inter);
    struct Result {
      std::vector<int32_t> ids;
      std::vector<float> weights, out;
    };
    const auto run_moe = [&](const ExpertShard& shard, const HostExperts& gate_up, const HostExperts& down) {
      Result res{std::vector<int32_t>(static_cast<size_t>(tokens * pairs)),
                 std::vector<float>(static_cast<size_t>(tokens * pairs)),
                 std::vector<float>(static_cast<size_t>(tokens * dim))};
      cpu->moe({.route = {.logits = {logits.data(), DType::kF32, {tokens, c.experts}, Device::kCpu},
                          .correction_bias = l.bias ? ConstTensorView(bias.data(), DType::kF32, {c.experts},
                                                                      Device::kCpu)
                                                    : ConstTensorView{},
                          .topk_ids = {res.ids.data(), DType::kI32, {tokens, pairs}, Device::kCpu},
                          .topk_weights = {res.weights.data(), DType::kF32, {tokens, pairs}, Device::kCpu},
                          .scoring = c.scoring, .method = c.method, .n_group = c.n_group,
                          .topk_group = c.topk_group, .norm_topk_prob = c.norm_topk_prob,
                          .routed_scaling_factor = c.routed_scaling_factor, .num_shared_experts = c.num_shared},
                .x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu},
                .w_gate_up = gate_up.view(),
                .w_down = down.view(),
                .out = {res.out.data(), DType::kF32, {tokens, dim}, Device::kCpu},
                .shard = shard});
      return res;
    };
    for (const bool fp8 : {false, true}) {
      const HostExperts gate_up = HostExperts::make(gate_up_values, experts, 2 * inter, dim, fp8);
      const HostExperts down = HostExperts::make(down_values, experts, dim, inter, fp8);
      const Result whole = run_moe({}, gate_up, down);
      for (const int64_t count : {int64_t{2}, int64_t{4}}) {
        SCOPED_TRACE(str_cat(l.tag, fp8 ? ", FP8" : ", float32", ", ", count, " shards"));
        std::vector<float> sum(whole.out.size(), 0.0f);
        for (int64_t i = 0; i < count; ++i) {
          const ExpertShard shard = even_shard(c.experts, i, count, count - 1);
          const Result part = run_moe(shard, gate_up.shard(shard, c.experts, c.num_shared),
                                      down.shard(shard, c.experts, c.num_shared));
          EXPECT_EQ(part.ids, whole.ids) << "shard " << i;
          EXPECT_EQ(part.weights, whole.weights) << "shard " << i;
          for (size_t j = 0; j < sum.size(); ++j) sum[j] += part.out[j];
          // The reference: the unsharded experts over the pairs this shard holds.
          const std::vector<float> held = held_weights(whole.ids, whole.weights, shard, c.experts);
          std::vector<float> ref(whole.out.size());
          cpu->moe_experts({.x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu},
                            .w_gate_up = gate_up.view(),
                            .w_down = down.view(),
                            .topk_ids = {whole.ids.data(), DType::kI32, {tokens, pairs}, Device::kCpu},
                            .topk_weights = {held.data(), DType::kF32, {tokens, pairs}, Device::kCpu},
                            .out = {ref.data(), DType::kF32, {tokens, dim}, Device::kCpu}});
          EXPECT_LE(relative_max_diff(part.out, ref), 1e-5) << "shard " << i;
          for (int64_t t = 0; t < tokens; ++t) {
            bool any = false;
            for (int64_t k = 0; k < pairs; ++k) any = any || shard_holds(shard, c.experts, whole.ids[t * pairs + k]);
            if (any) continue;
            ++zero_rows;
            for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(part.out[t * dim + d], 0.0f) << "shard " << i << " token " << t;
          }
        }
        EXPECT_LE(relative_max_diff(sum, whole.out), 1e-5);
      }
    }
  }
  EXPECT_GT(zero_rows, 0) << "no token without a held expert: the zero rows went unchecked";
}

// A shard's arguments: its routed range inside the model's, weights of exactly the experts it holds, global ids below
// the model's routed + shared experts, and for moe the routing's own expert count.
TEST(BackendOps, MoeShardArgumentsAreChecked) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t tokens = 2, routed = 8, shared = 1, pairs = 3, dim = 8, inter = 4;
  std::vector<float> x(tokens * dim, 1.0f), weights(tokens * pairs, 0.5f), logits(tokens * routed, 0.0f);
  const auto experts_call = [&](const ExpertShard& shard, int64_t weight_experts, int32_t last_id) {
    std::vector<int32_t> ids = {0, 5, 8, 1, 6, last_id};
    Tensor w_gate_up = Tensor::zeros({weight_experts, 2 * inter, dim}, DType::kF32);
    Tensor w_down = Tensor::zeros({weight_experts, dim, inter}, DType::kF32);
    Tensor out = Tensor::zeros({tokens, dim}, DType::kF32);
    cpu->moe_experts({.x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu}, .w_gate_up = w_gate_up.view(),
                      .w_down = w_down.view(), .topk_ids = {ids.data(), DType::kI32, {tokens, pairs}, Device::kCpu},
                      .topk_weights = {weights.data(), DType::kF32, {tokens, pairs}, Device::kCpu},
                      .out = out.view(), .shard = shard, .num_shared_experts = shared});
  };
  const ExpertShard upper{.first_routed = 4, .num_local_routed = 4, .num_routed = routed, .holds_shared = true};
  ExpertShard no_shared = upper;
  no_shared.holds_shared = false;
  EXPECT_NO_THROW(experts_call(upper, 5, 8));
  EXPECT_NO_THROW(experts_call(no_shared, 4, 8));
  EXPECT_THROW(experts_call(upper, 4, 8), Error);      // the shared expert is missing from the weights
  EXPECT_THROW(experts_call(no_shared, 5, 8), Error);  // one expert too many
  EXPECT_THROW(experts_call(upper, 5, 9), Error);      // id past the model's 8 + 1 experts
  EXPECT_THROW(experts_call({.first_routed = 6, .num_local_routed = 4, .num_routed = routed}, 5, 8), Error);
  EXPECT_THROW(experts_call({.first_routed = -1, .num_local_routed = 4, .num_routed = routed}, 5, 8), Error);
  EXPECT_THROW(experts_call({.first_routed = 0, .num_local_routed = 4, .num_routed = 0}, 5, 8), Error);
  const auto moe_call = [&](const ExpertShard& shard, int64_t weight_experts) {
    Tensor ids = Tensor::zeros({tokens, pairs}, DType::kI32), topk = Tensor::zeros({tokens, pairs}, DType::kF32);
    Tensor w_gate_up = Tensor::zeros({weight_experts, 2 * inter, dim}, DType::kF32);
    Tensor w_down = Tensor::zeros({weight_experts, dim, inter}, DType::kF32);
    Tensor out = Tensor::zeros({tokens, dim}, DType::kF32);
    cpu->moe({.route = {.logits = {logits.data(), DType::kF32, {tokens, routed}, Device::kCpu},
                        .topk_ids = ids.view(), .topk_weights = topk.view(), .scoring = ExpertScoring::kSoftmax,
                        .method = TopkMethod::kGreedy, .num_shared_experts = shared},
              .x = {x.data(), DType::kF32, {tokens, dim}, Device::kCpu}, .w_gate_up = w_gate_up.view(),
              .w_down = w_down.view(), .out = out.view(), .shard = shard});
  };
  EXPECT_NO_THROW(moe_call(upper, 5));
  EXPECT_THROW(moe_call(upper, 4), Error);
  ExpertShard other_model = upper;
  other_model.num_routed = 16;  // not the routing's 8
  EXPECT_THROW(moe_call(other_model, 5), Error);
}

#ifdef DEEPINFER_HAVE_CUDA
// Device memory for the harness: guarded allocations on one stream, copies that wait for the stream.
class CudaMemory final : public Memory {
 public:
  explicit CudaMemory(cudaStream_t stream) : stream_(stream) {}
  Device device() const override { return Device::kCuda; }
  void* allocate(size_t bytes) override {
    buffers_.emplace_back(bytes, stream_);
    return buffers_.back().data();
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_TRY(cudaStreamSynchronize(stream_));  // the host source may go away after this returns
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_TRY(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

// The CUDA RMSNorm (bf16 in and out, fp32 weight) against the CPU rms_norm on the same bf16 values widened to fp32.
// The only expected difference is the final rounding to bf16: half a bf16 ulp, 2^-9 relative.
TEST(BackendOpsCuda, RmsNormBf16MatchesCpu) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  struct RmsCase {
    int64_t rows, dim, row_stride;
    Placement placement;
  };
  const RmsCase cases[] = {{5, 7, 0, Placement::kOutOfPlace},      {0, 16, 0, Placement::kOutOfPlace},
                           {1, 1, 0, Placement::kOutOfPlace},      {3, 4096, 0, Placement::kOutOfPlace},
                           {17, 7168, 0, Placement::kInPlace},     {9, 512, 576, Placement::kInPlace},
                           {4, 1537, 0, Placement::kOutOfPlace},   {300, 1024, 0, Placement::kOutOfPlace}};
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  cuda::CudaStream stream;
  uint64_t seed = 500;
  for (const RmsCase& s : cases) {
    SCOPED_TRACE(str_cat(s.rows, "x", s.dim, " stride ", s.row_stride));
    Rng rng(seed++);
    const int64_t stride = s.row_stride == 0 ? s.dim : s.row_stride;
    const HostTensor x = HostTensor::bf16({s.rows, stride}, rng.uniform(s.rows * stride, -3.0f, 3.0f));
    const std::vector<float> w = rng.uniform(s.dim, 0.5f, 1.5f);
    // CPU reference on the widened values (rows `stride` apart, normalized in place).
    std::vector<float> ref(static_cast<size_t>(s.rows * stride));
    const std::vector<double> x_wide = x.to_double();
    std::copy(x_wide.begin(), x_wide.end(), ref.begin());
    const TensorView ref_view{ref.data(), DType::kF32, {s.rows, s.dim}, Device::kCpu};
    cpu->rms_norm({.x = ref_view, .weight = {w.data(), DType::kF32, {s.dim}, Device::kCpu}, .out = ref_view,
                   .eps = 1e-6f, .row_stride = s.row_stride});

    CudaMemory memory(stream.get());
    OpRunner run(memory);
    const bool in_place = s.placement == Placement::kInPlace;
    const TensorView x_dev = run.upload(x, in_place ? Access::kReadWrite : Access::kReadOnly);
    const TensorView out_dev = in_place ? x_dev : run.output({s.rows, stride}, DType::kBF16);
    cuda::rms_norm({.x = TensorView{x_dev.data, DType::kBF16, {s.rows, s.dim}, Device::kCuda},
                    .weight = run.upload(HostTensor::f32({s.dim}, w)),
                    .out = TensorView{out_dev.data, DType::kBF16, {s.rows, s.dim}, Device::kCuda},
                    .eps = 1e-6f, .row_stride = s.row_stride},
                   {stream.get()});
    std::vector<bool> head(static_cast<size_t>(s.rows * stride));
    for (int64_t i = 0; i < s.rows * stride; ++i) head[i] = i % stride < s.dim;
    const Outputs got = split_by_mask(run.fetch(out_dev), head, "normalized", "between_rows");
    const Outputs want = split_by_mask(widen(ref), head, "normalized", "between_rows");
    for (const std::string& e : compare_outputs(got, want, 1.0 / 256)) ADD_FAILURE() << e;
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

TEST(BackendOpsCuda, RmsNormRejectsHostOrFloatTensors) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  std::vector<float> x(8, 1.0f), w(4, 1.0f);
  const TensorView host_view{x.data(), DType::kF32, {2, 4}, Device::kCpu};
  EXPECT_THROW(cuda::rms_norm({.x = host_view, .weight = {w.data(), DType::kF32, {4}, Device::kCpu},
                               .out = host_view}, {nullptr}),
               Error);
}
#endif  // DEEPINFER_HAVE_CUDA

}  // namespace
}  // namespace deepinfer::op_test

// The CUDA backend on every shared case it supports (float32 tensors), against the CPU reference.
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "device_memory.h"

namespace deepinfer::op_test {
namespace {

class SharedCasesCudaVsCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(SharedCasesCudaVsCpu, Case) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  DeviceMemory device_memory;
  HostMemory host_memory;
  expect_matches_reference(registry().cases()[GetParam()], *cuda, device_memory, *cpu, host_memory,
                           /*tolerance_scale=*/10.0);
}

INSTANTIATE_TEST_SUITE_P(BackendOps, SharedCasesCudaVsCpu, ::testing::Range<size_t>(0, registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return registry().cases()[info.param].name;
                         });

}  // namespace
}  // namespace deepinfer::op_test
#endif  // DEEPINFER_HAVE_CUDA
