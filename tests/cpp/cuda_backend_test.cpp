// The CUDA backend against the CPU reference, through the op test harness (op_test_harness.h): guarded device
// allocations, NaN-filled outputs, read-only inputs checked unchanged, and a normalized-error comparison.
//
// Every case runs twice per activation dtype the CUDA backend takes: bfloat16 (the production path; inputs are
// rounded to bf16 first and the CPU computes in fp32 on exactly those values, so only the GPU's bf16 output rounding
// and fp32 summation order differ: tolerance 1e-2 of the largest reference value) and float32 (tolerance 1e-5).
// Copies (embedding, gathers, strided copies, cache write) and untouched elements compare exactly. Index arrays
// (ids, positions, slots, attention metadata) are device tensors, as the model passes them. MLA decode and prefill
// and the MoE experts run in bfloat16 only (their kernels' type; MLA decode also over the FP8 latent cache, whose
// bytes both backends get as they are); MoE routing takes fp32 logits. The tests that need
// a GPU are the *Cuda* ones and fail without one (cuda_device_required.h); the rest (the host-side heuristics and
// switches) run anywhere the CUDA build does.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/fp8_decode_route.h"
#include "backend/cuda/mla/mla_decode.cuh"
#include "backend/cuda/mla/mla_prefill.cuh"
#include "backend/cuda/moe/moe_small_tiles.h"
#include "backend/cuda/gemm/skinny_gemm.cuh"
#include "backend/cuda/runtime/tuning.h"
#include "device_memory.h"
#include "mla_decode_fp8_cases.h"
#include "mla_fp8_cache_cases.h"
#include "mla_prepare_cases.h"
#include "moe_cases.h"
#include "op_test_harness.h"
#include "scoped_env.h"

namespace deepinfer::op_test {
namespace {

// How a case stores its activations on the device. The CPU reference always gets float32; the values are rounded
// to the device dtype when the case is built, so both backends start from the same numbers.
struct Activations {
  DType device = DType::kBF16;

  DType on(const OpRunner& run) const { return run.device() == Device::kCpu ? DType::kF32 : device; }
  HostTensor tensor(const OpRunner& run, Shape shape, const std::vector<float>& values) const {
    return on(run) == DType::kBF16 ? HostTensor::bf16(shape, values) : HostTensor::f32(shape, values);
  }
  std::vector<float> round(std::vector<float> values) const {
    if (device == DType::kBF16) {
      for (float& v : values) v = bf16_to_float(float_to_bf16(v));
    }
    return values;
  }
  std::string tag() const { return device == DType::kBF16 ? "bf16" : "f32"; }
  double tolerance() const { return device == DType::kBF16 ? 1e-2 : 1e-5; }
};

// Splits a flat buffer into the elements `mask` selects (compared with the threshold) and the rest (compared
// exactly: the op must leave them untouched).
Outputs split_by_mask(std::span<const double> values, const std::vector<bool>& mask, const std::string& selected,
                      const std::string& rest) {
  Output in{.name = selected, .values = {}}, out{.name = rest, .values = {}, .compare = Compare::kExact};
  for (size_t i = 0; i < values.size(); ++i) (mask[i] ? in : out).values.push_back(values[i]);
  return {in, out};
}

// ---------------------------------------------------------------------------------------------------------------
// Cases. Each `run` builds its inputs on the runner and calls the runner's backend; the reference is the CPU backend
// running the same case.

// How a linear case writes its output: bf16 activations may give float32 out (router and vocabulary logits), and
// out may start with values the product is added to (the shared experts' down projection).
struct LinearOut {
  bool f32 = false;
  bool accumulate = false;
};

void add_linear(CaseRegistry& r, Activations act, int64_t m, int64_t n, int64_t k, uint64_t seed,
                LinearOut o = {}) {
  Rng rng(seed);
  const std::vector<float> x = act.round(rng.uniform(m * k)), w = act.round(rng.uniform(n * k));
  const Activations out_act = o.f32 ? Activations{DType::kF32} : act;
  const std::vector<float> prior = out_act.round(rng.uniform(m * n, -4.0f, 4.0f));
  r.add({.op = OpKind::kLinear,
         .name = str_cat("linear_", act.tag(), "_", m, "x", n, "x", k, o.f32 ? "_out_f32" : "",
                         o.accumulate ? "_accumulate" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = o.accumulate
                                      ? run.upload(out_act.tensor(run, {m, n}, prior), Access::kReadWrite)
                                      : run.output({m, n}, out_act.on(run));
           run.backend().linear({.x = run.upload(act.tensor(run, {m, k}, x)),
                                 .w = run.upload(act.tensor(run, {n, k}, w)), .out = out,
                                 .accumulate = o.accumulate});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// out = silu(x · gate^T) * (x · up^T), w = [gate; up].
void add_linear_silu_mul(CaseRegistry& r, Activations act, int64_t m, int64_t inter, int64_t k, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = act.round(rng.uniform(m * k)), w = act.round(rng.uniform(2 * inter * k));
  r.add({.op = OpKind::kLinearSiluMul,
         .name = str_cat("linear_silu_mul_", act.tag(), "_", m, "x", inter, "x", k),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, inter}, act.on(run));
           run.backend().linear_silu_mul({.x = run.upload(act.tensor(run, {m, k}, x)),
                                          .w = run.upload(act.tensor(run, {2 * inter, k}, w)), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// Products of one x in one op: target 0 plain (float32 out when out0_f32), target 1 gated, target 2 plain.
void add_multi_linear(CaseRegistry& r, Activations act, int64_t m, int64_t k, std::vector<int64_t> widths,
                      bool out0_f32, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = act.round(rng.uniform(m * k));
  std::vector<int64_t> rows;  // weight rows of each target; target 1 is gated: [gate; up]
  for (size_t i = 0; i < widths.size(); ++i) rows.push_back(i == 1 ? 2 * widths[i] : widths[i]);
  std::vector<std::vector<float>> ws;
  for (size_t i = 0; i < widths.size(); ++i) ws.push_back(act.round(rng.uniform(rows[i] * k)));
  r.add({.op = OpKind::kMultiLinear,
         .name = str_cat("multi_linear_", act.tag(), "_", m, "x", k, "_", widths.size(), "_targets",
                         out0_f32 ? "_out0_f32" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           std::vector<LinearTarget> targets;
           for (size_t i = 0; i < widths.size(); ++i) {
             const DType out_dtype = i == 0 && out0_f32 ? DType::kF32 : act.on(run);
             targets.push_back({.w = run.upload(act.tensor(run, {rows[i], k}, ws[i])),
                                .out = run.output({m, widths[i]}, out_dtype), .silu_mul = i == 1});
           }
           run.backend().multi_linear({.x = run.upload(act.tensor(run, {m, k}, x)), .targets = targets});
           Outputs outs;
           for (size_t i = 0; i < widths.size(); ++i) outs.push_back({str_cat("out", i), run.fetch(targets[i].out)});
           return outs;
         },
         .tolerance = act.tolerance()});
}

// x rows (t, h) `x_stride` elements apart (0 = K), out rows `out_stride` apart (0 = N); the values between out rows
// must stay untouched.
// overlap: x starts as zeros and gets its values from an add, then an unrelated add runs, then head_linear, which the
// backend's launch ledger lets compute beside that add (it touches neither x nor out), as W_UK beside mla_prepare: a
// kernel that read x before the first add completed would compute on zeros.
void add_head_linear(CaseRegistry& r, Activations act, int64_t t, int64_t h, int64_t k, int64_t n, uint64_t seed,
                     int64_t x_stride = 0, int64_t out_stride = 0, bool overlap = false) {
  Rng rng(seed);
  const int64_t xs = x_stride == 0 ? k : x_stride, os = out_stride == 0 ? n : out_stride;
  const std::vector<float> x = act.round(rng.uniform(t * h * xs)), w = act.round(rng.uniform(h * n * k));
  const std::vector<float> prior_out = act.round(rng.uniform(t * h * os, 7.0f, 8.0f));
  std::vector<bool> written(static_cast<size_t>(t * h * os));
  for (int64_t i = 0; i < t * h * os; ++i) written[i] = i % os < n;
  r.add({.op = OpKind::kHeadLinear,
         .name = str_cat("head_linear_", act.tag(), "_", t, "x", h, "x", k, "x", n,
                         x_stride ? str_cat("_xstride", x_stride) : "",
                         out_stride ? str_cat("_outstride", out_stride) : "", overlap ? "_overlap" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView w_dev = run.upload(act.tensor(run, {h, n, k}, w));
           const TensorView out_buf = run.upload(act.tensor(run, {t, h, os}, prior_out), Access::kReadWrite);
           TensorView x_buf;
           if (overlap) {  // every upload first: a copy between the ops would serialize them
             const std::vector<float> zeros(x.size(), 0.0f), other(64, 1.0f);
             x_buf = run.upload(act.tensor(run, {t, h, xs}, zeros), Access::kReadWrite);
             const TensorView x_values = run.upload(act.tensor(run, {t, h, xs}, x));
             const TensorView unrelated = run.upload(act.tensor(run, {64}, other), Access::kReadWrite);
             const TensorView ones = run.upload(act.tensor(run, {64}, other));
             run.backend().add({.x = x_buf, .y = x_values});
             run.backend().add({.x = unrelated, .y = ones});
           } else {
             x_buf = run.upload(act.tensor(run, {t, h, xs}, x));
           }
           run.backend().head_linear({.x = x_buf.columns(0, k), .w = w_dev, .out = out_buf.columns(0, n),
                                      .x_head_stride = x_stride, .out_head_stride = out_stride});
           return split_by_mask(run.fetch(out_buf), written, "out", "between_rows");
         },
         .tolerance = act.tolerance()});
}

void add_embedding(CaseRegistry& r, Activations act, const std::string& tag, int64_t vocab, int64_t dim,
                   std::vector<int32_t> ids, Expect expect, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> table = act.round(rng.uniform(vocab * dim));
  const int64_t t = static_cast<int64_t>(ids.size());
  r.add({.op = OpKind::kEmbedding,
         .name = str_cat("embedding_", act.tag(), "_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({t, dim}, act.on(run));
           run.backend().embedding({.token_ids = run.upload(HostTensor::i32({t}, ids)),
                                    .table = run.upload(act.tensor(run, {vocab, dim}, table)), .out = out});
           return {{"out", run.fetch(out), Compare::kExact}};
         },
         .tolerance = act.tolerance(),
         .expect = expect});
}

// out[i] = src[indices[i]]: the sampling rows out of the last hidden states.
void add_gather_rows(CaseRegistry& r, Activations act, int64_t rows, int64_t dim, std::vector<int32_t> indices,
                     uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> src = act.round(rng.uniform(rows * dim));
  const int64_t m = static_cast<int64_t>(indices.size());
  r.add({.op = OpKind::kGatherRows,
         .name = str_cat("gather_rows_", act.tag(), "_", m, "_of_", rows, "x", dim),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({m, dim}, act.on(run));
           run.backend().gather_rows({.src = run.upload(act.tensor(run, {rows, dim}, src)),
                                      .indices = run.upload(HostTensor::i32({m}, indices)), .out = out});
           return {{"out", run.fetch(out), Compare::kExact}};
         },
         .tolerance = act.tolerance()});
}

// Columns [src_col, src_col + cols) of `rows` rows src_stride wide into columns [dst_col, ...) of rows dst_stride
// wide; the rest of dst keeps its values.
struct StridedCopy {
  int64_t rows = 0, cols = 0;
  int64_t src_stride = 0, src_col = 0;
  int64_t dst_stride = 0, dst_col = 0;
};

void add_copy_strided(CaseRegistry& r, Activations act, const std::string& tag, StridedCopy l, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> src = act.round(rng.uniform(l.rows * l.src_stride));
  const std::vector<float> prior = act.round(rng.uniform(l.rows * l.dst_stride, 5.0f, 6.0f));
  r.add({.op = OpKind::kCopyStrided,
         .name = str_cat("copy_strided_", act.tag(), "_", tag),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView src_buf = run.upload(act.tensor(run, {l.rows, l.src_stride}, src));
           const TensorView dst_buf = run.upload(act.tensor(run, {l.rows, l.dst_stride}, prior), Access::kReadWrite);
           run.backend().copy_strided({.src = src_buf.columns(l.src_col, l.cols),
                                       .dst = dst_buf.columns(l.dst_col, l.cols), .src_row_stride = l.src_stride,
                                       .dst_row_stride = l.dst_stride});
           return {{"dst", run.fetch(dst_buf), Compare::kExact}};
         },
         .tolerance = act.tolerance()});
}

enum class Placement : uint8_t { kInPlace, kOutOfPlace };

// Rows of `dim` values `row_stride` apart (0 = dim), normalized in place or into a buffer of the same layout; the
// values between rows must stay untouched.
void add_rms_norm(CaseRegistry& r, Activations act, int64_t rows, int64_t dim, int64_t row_stride,
                  Placement placement, uint64_t seed) {
  Rng rng(seed);
  const int64_t stride = row_stride == 0 ? dim : row_stride;
  const std::vector<float> x = act.round(rng.uniform(rows * stride, -3.0f, 3.0f));
  const std::vector<float> w = rng.uniform(dim, 0.5f, 1.5f);
  const std::vector<float> prior_out = act.round(rng.uniform(rows * stride));
  std::vector<bool> head(static_cast<size_t>(rows * stride));
  for (int64_t i = 0; i < rows * stride; ++i) head[i] = i % stride < dim;
  const bool in_place = placement == Placement::kInPlace;
  r.add({.op = OpKind::kRmsNorm,
         .name = str_cat("rms_norm_", act.tag(), "_", rows, "x", dim, "_stride", row_stride,
                         in_place ? "_inplace" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const DType dt = act.on(run);
           const TensorView x_buf = run.upload(act.tensor(run, {rows, stride}, x),
                                               in_place ? Access::kReadWrite : Access::kReadOnly);
           const TensorView out_buf =
               in_place ? x_buf : run.upload(act.tensor(run, {rows, stride}, prior_out), Access::kReadWrite);
           run.backend().rms_norm({.x = TensorView{x_buf.data, dt, {rows, dim}, run.device()},
                                   .weight = run.upload(HostTensor::f32({dim}, w)),
                                   .out = TensorView{out_buf.data, dt, {rows, dim}, run.device()},
                                   .eps = 1e-6f, .row_stride = row_stride});
           return split_by_mask(run.fetch(out_buf), head, "normalized", "between_rows");
         },
         .tolerance = act.tolerance()});
}

void add_add_rms_norm(CaseRegistry& r, Activations act, int64_t rows, int64_t dim, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> residual = act.round(rng.uniform(rows * dim, -2.0f, 2.0f));
  const std::vector<float> x = act.round(rng.uniform(rows * dim));
  const std::vector<float> w = rng.uniform(dim, 0.5f, 1.5f);
  r.add({.op = OpKind::kAddRmsNorm,
         .name = str_cat("add_rms_norm_", act.tag(), "_", rows, "x", dim),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView res = run.upload(act.tensor(run, {rows, dim}, residual), Access::kReadWrite);
           const TensorView out = run.output({rows, dim}, act.on(run));
           run.backend().add_rms_norm({.residual = res, .x = run.upload(act.tensor(run, {rows, dim}, x)),
                                       .weight = run.upload(HostTensor::f32({dim}, w)), .out = out, .eps = 1e-5f});
           return {{"residual", run.fetch(res)}, {"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// A decode chain whose first op lets the next start early (the backend's choice for both): add_rms_norm, or the
// per-head W_UV product, then a skinny linear of its output, which starts before the first op has its inputs and must still
// read that output only once it is complete.
void add_early_start_chain(CaseRegistry& r, Activations act, bool norm_first, int64_t rows, int64_t dim, int64_t n,
                           uint64_t seed) {
  Rng rng(seed);
  constexpr int64_t kHeads = 16, kLatent = 512;
  const int64_t in_dim = norm_first ? dim : kLatent;
  const std::vector<float> residual = act.round(rng.uniform(rows * dim, -2.0f, 2.0f));
  const std::vector<float> x = act.round(rng.uniform(rows * (norm_first ? dim : kHeads * in_dim)));
  const std::vector<float> first_w = norm_first ? rng.uniform(dim, 0.5f, 1.5f)
                                                : act.round(rng.uniform(kHeads * (dim / kHeads) * kLatent));
  const std::vector<float> w = act.round(rng.uniform(n * dim));
  r.add({.op = norm_first ? OpKind::kAddRmsNorm : OpKind::kHeadLinear,
         .name = str_cat(norm_first ? "add_rms_norm" : "head_linear", "_then_linear_early_start_", act.tag(), "_",
                         rows, "x", dim, "x", n),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView mid = run.output({rows, dim}, act.on(run));
           const TensorView out = run.output({rows, n}, act.on(run));
           const TensorView w_dev = run.upload(act.tensor(run, {n, dim}, w));
           Outputs outputs;
           if (norm_first) {
             const TensorView res = run.upload(act.tensor(run, {rows, dim}, residual), Access::kReadWrite);
             run.backend().add_rms_norm({.residual = res, .x = run.upload(act.tensor(run, {rows, dim}, x)),
                                         .weight = run.upload(HostTensor::f32({dim}, first_w)), .out = mid,
                                         .eps = 1e-5f});
             outputs.push_back({"residual", run.fetch(res)});
           } else {
             run.backend().head_linear({.x = run.upload(act.tensor(run, {rows, kHeads, kLatent}, x)),
                                        .w = run.upload(act.tensor(run, {kHeads, dim / kHeads, kLatent}, first_w)),
                                        .out = mid.reshaped({rows, kHeads, dim / kHeads})});
           }
           run.backend().linear({.x = mid, .w = w_dev, .out = out});
           outputs.push_back({"first", run.fetch(mid)});
           outputs.push_back({"then_linear", run.fetch(out)});
           return outputs;
         },
         .tolerance = act.tolerance()});
}

void add_silu_mul(CaseRegistry& r, Activations act, int64_t rows, int64_t inter, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> gate_up = act.round(rng.uniform(rows * 2 * inter, -8.0f, 8.0f));
  r.add({.op = OpKind::kSiluMul,
         .name = str_cat("silu_mul_", act.tag(), "_", rows, "x", inter),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView out = run.output({rows, inter}, act.on(run));
           run.backend().silu_mul({.gate_up = run.upload(act.tensor(run, {rows, 2 * inter}, gate_up)), .out = out});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

void add_add(CaseRegistry& r, Activations act, Shape shape, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = act.round(rng.uniform(shape.numel())), y = act.round(rng.uniform(shape.numel()));
  std::string name = str_cat("add_", act.tag());
  for (int64_t d : shape.dims()) name += str_cat("_", d);
  r.add({.op = OpKind::kAdd,
         .name = name,
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView xv = run.upload(act.tensor(run, shape, x), Access::kReadWrite);
           run.backend().add({.x = xv, .y = run.upload(act.tensor(run, shape, y))});
           return {{"x", run.fetch(xv)}};
         },
         .tolerance = act.tolerance()});
}

void add_rope(CaseRegistry& r, Activations act, const std::string& tag, RopeLayout l, bool interleaved, float scaling,
              uint64_t seed) {
  Rng rng(seed);
  const int64_t size = l.tokens * l.token_stride;
  const std::vector<float> x = act.round(rng.uniform(size));
  std::vector<int32_t> positions(static_cast<size_t>(l.tokens));
  for (int32_t& p : positions) p = rng.integer(0, 163839);
  if (l.tokens > 0) positions[0] = 0;
  const std::vector<float> inv_freq = rope_inv_freq(l.rot_dim);
  const std::vector<bool> rotated = rope_rotated_mask(l);
  r.add({.op = OpKind::kRope,
         .name = str_cat("rope_", act.tag(), "_", tag, interleaved ? "_interleaved" : "_half",
                         scaling == 1.0f ? "" : "_scaled"),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView buf = run.upload(act.tensor(run, {size}, x), Access::kReadWrite);
           run.backend().rope({.x = buf.columns(l.offset, size - l.offset).data, .dtype = buf.dtype,
                               .device = run.device(), .num_heads = l.heads, .rot_dim = l.rot_dim,
                               .token_stride = l.token_stride, .head_stride = l.head_stride,
                               .positions = run.upload(HostTensor::i32({l.tokens}, positions)),
                               .inv_freq = run.upload(HostTensor::f32({l.rot_dim / 2}, inv_freq)),
                               .attention_scaling = scaling, .interleaved = interleaved});
           return split_by_mask(run.fetch(buf), rotated, "rotated", "untouched");
         },
         .tolerance = act.tolerance()});
}

// Latent rows written into a cache of `num_pages` pages at shuffled slots; the other rows keep their prior values.
void add_mla_cache_write(CaseRegistry& r, Activations act, int64_t num_pages, int64_t page_size, int64_t dim,
                         int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> prior = act.round(rng.uniform(num_pages * page_size * dim, 5.0f, 6.0f));
  const std::vector<float> latent = act.round(rng.uniform(tokens * dim));
  std::vector<int32_t> all_slots(static_cast<size_t>(num_pages * page_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  rng.shuffle(all_slots);
  const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + tokens);
  r.add({.op = OpKind::kMlaCacheWrite,
         .name = str_cat("mla_cache_write_", act.tag(), "_", tokens, "_tokens_", num_pages, "x", page_size, "x", dim),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView cache =
               run.upload(act.tensor(run, {num_pages, page_size, dim}, prior), Access::kReadWrite);
           run.backend().mla_cache_write({.latent = run.upload(act.tensor(run, {tokens, dim}, latent)),
                                          .cache = cache,
                                          .slot_mapping = run.upload(HostTensor::i32({tokens}, slots))});
           return {{"cache", run.fetch(cache), Compare::kExact}};
         },
         .tolerance = act.tolerance()});
}

// The contexts of a paged cache's sequences on shuffled pages (3 spare pages stay unused): the page table [seqs,
// max_pages], whose entries past a sequence's pages hold -1 or an out-of-range id, and the cache slot of every context
// position, sequence after sequence.
struct ScatteredPages {
  int64_t num_pages = 0;
  int32_t max_pages = 0;
  std::vector<int32_t> page_table;
  std::vector<int32_t> slots;
};

ScatteredPages scatter_pages(Rng& rng, const std::vector<int32_t>& context_lens, int64_t page_size) {
  const auto seqs = static_cast<int32_t>(context_lens.size());
  int64_t used_pages = 0, max_needed = 0;
  for (int32_t ctx : context_lens) {
    used_pages += (ctx + page_size - 1) / page_size;
    max_needed = std::max<int64_t>(max_needed, (ctx + page_size - 1) / page_size);
  }
  ScatteredPages l{.num_pages = used_pages + 3, .max_pages = static_cast<int32_t>(max_needed + 2)};
  std::vector<int32_t> pool(static_cast<size_t>(l.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  l.page_table.resize(static_cast<size_t>(seqs) * l.max_pages);
  size_t next_page = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    const int64_t pages = (context_lens[s] + page_size - 1) / page_size;
    for (int32_t p = 0; p < l.max_pages; ++p) {
      l.page_table[static_cast<size_t>(s) * l.max_pages + p] =
          p < pages ? pool[next_page++] : (p % 2 == 0 ? -1 : static_cast<int32_t>(l.num_pages + 7));
    }
    for (int32_t j = 0; j < context_lens[s]; ++j) {
      l.slots.push_back(static_cast<int32_t>(
          l.page_table[static_cast<size_t>(s) * l.max_pages + j / page_size] * page_size + j % page_size));
    }
  }
  return l;
}

// How an MLA decode case runs (add_mla_decode).
struct MlaDecodeCase {
  // A decode step's order: q and the metadata are uploaded first, then mla_cache_write puts every row but each
  // sequence's last, and mla_prepare that one (the step's token, normalized and rotated as the model's are), shortly
  // before mla_decode, so the backend's launch ledger lets the decode copy the other rows before its wait (fresh_rows
  // 1): a kernel that read the newest row before its wait would see the NaN poison.
  bool step_write = false;
  // Between mla_prepare and mla_decode, an op that touches neither the cache nor the metadata and does not let the
  // decode start early (an add): every row is then complete as the decode starts (fresh_rows 0).
  bool unrelated_op_between = false;
  // Between mla_prepare and mla_decode, an op that lets it start early beside mla_prepare (the model's W_UK: a
  // head_linear at decode sizes).
  bool early_op_between = false;
  // The op applies the value projection (MlaDecodeArgs::w_uv, random [H, 128, 512]) and returns its output.
  bool project = false;
};

// Absorbed MLA decode over a paged cache at DeepSeek's latent width (512 + 64), bfloat16: the cache is NaN-poisoned,
// then each sequence's latents are written through mla_cache_write at scattered pages; unused page-table entries
// hold -1 or out-of-range ids. q [S, H, 576] is given directly (q_latent | q_pe); the CPU computes on the same
// bf16-rounded values in fp32. A long context makes the kernel split the context and combine partials (in W_UV's
// kernel when the case projects and that kernel takes the shape).
void add_mla_decode(CaseRegistry& r, int64_t heads, int64_t page_size, std::vector<int32_t> context_lens,
                    uint64_t seed, MlaDecodeCase how = {}) {
  constexpr int64_t kRank = 512, kDim = 576, kV = 128;
  const int32_t fresh_rows = how.step_write ? 1 : 0;
  const Activations act{DType::kBF16};
  Rng rng(seed);
  const auto seqs = static_cast<int32_t>(context_lens.size());
  const ScatteredPages layout = scatter_pages(rng, context_lens, page_size);
  const int64_t num_pages = layout.num_pages;
  const int32_t max_pages = layout.max_pages;
  const std::vector<int32_t>& page_table = layout.page_table;
  std::vector<int32_t> query_start(1, 0);
  for (int32_t s = 0; s < seqs; ++s) query_start.push_back(s + 1);
  const auto tokens = static_cast<int64_t>(layout.slots.size());
  const std::vector<float> latents = act.round(rng.uniform(tokens * kDim));
  const std::vector<float> q = act.round(rng.uniform(seqs * heads * kDim));
  const float w_range = std::sqrt(3.0f / static_cast<float>(kRank));
  const std::vector<float> w_uv = how.project ? act.round(rng.uniform(heads * kV * kRank, -w_range, w_range))
                                              : std::vector<float>();
  // The rows in two writes (slots are sequence by sequence): [0] before the step, [1] the step's fresh rows.
  std::vector<int32_t> slots[2];
  std::vector<float> rows[2];
  for (int32_t s = 0, t = 0; s < seqs; ++s) {
    for (int32_t j = 0; j < context_lens[s]; ++j, ++t) {
      const int part = j >= context_lens[s] - fresh_rows ? 1 : 0;
      slots[part].push_back(layout.slots[static_cast<size_t>(t)]);
      rows[part].insert(rows[part].end(), latents.begin() + t * kDim, latents.begin() + (t + 1) * kDim);
    }
  }
  const int32_t max_context = context_lens.empty() ? 0 : *std::max_element(context_lens.begin(), context_lens.end());
  const float scale = 1.0f / std::sqrt(192.0f);
  // The step write's other operands: each sequence's newest position, q_pe for q_abs's rope columns, the norm weight.
  constexpr int64_t kRope = kDim - kRank;
  std::vector<int32_t> positions;
  for (int32_t c : context_lens) positions.push_back(c - 1);
  const std::vector<float> q_pe = act.round(rng.uniform(seqs * heads * kRope));
  const std::vector<float> kv_a_norm = rng.uniform(kRank, 0.5f, 1.5f);
  const std::vector<float> inv_freq = rope_inv_freq(kRope);
  std::string lens;
  for (int32_t c : context_lens) lens += str_cat("_", c);
  r.add({.op = OpKind::kMlaDecode,
         .name = str_cat("mla_decode_bf16_h", heads, "_ps", page_size, "_ctx", lens,
                         how.step_write ? "_step_write" : "", how.unrelated_op_between ? "_unrelated_op_between" : "",
                         how.early_op_between ? "_early_op_between" : "", how.project ? "_w_uv" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const std::vector<float> poison(static_cast<size_t>(num_pages * page_size * kDim), std::nanf(""));
           const TensorView cache =
               run.upload(act.tensor(run, {num_pages, page_size, kDim}, poison), Access::kReadWrite);
           const AttentionMetadata meta{.query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)),
                                        .context_lens = run.upload(HostTensor::i32({seqs}, context_lens)),
                                        .page_table = run.upload(HostTensor::i32({seqs, max_pages}, page_table)),
                                        .num_seqs = seqs, .max_pages_per_seq = max_pages,
                                        .max_context_len = max_context};
           // The step write puts q_pe's rotation into q's rope columns.
           const TensorView q_dev =
               run.upload(act.tensor(run, {seqs, heads, kDim}, q), how.step_write ? Access::kReadWrite : Access::kReadOnly);
           const TensorView out = run.output({seqs, heads, kRank}, act.on(run));
           ConstTensorView w_uv_dev;
           TensorView out_v;
           if (how.project) {
             w_uv_dev = run.upload(act.tensor(run, {heads, kV, kRank}, w_uv));
             out_v = run.output({seqs, heads, kV}, act.on(run));
           }
           ConstTensorView writes[2][2];  // [part]: latent, slot_mapping, all uploaded before the first write
           TensorView step_latent;        // writes[1][0], normalized and rotated in place by mla_prepare
           for (int part = 0; part < 2; ++part) {
             const auto n = static_cast<int64_t>(slots[part].size());
             if (n == 0) continue;
             const TensorView latent =
                 run.upload(act.tensor(run, {n, kDim}, rows[part]), part == 1 ? Access::kReadWrite : Access::kReadOnly);
             if (part == 1) step_latent = latent;
             writes[part][0] = latent;
             writes[part][1] = run.upload(HostTensor::i32({n}, slots[part]));
           }
           const std::vector<float> other(kDim, 1.0f);
           const TensorView unrelated = run.upload(act.tensor(run, {kDim}, other), Access::kReadWrite);
           // The early op's operands, uploaded before the first write like every input: one head of 64 inputs and
           // 16 outputs (the per-head GEMV at decode sizes).
           TensorView early_x, early_w, early_out;
           if (how.early_op_between) {
             early_x = run.upload(act.tensor(run, {1, 1, 64}, std::vector<float>(64, 0.5f)));
             early_w = run.upload(act.tensor(run, {1, 16, 64}, std::vector<float>(16 * 64, 0.25f)));
             early_out = run.output({1, 1, 16}, act.on(run));
           }
           TensorView step_q_pe;
           ConstTensorView step_positions, step_norm, step_inv_freq;
           if (how.step_write) {
             step_q_pe = run.upload(act.tensor(run, {seqs, heads, kRope}, q_pe), Access::kReadWrite);
             step_positions = run.upload(HostTensor::i32({seqs}, positions));
             step_norm = run.upload(HostTensor::f32({kRank}, kv_a_norm));
             step_inv_freq = run.upload(HostTensor::f32({kRope / 2}, inv_freq));
           }
           if (!slots[0].empty()) {
             run.backend().mla_cache_write({.latent = writes[0][0], .cache = cache, .slot_mapping = writes[0][1]});
           }
           if (how.step_write) {
             run.backend().mla_prepare({.latent = step_latent, .q = step_q_pe, .q_abs = q_dev, .cache = cache,
                                        .slot_mapping = writes[1][1], .positions = step_positions,
                                        .kv_a_norm = step_norm, .inv_freq = step_inv_freq, .kv_lora_rank = kRank});
           }
           if (how.unrelated_op_between) {
             run.backend().add({.x = unrelated, .y = writes[0][0].rows(0, 1).reshaped({kDim})});
           }
           if (how.early_op_between) run.backend().head_linear({.x = early_x, .w = early_w, .out = early_out});
           run.backend().mla_decode({.q = q_dev, .cache = cache, .out_latent = out, .meta = meta,
                                     .kv_lora_rank = kRank, .softmax_scale = scale, .w_uv = w_uv_dev, .out = out_v});
           if (how.project) return {{"out", run.fetch(out_v)}};  // out_latent is the op's scratch then
           return {{"out_latent", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// MLA prefill at DeepSeek's dims (rank 512, rope 64, q/k head 128 + 64, v head 128), bfloat16: sequence s has
// queries[s] new tokens at the end of context_lens[s] cached ones (chunked prefill over a cached prefix when fewer).
// The cache is NaN-poisoned, then every context's latents are written through mla_cache_write at scattered pages;
// unused page-table entries hold -1 or out-of-range ids. The CPU computes on the same bf16-rounded values in fp32.
void add_mla_prefill(CaseRegistry& r, int64_t heads, int64_t page_size, std::vector<int32_t> context_lens,
                     std::vector<int32_t> queries, uint64_t seed) {
  constexpr int64_t kRank = 512, kDim = 576, kNope = 128, kQk = 192, kV = 128;
  const Activations act{DType::kBF16};
  Rng rng(seed);
  const auto seqs = static_cast<int32_t>(context_lens.size());
  const ScatteredPages layout = scatter_pages(rng, context_lens, page_size);
  const int64_t num_pages = layout.num_pages;
  const int32_t max_pages = layout.max_pages;
  const std::vector<int32_t>& page_table = layout.page_table;
  const std::vector<int32_t>& slots = layout.slots;
  std::vector<int32_t> query_start(1, 0);
  for (int32_t s = 0; s < seqs; ++s) query_start.push_back(query_start.back() + queries[s]);
  const auto cached = static_cast<int64_t>(slots.size());
  const int64_t tokens = query_start.back();
  const std::vector<float> latents = act.round(rng.uniform(cached * kDim));
  const std::vector<float> q = act.round(rng.uniform(tokens * heads * kQk));
  const float w_range = static_cast<float>(std::sqrt(3.0 / double(kRank)));
  const std::vector<float> kv_b = act.round(rng.uniform(heads * (kNope + kV) * kRank, -w_range, w_range));
  const int32_t max_context = context_lens.empty() ? 0 : *std::max_element(context_lens.begin(), context_lens.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(kQk));
  std::string lens;
  for (int32_t s = 0; s < seqs; ++s) lens += str_cat("_", queries[s], "of", context_lens[s]);
  r.add({.op = OpKind::kMlaPrefill,
         .name = str_cat("mla_prefill_bf16_h", heads, "_ps", page_size, "_q", lens),
         .run = [=](OpRunner& run) -> Outputs {
           const std::vector<float> poison(static_cast<size_t>(num_pages * page_size * kDim), std::nanf(""));
           const TensorView cache =
               run.upload(act.tensor(run, {num_pages, page_size, kDim}, poison), Access::kReadWrite);
           run.backend().mla_cache_write({.latent = run.upload(act.tensor(run, {cached, kDim}, latents)),
                                          .cache = cache,
                                          .slot_mapping = run.upload(HostTensor::i32({cached}, slots))});
           const AttentionMetadata meta{.query_start = run.upload(HostTensor::i32({seqs + 1}, query_start)),
                                        .context_lens = run.upload(HostTensor::i32({seqs}, context_lens)),
                                        .page_table = run.upload(HostTensor::i32({seqs, max_pages}, page_table)),
                                        .num_seqs = seqs, .max_pages_per_seq = max_pages,
                                        .max_context_len = max_context,
                                        .total_context_len = std::accumulate(context_lens.begin(),
                                                                             context_lens.end(), int64_t{0})};
           const TensorView out = run.output({tokens, heads, kV}, act.on(run));
           run.backend().mla_prefill({.q = run.upload(act.tensor(run, {tokens, heads, kQk}, q)), .cache = cache,
                                      .kv_b = run.upload(act.tensor(run, {heads * (kNope + kV), kRank}, kv_b)),
                                      .out = out, .meta = meta, .kv_lora_rank = kRank, .qk_nope_head_dim = kNope,
                                      .v_head_dim = kV, .softmax_scale = scale});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// MoE routing from fp32 router logits (the same on both activation dtypes). The order of a token's routed experts is
// not part of the contract: both sides are sorted by expert id per token before the comparison (sorted_route,
// moe_cases.h); the shared experts after them compare exactly, ids and weights.
struct MoeRouteCase {
  std::string tag;
  int64_t tokens = 0, experts = 0, top_k = 1, n_group = 1, topk_group = 1;  // experts, top_k: the routed ones
  ExpertScoring scoring = ExpertScoring::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  bool bias = false;
  int64_t num_shared = 0;
};

void add_moe_route(CaseRegistry& r, const MoeRouteCase& c, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> logits = rng.uniform(c.tokens * c.experts, -4.0f, 4.0f);
  const std::vector<float> bias = c.bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{};
  const int64_t pairs = c.top_k + c.num_shared;
  r.add({.op = OpKind::kMoeRoute,
         .name = str_cat("moe_route_", c.tag, "_t", c.tokens,
                         c.num_shared > 0 ? str_cat("_shared", c.num_shared) : ""),
         .run = [=](OpRunner& run) -> Outputs {
           const TensorView ids = run.output({c.tokens, pairs}, DType::kI32);
           const TensorView weights = run.output({c.tokens, pairs}, DType::kF32);
           run.backend().moe_route(
               {.logits = run.upload(HostTensor::f32({c.tokens, c.experts}, logits)),
                .correction_bias = c.bias ? ConstTensorView(run.upload(HostTensor::f32({c.experts}, bias)))
                                          : ConstTensorView{},
                .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring, .method = c.method,
                .n_group = c.n_group, .topk_group = c.topk_group, .norm_topk_prob = c.norm_topk_prob,
                .routed_scaling_factor = c.routed_scaling_factor, .num_shared_experts = c.num_shared});
           return sorted_route(run.fetch(ids), run.fetch(weights), c.top_k, c.num_shared);
         },
         .tolerance = 1e-5});
}

// Experts on given ids, bfloat16 x and weights (the kernels' type): out[t] = sum_k w[t, k] * FFN_e(x[t]) over the
// routed pairs and the shared experts after them (weight 1; ExpertsShape and random_expert_pairs in moe_cases.h).
// The kernels keep the SwiGLU activations and each pair's down output in bfloat16, hence the bf16 tolerance. With a
// shard (expert parallelism), the weights are the experts it holds and the ids stay global; kNone draws no pair of
// its routed experts.
void add_moe_experts_bf16(CaseRegistry& r, const ExpertsShape& s, uint64_t seed, const ExpertShard& shard = {},
                          PairsHeld held = PairsHeld::kAny) {
  const Activations act{DType::kBF16};
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_bf16_", s.str(), shard_name(shard),
                         held == PairsHeld::kNone ? "_none_held" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           // Built here from the seed (the same on both backends): the registry holds no V3-sized weights.
           Rng rng(seed);
           const int64_t tokens = s.tokens, dim = s.dim, inter = s.inter, experts = s.experts(), pairs = s.pairs();
           const float x_range = 1.0f, w_range = static_cast<float>(std::sqrt(3.0 / double(dim)));
           const float down_range = static_cast<float>(std::sqrt(3.0 / double(inter)));
           const std::vector<float> x = act.round(rng.uniform(tokens * dim, -x_range, x_range));
           const std::vector<float> w_gate_up = act.round(rng.uniform(experts * 2 * inter * dim, -w_range, w_range));
           const std::vector<float> w_down = act.round(rng.uniform(experts * dim * inter, -down_range, down_range));
           const ExpertPairs routing = random_expert_pairs(rng, s, held, shard);
           const int64_t held_experts = shard.all() ? experts : shard.num_held(s.shared);
           const std::vector<float> shard_gate_up =
               shard_values(w_gate_up, 2 * inter * dim, shard, s.routed, s.shared);
           const std::vector<float> shard_down = shard_values(w_down, dim * inter, shard, s.routed, s.shared);
           const TensorView out = run.output({tokens, dim}, act.on(run));
           run.backend().moe_experts(
               {.x = run.upload(act.tensor(run, {tokens, dim}, x)),
                .w_gate_up = run.upload(act.tensor(run, {held_experts, 2 * inter, dim}, shard_gate_up)),
                .w_down = run.upload(act.tensor(run, {held_experts, dim, inter}, shard_down)),
                .topk_ids = run.upload(HostTensor::i32({tokens, pairs}, routing.ids)),
                .topk_weights = run.upload(HostTensor::f32({tokens, pairs}, routing.weights)),
                .out = out,
                .shard = shard,
                .num_shared_experts = s.shared});
           return {{"out", run.fetch(out)}};
         },
         .tolerance = act.tolerance()});
}

// The inputs of an FP8 experts case, built from its seed (the same on both backends and the naive side): bf16 x, the
// experts quantized on the host, random routing.
struct Fp8ExpertsInputs {
  std::vector<float> x;
  Fp8Experts w_gate_up, w_down;
  ExpertPairs routing;

  static Fp8ExpertsInputs make(const ExpertsShape& s, uint64_t seed) {
    const Activations act{DType::kBF16};
    Rng rng(seed);
    const int64_t tokens = s.tokens, dim = s.dim, inter = s.inter, experts = s.experts();
    const float w_range = static_cast<float>(std::sqrt(3.0 / double(dim)));
    const float down_range = static_cast<float>(std::sqrt(3.0 / double(inter)));
    std::vector<float> x = act.round(rng.uniform(tokens * dim, -1.0f, 1.0f));
    Fp8Experts w_gate_up =
        Fp8Experts::quantize(rng.uniform(experts * 2 * inter * dim, -w_range, w_range), experts, 2 * inter, dim);
    Fp8Experts w_down =
        Fp8Experts::quantize(rng.uniform(experts * dim * inter, -down_range, down_range), experts, dim, inter);
    ExpertPairs routing = random_expert_pairs(rng, s);
    return {std::move(x), std::move(w_gate_up), std::move(w_down), std::move(routing)};
  }
};

// moe_experts on the inputs of `seed` with the weights of `shard`, `w8a8` asking for FP8 activations.
Outputs run_fp8_experts(OpRunner& run, const ExpertsShape& s, uint64_t seed, bool w8a8, const ExpertShard& shard) {
  const Activations act{DType::kBF16};
  const Fp8ExpertsInputs in = Fp8ExpertsInputs::make(s, seed);
  const int64_t tokens = s.tokens, dim = s.dim, pairs = s.pairs();
  const TensorView out = run.output({tokens, dim}, act.on(run));
  run.backend().moe_experts({.x = run.upload(act.tensor(run, {tokens, dim}, in.x)),
                             .w_gate_up = in.w_gate_up.shard(shard, s.routed, s.shared).upload(run, w8a8),
                             .w_down = in.w_down.shard(shard, s.routed, s.shared).upload(run, w8a8),
                             .topk_ids = run.upload(HostTensor::i32({tokens, pairs}, in.routing.ids)),
                             .topk_weights = run.upload(HostTensor::f32({tokens, pairs}, in.routing.weights)),
                             .out = out,
                             .shard = shard,
                             .num_shared_experts = s.shared});
  return {{"out", run.fetch(out)}};
}

// Experts on given ids with FP8 expert weights (e4m3 codes, 128 x 128 block scales: Fp8Experts, moe_cases.h) and
// bfloat16 x, against the CPU, which dequantizes them. The inputs are built inside `run` from the seed (the same on
// both backends), so the registry holds none of V2-Lite's 571M weights. W8A16 keeps the bf16 cases' tolerance. With
// `w8a8` (fp8_activations: the backend may quantize the activations too, and the CUDA grouped kernels do) 6e-2: x
// and the SwiGLU output each rounded to e4m3 (about 3% RMS a value) leave about 4.5% of the largest output (measured
// 4.2-5.0% on an H200); that the kernels compute the recipe itself is w8a8_recipe_registry's check, at 1e-2.
void add_moe_experts_fp8_bf16_x(CaseRegistry& r, const ExpertsShape& s, uint64_t seed, bool w8a8 = false,
                                const ExpertShard& shard = {}) {
  const Activations act{DType::kBF16};
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_fp8_", w8a8 ? "w8a8_" : "", s.str(), shard_name(shard)),
         .run = [=](OpRunner& run) { return run_fp8_experts(run, s, seed, w8a8, shard); },
         .tolerance = w8a8 ? 6e-2 : act.tolerance()});
}

// The W8A8 grouped kernels against DeepSeek's recipe computed on the host (naive_experts_w8a8: the same activation
// quantization, exact sums): what is left is fp32 summation order and bf16 rounding, so 1e-2.
void add_moe_experts_w8a8_recipe(CaseRegistry& r, const ExpertsShape& s, uint64_t seed,
                                 const ExpertShard& shard = {}) {
  r.add({.op = OpKind::kMoeExperts,
         .name = str_cat("moe_experts_w8a8_recipe_", s.str(), shard_name(shard)),
         .run = [=](OpRunner& run) { return run_fp8_experts(run, s, seed, /*w8a8=*/true, shard); },
         .naive = [=]() -> Outputs {
           const Fp8ExpertsInputs in = Fp8ExpertsInputs::make(s, seed);
           return {{"out", naive_experts_w8a8(s, in.x, in.w_gate_up.dequantized, in.w_down.dequantized,
                                              in.routing.ids,
                                              held_weights(in.routing.ids, in.routing.weights, shard, s.routed))}};
         },
         .tolerance = 1e-2});
}

// The routed part in one op (moe: routing, then the experts on its result), bfloat16 x and weights, against the CPU
// (which composes moe_route and moe_experts): the routing outputs as the route cases compare them, and the output.
// With `router`, the op gets the router weight instead of the logits and computes them (the route kernel does at
// decode sizes, linear before it otherwise), and the logits it wrote are compared too.
void add_moe_bf16(CaseRegistry& r, const std::string& tag, const MoeRouteCase& c, int64_t dim, int64_t inter,
                  uint64_t seed, bool router = false, const ExpertShard& shard = {}) {
  const Activations act{DType::kBF16};
  r.add({.op = OpKind::kMoe,
         .name = str_cat("moe_bf16_", tag, "_t", c.tokens, "_d", dim, "_i", inter, router ? "_router" : "",
                         shard_name(shard)),
         .run = [=](OpRunner& run) -> Outputs {
           // Built here from the seed (the same on both backends): the registry holds no V3-sized weights.
           Rng rng(seed);
           const int64_t tokens = c.tokens, experts = c.experts + c.num_shared, pairs = c.top_k + c.num_shared;
           const float w_range = static_cast<float>(std::sqrt(3.0 / double(dim)));
           const std::vector<float> given_logits =
               router ? std::vector<float>{} : rng.uniform(tokens * c.experts, -4.0f, 4.0f);
           const std::vector<float> router_w = router ? act.round(rng.uniform(c.experts * dim, -w_range, w_range))
                                                      : std::vector<float>{};
           const std::vector<float> bias = c.bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{};
           const float down_range = static_cast<float>(std::sqrt(3.0 / double(inter)));
           const std::vector<float> x = act.round(rng.uniform(tokens * dim, -1.0f, 1.0f));
           const std::vector<float> w_gate_up = act.round(rng.uniform(experts * 2 * inter * dim, -w_range, w_range));
           const std::vector<float> w_down = act.round(rng.uniform(experts * dim * inter, -down_range, down_range));
           const int64_t held_experts = shard.all() ? experts : shard.num_held(c.num_shared);
           const std::vector<float> shard_gate_up =
               shard_values(w_gate_up, 2 * inter * dim, shard, c.experts, c.num_shared);
           const std::vector<float> shard_down = shard_values(w_down, dim * inter, shard, c.experts, c.num_shared);
           const TensorView ids = run.output({tokens, pairs}, DType::kI32);
           const TensorView weights = run.output({tokens, pairs}, DType::kF32);
           const TensorView out = run.output({tokens, dim}, act.on(run));
           const TensorView logits_out = router ? run.output({tokens, c.experts}, DType::kF32) : TensorView{};
           run.backend().moe(
               {.route = {.logits = router ? ConstTensorView(logits_out)
                                           : ConstTensorView(run.upload(HostTensor::f32({tokens, c.experts},
                                                                                         given_logits))),
                          .correction_bias = c.bias ? ConstTensorView(run.upload(HostTensor::f32({c.experts}, bias)))
                                                    : ConstTensorView{},
                          .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring, .method = c.method,
                          .n_group = c.n_group, .topk_group = c.topk_group, .norm_topk_prob = c.norm_topk_prob,
                          .routed_scaling_factor = c.routed_scaling_factor, .num_shared_experts = c.num_shared},
                .x = run.upload(act.tensor(run, {tokens, dim}, x)),
                .w_gate_up = run.upload(act.tensor(run, {held_experts, 2 * inter, dim}, shard_gate_up)),
                .w_down = run.upload(act.tensor(run, {held_experts, dim, inter}, shard_down)),
                .out = out,
                .router = router ? ConstTensorView(run.upload(act.tensor(run, {c.experts, dim}, router_w)))
                                 : ConstTensorView{},
                .router_logits = logits_out,
                .shard = shard});
           return moe_outputs(run, ids, weights, out, logits_out, c.top_k, c.num_shared);
         },
         .tolerance = act.tolerance()});
}

// moe (routing + experts) with FP8 expert weights and bfloat16 x, against the CPU; the router weight, when given,
// stays bfloat16 (the route kernel computes the logits at decode sizes). Inputs built inside `run` from the seed, as
// add_moe_experts_fp8_bf16_x.
void add_moe_fp8(CaseRegistry& r, const std::string& tag, const MoeRouteCase& c, int64_t dim, int64_t inter,
                 uint64_t seed, bool router = false, const ExpertShard& shard = {}) {
  const Activations act{DType::kBF16};
  r.add({.op = OpKind::kMoe,
         .name = str_cat("moe_fp8_", tag, "_t", c.tokens, "_d", dim, "_i", inter, router ? "_router" : "",
                         shard_name(shard)),
         .run = [=](OpRunner& run) -> Outputs {
           Rng rng(seed);
           const int64_t tokens = c.tokens, experts = c.experts + c.num_shared, pairs = c.top_k + c.num_shared;
           const float w_range = static_cast<float>(std::sqrt(3.0 / double(dim)));
           const float down_range = static_cast<float>(std::sqrt(3.0 / double(inter)));
           const std::vector<float> given_logits =
               router ? std::vector<float>{} : rng.uniform(tokens * c.experts, -4.0f, 4.0f);
           const std::vector<float> router_w = router ? act.round(rng.uniform(c.experts * dim, -w_range, w_range))
                                                      : std::vector<float>{};
           const std::vector<float> bias = c.bias ? rng.uniform(c.experts, -0.5f, 0.5f) : std::vector<float>{};
           const std::vector<float> x = act.round(rng.uniform(tokens * dim, -1.0f, 1.0f));
           const Fp8Experts w_gate_up = Fp8Experts::quantize(
               rng.uniform(experts * 2 * inter * dim, -w_range, w_range), experts, 2 * inter, dim);
           const Fp8Experts w_down =
               Fp8Experts::quantize(rng.uniform(experts * dim * inter, -down_range, down_range), experts, dim, inter);
           const TensorView ids = run.output({tokens, pairs}, DType::kI32);
           const TensorView weights = run.output({tokens, pairs}, DType::kF32);
           const TensorView out = run.output({tokens, dim}, act.on(run));
           const TensorView logits_out = router ? run.output({tokens, c.experts}, DType::kF32) : TensorView{};
           run.backend().moe(
               {.route = {.logits = router ? ConstTensorView(logits_out)
                                           : ConstTensorView(run.upload(HostTensor::f32({tokens, c.experts},
                                                                                         given_logits))),
                          .correction_bias = c.bias ? ConstTensorView(run.upload(HostTensor::f32({c.experts}, bias)))
                                                    : ConstTensorView{},
                          .topk_ids = ids, .topk_weights = weights, .scoring = c.scoring, .method = c.method,
                          .n_group = c.n_group, .topk_group = c.topk_group, .norm_topk_prob = c.norm_topk_prob,
                          .routed_scaling_factor = c.routed_scaling_factor, .num_shared_experts = c.num_shared},
                .x = run.upload(act.tensor(run, {tokens, dim}, x)),
                .w_gate_up = w_gate_up.shard(shard, c.experts, c.num_shared).upload(run),
                .w_down = w_down.shard(shard, c.experts, c.num_shared).upload(run),
                .out = out,
                .router = router ? ConstTensorView(run.upload(act.tensor(run, {c.experts, dim}, router_w)))
                                 : ConstTensorView{},
                .router_logits = logits_out,
                .shard = shard});
           return moe_outputs(run, ids, weights, out, logits_out, c.top_k, c.num_shared);
         },
         .tolerance = act.tolerance()});
}

// Sampling from fp32 logits (the same for both activation dtypes): token ids exact, logprobs within 1e-5. Real
// vocabularies (V3's 129280, V2's 102400) with 64 rows of mixed parameters run the radix selects at full size; flat
// logits send the top-p rows through the path that re-reads the row, ties put the boundaries inside runs of equal
// values. The batch is built inside `run` (twice, the same from its seed) so the registry holds no large inputs.
enum class LogitShape : uint8_t { kUniform, kModelLike, kTies };

std::vector<float> sample_logits(Rng& rng, int64_t vocab, LogitShape shape) {
  if (shape == LogitShape::kUniform) return random_logits(rng, vocab, 4.0f);
  if (shape == LogitShape::kTies) return random_logits(rng, vocab, 4.0f, 0.25f);
  // A bell of standard deviation ~2.3 (a sum of four uniforms) and a dozen tokens 8 to 14 above it.
  std::vector<float> l(static_cast<size_t>(vocab), 0.0f);
  for (int k = 0; k < 4; ++k) {
    const std::vector<float> u = rng.uniform(vocab, -2.0f, 2.0f);
    for (size_t i = 0; i < l.size(); ++i) l[i] += u[i];
  }
  for (int j = 0; j < 12; ++j) l[static_cast<size_t>(rng.integer(0, static_cast<int32_t>(vocab) - 1))] += 8.0f + 0.5f * j;
  return l;
}

// The parameter mix the large cases cycle through, row by row.
std::vector<SamplingRow> mixed_sampling_params() {
  return {{.temperature = 0.0f},
          {.temperature = 0.0f, .num_logprobs = 20},
          {.temperature = 1.0f},
          {.temperature = 0.6f, .top_p = 0.95f},
          {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f},
          {.temperature = 1.0f, .top_k = 1},
          {.temperature = 1.0f, .top_k = 5000},  // more than the shared-memory buffer: re-reads the row
          {.temperature = 0.7f, .top_k = 20000, .top_p = 0.8f},
          {.temperature = 1.0f, .log_min_p = std::log(0.05f)},
          {.temperature = 0.9f, .top_k = 40, .top_p = 0.9f, .log_min_p = std::log(0.02f), .num_logprobs = 5},
          {.temperature = 1.0f, .top_p = 0.5f},
          {.temperature = 1.5f, .top_p = 0.99f},
          {.temperature = 0.3f},
          {.temperature = 1.0f, .top_p = 0.2f, .num_logprobs = 0},
          {.temperature = 2.0f, .top_k = 200, .top_p = 0.7f, .num_logprobs = 20}};
}

// kMixed: six rows of every seven get a grammar mask (SamplingRow::allowed_row), of 1, 3, 1%, 10%, half and all
// but 5 of the tokens, in turn; the seventh has none.
enum class GrammarMasks : uint8_t { kNone, kMixed };

void add_grammar_masks(SampleBatch& b, Rng& rng) {
  const int64_t v = b.vocab;
  std::vector<int32_t> masks;
  for (const int64_t allowed : {int64_t{1}, int64_t{3}, v / 100, v / 10, v / 2, v - 5}) {
    masks.push_back(b.add_allowed(random_tokens(rng, v, std::clamp<int64_t>(allowed, 1, v))));
  }
  masks.push_back(-1);
  for (size_t r = 0; r < b.rows.size(); ++r) b.rows[r].allowed_row = masks[r % masks.size()];
}

SampleBatch mixed_sample_batch(int64_t vocab, int64_t rows, LogitShape shape, uint64_t seed,
                               GrammarMasks grammar = GrammarMasks::kNone) {
  Rng rng(seed);
  const std::vector<SamplingRow> mix = mixed_sampling_params();
  SampleBatch b{.vocab = vocab};
  // Every fourth row also has penalties (a long prompt: 3000 distinct tokens, 200 of them in the output) and masks
  // (an EOS and stop ids, before min_tokens).
  std::vector<int32_t> perm(static_cast<size_t>(vocab));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    SamplingRow p = mix[static_cast<size_t>(r) % mix.size()];
    p.seed = static_cast<uint64_t>(r) * 31 + seed;
    p.step = static_cast<int32_t>(r) * 7;
    std::vector<std::pair<int32_t, int32_t>> penalties;
    std::vector<int32_t> masked;
    if (r % 4 == 3) {
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.3f;
      p.frequency_penalty = 0.2f;
      rng.shuffle(perm);
      const int64_t prompt = std::min<int64_t>(3000, vocab / 2);
      for (int64_t j = 0; j < prompt; ++j) penalties.emplace_back(perm[j], j < prompt / 15 ? 1 + j % 4 : 0);
      masked = {perm[static_cast<size_t>(vocab) - 1], perm[static_cast<size_t>(vocab) - 2]};
    }
    b.add(sample_logits(rng, vocab, shape), p, penalties, masked);
  }
  if (grammar == GrammarMasks::kMixed) add_grammar_masks(b, rng);
  return b;
}

void add_sample(CaseRegistry& r, int64_t vocab, int64_t rows, LogitShape shape, uint64_t seed,
                GrammarMasks grammar = GrammarMasks::kNone) {
  const char* shape_tag = shape == LogitShape::kUniform ? "uniform" : shape == LogitShape::kTies ? "ties" : "model";
  r.add({.op = OpKind::kSample,
         .name = str_cat("sample_v", vocab, "_n", rows, "_", shape_tag,
                         grammar == GrammarMasks::kMixed ? "_grammar" : ""),
         .run = [=](OpRunner& run) -> Outputs {
           return run_sample_batch(run, mixed_sample_batch(vocab, rows, shape, seed, grammar));
         },
         .tolerance = 1e-5});
}

CaseRegistry build_registry() {
  CaseRegistry r;
  for (const Activations act : {Activations{DType::kBF16}, Activations{DType::kF32}}) {
    const uint64_t s = act.device == DType::kBF16 ? 0 : 1000;
    // GEMMs: decode-sized, odd, empty, and a few hundred rows
    add_linear(r, act, 1, 64, 128, s + 1);
    add_linear(r, act, 5, 7, 11, s + 2);
    add_linear(r, act, 0, 8, 16, s + 3);
    add_linear(r, act, 33, 130, 257, s + 4);
    add_linear(r, act, 300, 512, 1024, s + 5);
    // Decode-sized GEMMs (the skinny kernel on bf16, cuBLAS past 16 tokens or when K is not a multiple of 32):
    // V2-Lite's kv_a and o_proj, float32 router logits, N not a multiple of 16, short K, accumulation into out.
    add_linear(r, act, 1, 576, 2048, s + 100);
    add_linear(r, act, 3, 2048, 2048, s + 101);
    add_linear(r, act, 8, 7, 64, s + 102);
    add_linear(r, act, 9, 130, 96, s + 103);
    add_linear(r, act, 16, 64, 2048, s + 104, {.f32 = true});
    add_linear(r, act, 1, 64, 7168, s + 105, {.f32 = true});
    add_linear(r, act, 1, 2048, 1408, s + 106, {.accumulate = true});
    add_linear(r, act, 12, 40, 2816, s + 107, {.accumulate = true});
    add_linear(r, act, 17, 40, 256, s + 108, {.accumulate = true});
    add_linear(r, act, 2, 24, 33, s + 109, {.accumulate = true});
    add_linear(r, act, 4, 33, 0, s + 110, {.accumulate = true});
    add_linear_silu_mul(r, act, 1, 1408, 2048, s + 111);  // V2-Lite's expert width
    add_linear_silu_mul(r, act, 5, 40, 96, s + 112);
    add_linear_silu_mul(r, act, 16, 7, 64, s + 113);
    add_linear_silu_mul(r, act, 20, 24, 128, s + 114);
    add_linear_silu_mul(r, act, 3, 5, 33, s + 115);
    add_linear_silu_mul(r, act, 0, 8, 64, s + 116);
    add_multi_linear(r, act, 1, 2048, {3072, 1408}, false, s + 120);   // V2-Lite q_proj with a gated projection
    add_multi_linear(r, act, 4, 2048, {64, 1408, 576}, true, s + 121);  // router (f32), shared gate_up, kv_a
    add_multi_linear(r, act, 8, 96, {7, 5, 33}, false, s + 122);
    add_multi_linear(r, act, 12, 64, {16, 8}, true, s + 123);           // past 8 tokens: op by op
    add_multi_linear(r, act, 2, 33, {4, 4}, false, s + 124);            // K not a multiple of 32: op by op
    add_head_linear(r, act, 1, 16, 128, 512, s + 117, 192, 576);  // the absorbed decode's exact strides
    // Up to 8 tokens bf16 runs on the per-head GEMV kernel (head_gemv.cu) for K = 64 / 128 / 256 / 512 (more cases
    // below): K = 256 and 64, and N that is not a multiple of a warp's rows (cuBLAS then).
    add_head_linear(r, act, 2, 4, 256, 24, s + 127, 264);
    add_head_linear(r, act, 5, 5, 64, 32, s + 128);
    add_head_linear(r, act, 1, 2, 128, 12, s + 129);
    add_head_linear(r, act, 16, 16, 512, 128, s + 118);
    add_head_linear(r, act, 11, 4, 64, 40, s + 119, 72, 48);
    add_head_linear(r, act, 1, 16, 128, 512, s + 10);  // q_nope · W_UK per head (V2-Lite decode)
    add_head_linear(r, act, 4, 16, 512, 128, s + 11);  // latent · W_UV per head
    add_head_linear(r, act, 5, 3, 7, 11, s + 12);
    add_head_linear(r, act, 0, 2, 4, 4, s + 13);
    add_head_linear(r, act, 9, 128, 64, 32, s + 14);
    add_head_linear(r, act, 3, 16, 128, 512, s + 15, 192, 576);  // the decode query: q_nope cols into q_latent cols
    add_head_linear(r, act, 2, 128, 128, 512, s + 16, 192, 576);
    add_head_linear(r, act, 4, 3, 5, 7, s + 17, 9, 11);         // odd strides (unaligned rows)
    // W_UK beside the op before it (the ledger's before_wait): V2-Lite and V3 decode queries, a second token count
    add_head_linear(r, act, 1, 16, 128, 512, s + 18, 192, 576, true);
    add_head_linear(r, act, 3, 128, 128, 512, s + 19, 192, 576, true);
    // head_linear at decode sizes with MLA's wider head strides: W_UK into q_latent's columns, W_UV from the latent
    // attention output into o's input.
    add_head_linear(r, act, 8, 16, 128, 512, s + 140, 192, 576);
    add_head_linear(r, act, 8, 128, 128, 512, s + 141, 192, 576);
    add_head_linear(r, act, 1, 16, 512, 128, s + 142, 576, 192);
    add_head_linear(r, act, 3, 128, 512, 128, s + 143, 576, 192);
    add_head_linear(r, act, 8, 16, 512, 128, s + 144, 520, 129);  // out heads at odd offsets
    add_head_linear(r, act, 2, 4, 2048, 64, s + 145, 2056, 72);    // few heads, long K
    add_head_linear(r, act, 2, 4, 64, 32, s + 146, 68, 40);        // x heads not 16-byte aligned
    // Skinny GEMMs whose grid fills few SMs, so K is split over a cluster (SkinnyGemm.SplitsKOnlyWhenTheGridIsSmall
    // checks the split each one gets): V2-Lite's and V3's router, 8-way, accumulating, gated, and several problems.
    add_linear(r, act, 1, 64, 2048, s + 130, {.f32 = true});
    add_linear(r, act, 8, 64, 2048, s + 131, {.f32 = true});
    add_linear(r, act, 1, 256, 7168, s + 132);
    add_linear(r, act, 3, 256, 7168, s + 133, {.f32 = true});
    add_linear(r, act, 2, 64, 8192, s + 134, {.f32 = true});
    add_linear(r, act, 5, 40, 4096, s + 135, {.accumulate = true});
    add_linear_silu_mul(r, act, 2, 96, 2048, s + 136);
    add_multi_linear(r, act, 2, 2048, {64, 64, 48}, true, s + 137);
    // embedding: odd widths (2-, 4- and 8-byte copies), hidden sizes, repeated ids, no tokens. (Ids out of range are
    // rejected on the host before the upload: validate() does not read device memory.)
    add_embedding(r, act, "v50_d7", 50, 7, {3, 0, 49, 3, 17}, Expect::kMatch, s + 20);
    add_embedding(r, act, "v50_d6", 50, 6, {1, 2, 3}, Expect::kMatch, s + 21);
    add_embedding(r, act, "v1000_d2048", 1000, 2048, {999, 0, 512, 7, 7, 100, 3}, Expect::kMatch, s + 22);
    add_embedding(r, act, "v16_d7168", 16, 7168, {15, 1}, Expect::kMatch, s + 23);
    add_embedding(r, act, "no_tokens", 10, 8, {}, Expect::kMatch, s + 24);
    // gather_rows (the logits rows) and strided copies (q_pe into the decode query): odd widths, repeats, empty
    add_gather_rows(r, act, 9, 7, {8, 0, 3, 3}, s + 25);
    add_gather_rows(r, act, 300, 7168, {299, 0, 17, 150}, s + 26);
    add_gather_rows(r, act, 4, 16, {}, s + 27);
    add_copy_strided(r, act, "q_pe_16heads", {.rows = 3 * 16, .cols = 64, .src_stride = 192, .src_col = 128,
                                             .dst_stride = 576, .dst_col = 512}, s + 28);
    add_copy_strided(r, act, "odd", {.rows = 5, .cols = 3, .src_stride = 7, .src_col = 1, .dst_stride = 5,
                                     .dst_col = 2}, s + 29);
    add_copy_strided(r, act, "no_rows", {.rows = 0, .cols = 4, .src_stride = 8, .src_col = 0, .dst_stride = 4,
                                         .dst_col = 0}, s + 37);
    // RMSNorm: odd, empty, single, hidden sizes, in place, the c_kv half of a 576-wide latent row
    add_rms_norm(r, act, 5, 7, 0, Placement::kOutOfPlace, s + 30);
    add_rms_norm(r, act, 0, 16, 0, Placement::kOutOfPlace, s + 31);
    add_rms_norm(r, act, 1, 1, 0, Placement::kOutOfPlace, s + 32);
    add_rms_norm(r, act, 3, 4096, 0, Placement::kOutOfPlace, s + 33);
    add_rms_norm(r, act, 17, 7168, 0, Placement::kInPlace, s + 34);
    add_rms_norm(r, act, 9, 512, 576, Placement::kInPlace, s + 35);
    add_rms_norm(r, act, 4, 1537, 1540, Placement::kOutOfPlace, s + 36);
    // residual add + RMSNorm
    add_add_rms_norm(r, act, 5, 7, s + 40);
    add_add_rms_norm(r, act, 0, 16, s + 41);
    add_add_rms_norm(r, act, 1, 1, s + 42);
    add_add_rms_norm(r, act, 3, 2048, s + 43);
    add_add_rms_norm(r, act, 17, 7168, s + 44);
    add_add_rms_norm(r, act, 4, 1537, s + 45);
    add_add_rms_norm(r, act, 64, 1024, s + 46);
    add_add_rms_norm(r, act, 2, 12288, s + 38);  // past the two chunks a thread keeps in registers
    // ops that let the next start early, then a skinny linear of their output (V2-Lite: norm -> q/kv_a,
    // W_UV -> o_proj)
    add_early_start_chain(r, act, true, 1, 2048, 576, s + 47);
    add_early_start_chain(r, act, true, 8, 2048, 3072, s + 48);
    add_early_start_chain(r, act, false, 1, 2048, 2048, s + 49);
    add_early_start_chain(r, act, false, 4, 2048, 2048, s + 55);
    // SiLU · mul: odd, empty, V2-Lite's dense and expert widths
    add_silu_mul(r, act, 5, 7, s + 50);
    add_silu_mul(r, act, 0, 8, s + 51);
    add_silu_mul(r, act, 3, 10944, s + 52);
    add_silu_mul(r, act, 9, 1408, s + 53);
    add_silu_mul(r, act, 2, 3, s + 54);
    // add: odd sizes (vector tail), empty, large
    add_add(r, act, {7}, s + 60);
    add_add(r, act, {0}, s + 61);
    add_add(r, act, {3, 5}, s + 62);
    add_add(r, act, {17, 7168}, s + 63);
    add_add(r, act, {1000003}, s + 64);
    // RoPE: both layouts, YaRN scaling, q slices inside heads, k_pe inside latent rows, odd offsets, many heads
    for (const bool interleaved : {true, false}) {
      add_rope(r, act, "q_5x3_nope6_rot8", {.tokens = 5, .heads = 3, .rot_dim = 8, .offset = 6, .head_stride = 17,
                                            .token_stride = 3 * 17}, interleaved, 1.0f, s + 70);
      add_rope(r, act, "q_5x3_nope6_rot8", {.tokens = 5, .heads = 3, .rot_dim = 8, .offset = 6, .head_stride = 17,
                                            .token_stride = 3 * 17}, interleaved, 1.2f, s + 71);
      add_rope(r, act, "k_pe_7_rank512_rot64", {.tokens = 7, .heads = 1, .rot_dim = 64, .offset = 512,
                                                .head_stride = 0, .token_stride = 576}, interleaved, 1.0f, s + 72);
      add_rope(r, act, "q_0_tokens", {.tokens = 0, .heads = 2, .rot_dim = 4, .offset = 0, .head_stride = 4,
                                      .token_stride = 8}, interleaved, 1.0f, s + 73);
      add_rope(r, act, "q_2x2_rot2", {.tokens = 2, .heads = 2, .rot_dim = 2, .offset = 1, .head_stride = 3,
                                      .token_stride = 7}, interleaved, 0.9f, s + 74);
      add_rope(r, act, "q_3x128_nope128_rot64", {.tokens = 3, .heads = 128, .rot_dim = 64, .offset = 128,
                                                 .head_stride = 192, .token_stride = 128 * 192}, interleaved, 1.0f,
               s + 75);
    }
    // latent-cache writes: odd rows, empty, one-token pages, DeepSeek's 576-wide rows in 64-token pages, a bad slot
    add_mla_cache_write(r, act, 7, 4, 10, 9, s + 80);
    add_mla_cache_write(r, act, 3, 5, 6, 0, s + 81);
    add_mla_cache_write(r, act, 2, 1, 3, 2, s + 82);
    add_mla_cache_write(r, act, 5, 64, 576, 100, s + 83);
    // mla_prepare, the fused norm + ropes + cache write + q_abs rope columns (shapes in mla_prepare_cases.h)
    add_mla_prepare_cases(r, act.device, act.tolerance(), s + 200);
  }
  // MLA decode, bfloat16: V2-Lite (16 heads, the narrow kernel), 32 heads, V3 (128 heads, the wide kernel); contexts
  // of 1, page-aligned and not, odd page sizes; long contexts that split (the workspace grows as cases run).
  add_mla_decode(r, 16, 64, {1, 64, 65, 130, 1000}, 90);
  add_mla_decode(r, 16, 16, {17, 33, 5}, 91);
  add_mla_decode(r, 32, 7, {40, 3}, 92);
  add_mla_decode(r, 128, 64, {5, 300, 2049}, 93);
  add_mla_decode(r, 16, 64, {5000}, 94);
  add_mla_decode(r, 128, 64, {4096, 1}, 95);
  add_mla_decode(r, 16, 1, {9, 2}, 96);
  // A decode step's order, the step's token written by mla_prepare right before (fresh_rows 1 from the launch
  // ledger): V2-Lite (narrow) and V3 (wide, warpgroup MMA) contexts that split, newest rows at a page's start and end,
  // a context of one row, an unrelated op between (none fresh: every row copied before the wait), 32 heads (two
  // narrow CTAs) over pages of 7.
  add_mla_decode(r, 16, 64, {1, 64, 65, 130, 1000}, 97, {.step_write = true});
  add_mla_decode(r, 128, 64, {5, 300, 2049}, 98, {.step_write = true});
  add_mla_decode(r, 16, 16, {17, 33, 5}, 99, {.step_write = true});
  add_mla_decode(r, 16, 64, {64, 130, 5000}, 100, {.step_write = true});
  add_mla_decode(r, 16, 64, {65, 1000}, 101, {.step_write = true, .unrelated_op_between = true});
  add_mla_decode(r, 32, 7, {40, 3}, 102, {.step_write = true});
  // With the value projection (W_UV): V2-Lite at batch 1 whose context splits (the combine inside W_UV's kernel),
  // many splits at batch 1, several sequences (the combine kernel, then W_UV's per-head GEMV), one split (no
  // combine), nine sequences (more than the per-head GEMV takes: W_UV on cuBLAS), V3's 128 heads (W_UV on cuBLAS);
  // and the model's order, the new token's row written two ops back with an op between that lets the decode start
  // early.
  add_mla_decode(r, 16, 64, {1000}, 103, {.project = true});
  add_mla_decode(r, 16, 64, {5000}, 104, {.project = true});
  add_mla_decode(r, 16, 64, {1, 64, 65, 130, 1000}, 105, {.project = true});
  add_mla_decode(r, 16, 16, {17}, 106, {.project = true});
  add_mla_decode(r, 16, 64, {300, 1, 64, 700, 9, 130, 2000, 65, 1000}, 107, {.project = true});
  add_mla_decode(r, 128, 64, {5, 300, 2049}, 108, {.project = true});
  add_mla_decode(r, 32, 7, {40, 3}, 109, {.project = true});
  add_mla_decode(r, 16, 64, {1000}, 110, {.step_write = true, .early_op_between = true, .project = true});
  add_mla_decode(r, 16, 64, {1, 64, 65, 130, 1000}, 111, {.step_write = true, .early_op_between = true, .project = true});
  add_mla_decode(r, 128, 64, {5, 300, 2049}, 112, {.step_write = true, .early_op_between = true});
  // MLA decode over the FP8 latent cache, the same shapes and step orders (mla_decode_fp8_cases.h).
  add_mla_decode_fp8_cases(r, 400);
  // MLA prefill, bfloat16 at DeepSeek's dims: V2-Lite's 16 heads and V3's 128; full prompts, chunked prefill over a
  // cached prefix (one or many query tiles), context 1, a sequence without queries, page sizes that do not divide
  // 64 (7, 1) or the contexts, long contexts (the workspace grows as cases run).
  add_mla_prefill(r, 16, 64, {70, 65, 1, 200}, {70, 9, 1, 130}, 160);
  add_mla_prefill(r, 16, 7, {100, 33}, {100, 17}, 161);
  add_mla_prefill(r, 128, 64, {300, 64}, {300, 1}, 162);
  add_mla_prefill(r, 16, 16, {50, 20, 130}, {0, 20, 65}, 163);
  add_mla_prefill(r, 32, 1, {9, 3}, {5, 3}, 164);
  add_mla_prefill(r, 16, 64, {1000}, {1000}, 165);
  add_mla_prefill(r, 16, 64, {2049, 5}, {129, 5}, 166);
  add_mla_prefill(r, 128, 32, {1}, {1}, 167);
  // 128-query and 128-key tiles (the wgmma kernel's): prefixes that put the diagonal across two key tiles, query
  // tiles of 128, 129, 44 and 1 rows, full prompts of 256 (aligned) and 383.
  add_mla_prefill(r, 16, 64, {777, 300}, {300, 129}, 168);
  add_mla_prefill(r, 16, 64, {256, 383}, {256, 383}, 169);
  // The FP8 latent cache: its write, mla_prepare into it, mla_prefill over it (mla_fp8_cache_cases.h).
  add_mla_fp8_cache_cases(r, 1000);
  // MoE routing: V3 (sigmoid, bias, 8 groups keep 4, top-8 of 256) with one and several route blocks, V2-Lite
  // (softmax, greedy, top-6 of 64), V2 group-limited; no tokens.
  const MoeRouteCase v3{.tag = "v3_e256_g8_keep4_k8", .tokens = 7, .experts = 256, .top_k = 8, .n_group = 8,
                        .topk_group = 4, .scoring = ExpertScoring::kSigmoid, .method = TopkMethod::kNoauxTc,
                        .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .bias = true};
  add_moe_route(r, v3, 140);
  MoeRouteCase v3_many = v3;
  v3_many.tokens = 300;  // more route blocks than the fused scatter takes
  add_moe_route(r, v3_many, 141);
  MoeRouteCase v3_none = v3;
  v3_none.tokens = 0;
  add_moe_route(r, v3_none, 142);
  add_moe_route(r, {.tag = "v2_lite_greedy_e64_k6", .tokens = 33, .experts = 64, .top_k = 6,
                    .scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .routed_scaling_factor = 1.0f},
                143);
  const MoeRouteCase v2_group_limited{.tag = "v2_group_limited_e160_g8_keep3_k6", .tokens = 20, .experts = 160,
                                      .top_k = 6, .n_group = 8, .topk_group = 3, .scoring = ExpertScoring::kSoftmax,
                                      .method = TopkMethod::kGroupLimitedGreedy, .norm_topk_prob = false,
                                      .routed_scaling_factor = 16.0f};
  add_moe_route(r, v2_group_limited, 144);
  // ... and with the shared experts appended: V3's one (9 pairs a token: two scatter rounds) over one route block, the
  // fused scatter's few and the scatter kernel's many; V2-Lite's and V2's two.
  MoeRouteCase v3_shared = v3;
  v3_shared.num_shared = 1;
  add_moe_route(r, v3_shared, 145);
  v3_shared.tokens = 100;
  add_moe_route(r, v3_shared, 146);
  v3_shared.tokens = 300;
  add_moe_route(r, v3_shared, 147);
  add_moe_route(r, {.tag = "v2_lite_greedy_e64_k6", .tokens = 33, .experts = 64, .top_k = 6,
                    .scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .routed_scaling_factor = 1.0f,
                    .num_shared = 2},
                148);
  MoeRouteCase v2_shared = v2_group_limited;
  v2_shared.num_shared = 2;
  v2_shared.tokens = 200;
  add_moe_route(r, v2_shared, 149);
  // MoE experts, bfloat16: decode-sized (fused combine), experts without tokens, V2-Lite's intermediate width and
  // top-6, more than 32 tokens (separate combine), enough rows per expert for the grouped kernels, no tokens.
  add_moe_experts_bf16(r, {.tokens = 5, .dim = 256, .inter = 128, .routed = 8, .top_k = 2}, 150);
  add_moe_experts_bf16(r, {.tokens = 2, .dim = 64, .inter = 32, .routed = 16, .top_k = 2}, 151);
  add_moe_experts_bf16(r, {.tokens = 1, .dim = 1024, .inter = 1408, .routed = 8, .top_k = 6}, 152);
  add_moe_experts_bf16(r, {.tokens = 64, .dim = 96, .inter = 32, .routed = 4, .top_k = 3}, 153);
  add_moe_experts_bf16(r, {.tokens = 300, .dim = 512, .inter = 256, .routed = 16, .top_k = 4}, 154);
  add_moe_experts_bf16(r, {.tokens = 0, .dim = 64, .inter = 32, .routed = 4, .top_k = 2}, 155);
  // ... with the shared experts stacked after the routed ones (E + s experts, top_k + s pairs). V3-like (256 + 1,
  // 8 + 1): small-M with the fused combine, small-M past 32 tokens (two route blocks: the fused scatter, in two
  // rounds), and grouped (300 tokens: 2700 pairs > 8 rows x 257 experts; the scatter kernel). V2-Lite-like (64 + 2,
  // 6 + 2): small-M and grouped (300 tokens: 2400 pairs > 8 x 66).
  add_moe_experts_bf16(r, {.tokens = 5, .dim = 256, .inter = 128, .routed = 256, .top_k = 8, .shared = 1}, 180);
  add_moe_experts_bf16(r, {.tokens = 40, .dim = 256, .inter = 128, .routed = 256, .top_k = 8, .shared = 1}, 181);
  add_moe_experts_bf16(r, {.tokens = 300, .dim = 256, .inter = 128, .routed = 256, .top_k = 8, .shared = 1}, 182);
  add_moe_experts_bf16(r, {.tokens = 7, .dim = 256, .inter = 128, .routed = 64, .top_k = 6, .shared = 2}, 183);
  // Grids that need more than one wave of 8-warp small-M CTAs on a 132-SM GPU and fit one wave of 4-warp CTAs, the
  // narrow variant: V2-Lite's gate/up width at batch 1 (88 column blocks x 8 experts), and a down grid of 64 column
  // blocks x 9 experts.
  add_moe_experts_bf16(r, {.tokens = 1, .dim = 256, .inter = 1408, .routed = 64, .top_k = 6, .shared = 2}, 185);
  add_moe_experts_bf16(r, {.tokens = 1, .dim = 2048, .inter = 128, .routed = 16, .top_k = 8, .shared = 1}, 186);
  // moe (routing + experts, one alignment on the GPU): V3 routing with its shared expert at decode sizes (fused
  // combine), past one route block, and on the grouped path; V2-Lite's routing with two shared experts at batch 1, 8
  // and 20 (the shared experts' gate/up CTAs run before their grid dependency wait: one token tile, then four) and
  // on the grouped path; V2's group-limited routing without shared experts.
  for (const int64_t tokens : {int64_t{1}, int64_t{6}, int64_t{40}, int64_t{300}}) {
    MoeRouteCase v3_moe = v3_shared;
    v3_moe.tokens = tokens;
    add_moe_bf16(r, "v3_e256_k8_s1", v3_moe, 256, 128, 190 + static_cast<uint64_t>(tokens));
  }
  for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{20}, int64_t{300}}) {
    add_moe_bf16(r, "v2_lite_e64_k6_s2",
                 {.tag = "", .tokens = tokens, .experts = 64, .top_k = 6, .scoring = ExpertScoring::kSoftmax,
                  .method = TopkMethod::kGreedy, .num_shared = 2},
                 256, 128, 200 + static_cast<uint64_t>(tokens));
  }
  MoeRouteCase v2_moe = v2_group_limited;
  v2_moe.tokens = 20;
  add_moe_bf16(r, "v2_e160_g8_keep3_k6", v2_moe, 128, 64, 210);
  // moe with the router weight: computed in the route kernel at V2-Lite's width (2048) for 1 and 8 tokens and at V3's
  // (7168, 28 pieces a lane) for 2, by linear first past its shared-memory budget (9 tokens of 2048) and past one
  // route block (40 tokens of 256).
  const MoeRouteCase v2_lite_route{.tag = "", .tokens = 1, .experts = 64, .top_k = 6,
                                   .scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .num_shared = 2};
  for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{9}}) {
    MoeRouteCase c = v2_lite_route;
    c.tokens = tokens;
    add_moe_bf16(r, "v2_lite_e64_k6_s2", c, 2048, 32, 230 + static_cast<uint64_t>(tokens), /*router=*/true);
  }
  const MoeRouteCase v3_width{.tag = "", .tokens = 2, .experts = 16, .top_k = 4, .n_group = 4, .topk_group = 2,
                              .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .bias = true, .num_shared = 1};
  add_moe_bf16(r, "v3_like_e16_k4_s1", v3_width, 7168, 32, 241, /*router=*/true);
  // The decode FFN in one persistent launch (up to 4 tokens at a hidden size of 4096 or more; the 7168 case above
  // takes it too): V2-Lite's routing with its shared experts at 1 and 4 tokens, V3's group-limited one at 3.
  for (const int64_t tokens : {int64_t{1}, int64_t{4}}) {
    MoeRouteCase c = v2_lite_route;
    c.tokens = tokens;
    add_moe_bf16(r, "v2_lite_e64_k6_s2", c, 4096, 64, 243 + static_cast<uint64_t>(tokens));
  }
  MoeRouteCase v3_one_launch = v3_width;
  v3_one_launch.tokens = 3;
  add_moe_bf16(r, "v3_like_e16_k4_s1", v3_one_launch, 4096, 96, 248);
  MoeRouteCase v3_router = v3_shared;
  v3_router.tokens = 40;
  add_moe_bf16(r, "v3_e256_k8_s1", v3_router, 256, 64, 242, /*router=*/true);
  add_moe_experts_bf16(r, {.tokens = 300, .dim = 256, .inter = 128, .routed = 64, .top_k = 6, .shared = 2}, 184);
  // FP8 expert weights (W8A16). moe_experts: V2-Lite's widths (hidden 2048, inter 1408 = 11 x 128, top-6 and 2 shared)
  // over 12 routed experts (the weights are made and quantized on the host: V2-Lite's 64 took half a minute a case)
  // at decode sizes on the small-M kernels and at 80 tokens (480 pairs > 8 x 14 rows) on the grouped ones;
  // V3-like small (hidden 1024, inter 256, 32 + 1 experts, top-8) at decode sizes and prefill sizes (grouped); the
  // persistent decode FFN (hidden 4096, up to 4 tokens); the W8A8 request (fp8_activations) at decode and prefill.
  const ExpertsShape fp8_v2_lite{.tokens = 1, .dim = 2048, .inter = 1408, .routed = 12, .top_k = 6, .shared = 2};
  const ExpertsShape fp8_v3_small{.tokens = 1, .dim = 1024, .inter = 256, .routed = 32, .top_k = 8, .shared = 1};
  for (const int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{32}, int64_t{80}}) {
    ExpertsShape sh = fp8_v2_lite;
    sh.tokens = tokens;
    add_moe_experts_fp8_bf16_x(r, sh, 260 + static_cast<uint64_t>(tokens));
  }
  for (const int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{32}, int64_t{300}, int64_t{2048}}) {
    ExpertsShape sh = fp8_v3_small;
    sh.tokens = tokens;
    add_moe_experts_fp8_bf16_x(r, sh, 270 + static_cast<uint64_t>(tokens));
  }
  add_moe_experts_fp8_bf16_x(r, {.tokens = 3, .dim = 4096, .inter = 256, .routed = 16, .top_k = 4, .shared = 1}, 280);
  for (const int64_t tokens : {int64_t{8}, int64_t{300}}) {
    ExpertsShape sh = fp8_v3_small;
    sh.tokens = tokens;
    add_moe_experts_fp8_bf16_x(r, sh, 281 + static_cast<uint64_t>(tokens), /*w8a8=*/true);
  }
  // The W8A8 grouped kernels (every K at least 4 blocks of 128; inter 256 above runs W8A16): V2-Lite's widths at 80
  // tokens (11 K blocks in down), V3-like 1024 x 512 at 300 and 2048 tokens (many tiles a CTA, partial row blocks),
  // and over 4 expert shards.
  {
    ExpertsShape sh = fp8_v2_lite;
    sh.tokens = 80;
    add_moe_experts_fp8_bf16_x(r, sh, 285, /*w8a8=*/true);
  }
  const ExpertsShape fp8_w8a8{.tokens = 300, .dim = 1024, .inter = 512, .routed = 32, .top_k = 8, .shared = 1};
  for (const int64_t tokens : {int64_t{300}, int64_t{2048}}) {
    ExpertsShape sh = fp8_w8a8;
    sh.tokens = tokens;
    add_moe_experts_fp8_bf16_x(r, sh, 286 + static_cast<uint64_t>(tokens), /*w8a8=*/true);
  }
  for (int64_t i = 0; i < 4; ++i) {
    add_moe_experts_fp8_bf16_x(r, fp8_w8a8, 287 + static_cast<uint64_t>(i), /*w8a8=*/true, even_shard(32, i, 4, 3));
  }
  // moe with FP8 experts: V2-Lite-like routing (softmax, greedy) with and without the router (fused into the route
  // kernel at 1 and 8 tokens of 2048), V3-like routing (sigmoid, groups, bias) at decode and prefill sizes, and V3's
  // width (7168: the router in the route kernel and the persistent FFN) at 2 tokens.
  const MoeRouteCase fp8_v2_route{.tag = "", .tokens = 1, .experts = 12, .top_k = 6,
                                  .scoring = ExpertScoring::kSoftmax, .method = TopkMethod::kGreedy, .num_shared = 2};
  for (const int64_t tokens : {int64_t{1}, int64_t{8}}) {
    MoeRouteCase c = fp8_v2_route;
    c.tokens = tokens;
    add_moe_fp8(r, "v2_lite_e12_k6_s2", c, 2048, 1408, 290 + static_cast<uint64_t>(tokens));
    add_moe_fp8(r, "v2_lite_e12_k6_s2", c, 2048, 1408, 292 + static_cast<uint64_t>(tokens), /*router=*/true);
  }
  const MoeRouteCase fp8_v3_route{.tag = "", .tokens = 1, .experts = 32, .top_k = 8, .n_group = 4, .topk_group = 2,
                                  .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .bias = true,
                                  .num_shared = 1};
  for (const int64_t tokens : {int64_t{2}, int64_t{32}, int64_t{300}}) {
    MoeRouteCase c = fp8_v3_route;
    c.tokens = tokens;
    add_moe_fp8(r, "v3_like_e32_k8_s1", c, 1024, 256, 300 + static_cast<uint64_t>(tokens));
    add_moe_fp8(r, "v3_like_e32_k8_s1", c, 1024, 256, 302 + static_cast<uint64_t>(tokens), /*router=*/true);
  }
  MoeRouteCase fp8_v3_width = v3_width;
  fp8_v3_width.tokens = 2;
  add_moe_fp8(r, "v3_like_e16_k4_s1", fp8_v3_width, 7168, 128, 310, /*router=*/true);
  // Expert parallelism: a shard's weights hold a slice of the routed experts (the shared ones on one shard only),
  // routing stays the whole model's (global ids), and the kernels drop the pairs held elsewhere; the CPU reference
  // computes the same shard. moe_experts, bfloat16: V3-like (256 + 1) over 4 shards on small-M with the fused combine,
  // past 32 tokens and on the grouped path (300 tokens); V2-Lite-like (64 + 2) over 2 shards.
  for (int64_t i = 0; i < 4; ++i) {
    const ExpertShard shard = even_shard(256, i, 4, 3);
    for (const int64_t tokens : {int64_t{5}, int64_t{40}, int64_t{300}}) {
      add_moe_experts_bf16(r, {.tokens = tokens, .dim = 256, .inter = 128, .routed = 256, .top_k = 8, .shared = 1},
                           320 + static_cast<uint64_t>(10 * i + tokens), shard);
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    add_moe_experts_bf16(r, {.tokens = 7, .dim = 256, .inter = 128, .routed = 64, .top_k = 6, .shared = 2},
                         360 + static_cast<uint64_t>(i), even_shard(64, i, 2, 0));
    add_moe_experts_bf16(r, {.tokens = 300, .dim = 256, .inter = 128, .routed = 64, .top_k = 6, .shared = 2},
                         362 + static_cast<uint64_t>(i), even_shard(64, i, 2, 0));
  }
  // ... a shard none of whose experts any pair names (no rows at all; out is zero): small-M with the fused combine,
  // with the separate combine, the persistent decode FFN (hidden 4096), and grouped.
  const ExpertShard idle = even_shard(16, 1, 4, 0);
  add_moe_experts_bf16(r, {.tokens = 2, .dim = 256, .inter = 128, .routed = 16, .top_k = 2, .shared = 1}, 364, idle,
                       PairsHeld::kNone);
  add_moe_experts_bf16(r, {.tokens = 40, .dim = 256, .inter = 128, .routed = 16, .top_k = 2, .shared = 1}, 365, idle,
                       PairsHeld::kNone);
  add_moe_experts_bf16(r, {.tokens = 2, .dim = 4096, .inter = 128, .routed = 16, .top_k = 2, .shared = 1}, 366, idle,
                       PairsHeld::kNone);
  add_moe_experts_bf16(r, {.tokens = 300, .dim = 256, .inter = 128, .routed = 16, .top_k = 4, .shared = 1}, 367, idle,
                       PairsHeld::kNone);
  // ... FP8 weights: V2-Lite's widths over 2 shards at decode sizes and on the grouped path; V3-like small over 4.
  for (int64_t i = 0; i < 2; ++i) {
    for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{80}}) {
      ExpertsShape sh = fp8_v2_lite;
      sh.tokens = tokens;
      add_moe_experts_fp8_bf16_x(r, sh, 370 + static_cast<uint64_t>(10 * i + tokens), false, even_shard(12, i, 2, 0));
    }
  }
  for (int64_t i = 0; i < 4; ++i) {
    for (const int64_t tokens : {int64_t{2}, int64_t{300}}) {
      ExpertsShape sh = fp8_v3_small;
      sh.tokens = tokens;
      add_moe_experts_fp8_bf16_x(r, sh, 400 + static_cast<uint64_t>(10 * i + tokens), false, even_shard(32, i, 4, 3));
    }
  }
  // moe on a shard, bfloat16: V3 routing (256 + 1) over 4 shards at 1, 6, 40 and 300 tokens (the shared slots run
  // before their wait on the shard that holds them); V2-Lite's over 2 at 1, 8, 20 and 300; the router in the route
  // kernel (V2-Lite's width at 1 and 8 tokens, V3's at 2); the persistent decode FFN (hidden 4096).
  for (int64_t i = 0; i < 4; ++i) {
    for (const int64_t tokens : {int64_t{1}, int64_t{6}, int64_t{40}, int64_t{300}}) {
      MoeRouteCase v3_moe = v3_shared;
      v3_moe.tokens = tokens;
      add_moe_bf16(r, "v3_e256_k8_s1", v3_moe, 256, 128, 420 + static_cast<uint64_t>(10 * i + tokens), false,
                   even_shard(256, i, 4, 3));
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    const ExpertShard shard = even_shard(64, i, 2, 0);
    for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{20}, int64_t{300}}) {
      add_moe_bf16(r, "v2_lite_e64_k6_s2",
                   {.tag = "", .tokens = tokens, .experts = 64, .top_k = 6, .scoring = ExpertScoring::kSoftmax,
                    .method = TopkMethod::kGreedy, .num_shared = 2},
                   256, 128, 760 + static_cast<uint64_t>(10 * i + tokens), false, shard);
    }
    for (const int64_t tokens : {int64_t{1}, int64_t{8}}) {
      MoeRouteCase c = v2_lite_route;
      c.tokens = tokens;
      add_moe_bf16(r, "v2_lite_e64_k6_s2", c, 2048, 32, 800 + static_cast<uint64_t>(10 * i + tokens),
                   /*router=*/true, shard);
      add_moe_bf16(r, "v2_lite_e64_k6_s2", c, 4096, 64, 820 + static_cast<uint64_t>(10 * i + tokens), false, shard);
    }
    add_moe_bf16(r, "v3_like_e16_k4_s1", v3_width, 7168, 32, 840 + static_cast<uint64_t>(i), /*router=*/true,
                 even_shard(16, i, 2, 1));
  }
  // moe on a shard with FP8 experts: V2-Lite-like routing over 2 shards (with the router at 1 token), V3-like over 4
  // at decode and prefill sizes.
  for (int64_t i = 0; i < 2; ++i) {
    for (const int64_t tokens : {int64_t{1}, int64_t{8}}) {
      MoeRouteCase c = fp8_v2_route;
      c.tokens = tokens;
      add_moe_fp8(r, "v2_lite_e12_k6_s2", c, 2048, 1408, 850 + static_cast<uint64_t>(10 * i + tokens), tokens == 1,
                  even_shard(12, i, 2, 0));
    }
  }
  for (int64_t i = 0; i < 4; ++i) {
    for (const int64_t tokens : {int64_t{2}, int64_t{300}}) {
      MoeRouteCase c = fp8_v3_route;
      c.tokens = tokens;
      add_moe_fp8(r, "v3_like_e32_k8_s1", c, 1024, 256, 880 + static_cast<uint64_t>(10 * i + tokens), false,
                  even_shard(32, i, 4, 3));
    }
  }
  // Sampling: V3's and V2's vocabularies with 64 mixed rows, one row alone, ties, small and odd vocabularies; the same
  // with grammar masks.
  add_sample(r, 129280, 64, LogitShape::kModelLike, 170);
  add_sample(r, 129280, 64, LogitShape::kUniform, 171);
  add_sample(r, 102400, 64, LogitShape::kModelLike, 172);
  add_sample(r, 129280, 16, LogitShape::kTies, 173);
  add_sample(r, 129280, 1, LogitShape::kModelLike, 174);
  add_sample(r, 5003, 33, LogitShape::kUniform, 175);
  add_sample(r, 1029, 45, LogitShape::kTies, 176);
  add_sample(r, 130, 30, LogitShape::kModelLike, 177);
  // With grammar masks: V3's vocabulary with many rows (one CTA each) and with few (clusters), flat logits (the top-p
  // rows re-read the row), an odd vocabulary with ties.
  add_sample(r, 129280, 64, LogitShape::kModelLike, 178, GrammarMasks::kMixed);
  add_sample(r, 129280, 7, LogitShape::kUniform, 179, GrammarMasks::kMixed);
  add_sample(r, 5003, 33, LogitShape::kTies, 180, GrammarMasks::kMixed);
  add_sample(r, 130, 30, LogitShape::kModelLike, 181, GrammarMasks::kMixed);
  return r;
}

const CaseRegistry& registry() {
  static const CaseRegistry r = build_registry();
  return r;
}

// The W8A8 grouped MoE kernels against the recipe on the host (add_moe_experts_w8a8_recipe): V2-Lite's widths at 80
// tokens, V3-like 1024 x 512 at 300 tokens, and one of its 4 expert shards.
const CaseRegistry& w8a8_recipe_registry() {
  static const CaseRegistry r = [] {
    CaseRegistry reg;
    add_moe_experts_w8a8_recipe(reg, {.tokens = 80, .dim = 2048, .inter = 1408, .routed = 12, .top_k = 6, .shared = 2},
                                285);
    const ExpertsShape v3_like{.tokens = 300, .dim = 1024, .inter = 512, .routed = 32, .top_k = 8, .shared = 1};
    add_moe_experts_w8a8_recipe(reg, v3_like, 586);
    add_moe_experts_w8a8_recipe(reg, v3_like, 288, even_shard(32, 1, 4, 3));
    return reg;
  }();
  return r;
}

class CudaMoeW8A8Recipe : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaMoeW8A8Recipe, Case) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  DeviceMemory device_memory;
  expect_matches_naive(w8a8_recipe_registry().cases()[GetParam()], *cuda, device_memory);
}

INSTANTIATE_TEST_SUITE_P(CudaBackend, CudaMoeW8A8Recipe,
                         ::testing::Range<size_t>(0, w8a8_recipe_registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return w8a8_recipe_registry().cases()[info.param].name;
                         });

// A CUDA and a CPU backend shared by a suite of registry cases. The CUDA one is made with the environment's tuning
// record (so DEEPINFER_DISABLE_PDL=1 runs the suite on plain launches), its prefill kernel replaced by kPrefillKernel
// when that is not kDefault.
enum class PrefillKernel : uint8_t { kDefault, kMma };
template <PrefillKernel kPrefillKernel>
class CudaAgainstCpu : public ::testing::TestWithParam<size_t> {
 public:
  static void SetUpTestSuite() {
    if (!cuda_device_available()) return;
    cuda::CudaTuning tuning = cuda::CudaTuning::from_env();
    if (kPrefillKernel == PrefillKernel::kMma) tuning.mla_prefill_kernel = cuda::MlaPrefillKernel::kMma;
    cuda_ = make_cuda_backend(0, tuning);
    cpu_ = make_cpu_backend();
  }
  static void TearDownTestSuite() {
    cuda_.reset();
    cpu_.reset();
  }

 protected:
  // The case GetParam() on the CUDA backend against the CPU reference.
  void run_case() {
    DEEPINFER_REQUIRE_CUDA_DEVICE();
    DeviceMemory device_memory;
    HostMemory host_memory;
    expect_matches_reference(registry().cases()[GetParam()], *cuda_, device_memory, *cpu_, host_memory);
  }

  static inline std::unique_ptr<Backend> cuda_;
  static inline std::unique_ptr<Backend> cpu_;
};

class CudaVsCpu : public CudaAgainstCpu<PrefillKernel::kDefault> {};

TEST_P(CudaVsCpu, Case) { run_case(); }

INSTANTIATE_TEST_SUITE_P(CudaBackend, CudaVsCpu, ::testing::Range<size_t>(0, registry().cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return registry().cases()[info.param].name;
                         });

// The mma.sync MLA prefill attention kernel on every MLA prefill case of the registry, against the CPU reference (the
// suite above runs them through the default kernel, wgmma). Its backend's tuning record names the mma kernel
// (CudaTuning::mla_prefill_kernel, DEEPINFER_MLA_PREFILL=mma in the environment). On a GPU, --gtest_filter='*mla_prefill*' runs every prefill case through both
// kernels ('*MmaMlaPrefill*': through the mma.sync one only).
std::vector<size_t> mla_prefill_cases() {
  std::vector<size_t> indices;
  for (size_t i = 0; i < registry().cases().size(); ++i) {
    if (registry().cases()[i].op == OpKind::kMlaPrefill) indices.push_back(i);
  }
  return indices;
}

class CudaMmaMlaPrefillVsCpu : public CudaAgainstCpu<PrefillKernel::kMma> {};

TEST_P(CudaMmaMlaPrefillVsCpu, Case) { run_case(); }

INSTANTIATE_TEST_SUITE_P(CudaBackend, CudaMmaMlaPrefillVsCpu, ::testing::ValuesIn(mla_prefill_cases()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return registry().cases()[info.param].name;
                         });

// DEEPINFER_MLA_PREFILL's values (host code: runs without a device): unset, empty and "wgmma" pick the Hopper kernel,
// "mma" mma.sync, anything else throws. Host-only: no "Cuda" in its name.
TEST(TuningRecord, MlaPrefillKernelSwitch) {
  const auto kernel = [] { return cuda::CudaTuning::from_env().mla_prefill_kernel; };
  {
    const ScopedEnv unset("DEEPINFER_MLA_PREFILL", "");
    ::unsetenv("DEEPINFER_MLA_PREFILL");
    EXPECT_EQ(kernel(), cuda::MlaPrefillKernel::kWgmma);
  }
  {
    const ScopedEnv empty("DEEPINFER_MLA_PREFILL", "");
    EXPECT_EQ(kernel(), cuda::MlaPrefillKernel::kWgmma);
  }
  {
    const ScopedEnv mma("DEEPINFER_MLA_PREFILL", "mma");
    EXPECT_EQ(kernel(), cuda::MlaPrefillKernel::kMma);
  }
  {
    const ScopedEnv wgmma("DEEPINFER_MLA_PREFILL", "wgmma");
    EXPECT_EQ(kernel(), cuda::MlaPrefillKernel::kWgmma);
  }
  {
    const ScopedEnv typo("DEEPINFER_MLA_PREFILL", "wgmm");
    EXPECT_THROW(kernel(), Error);
  }
}

// The on/off switches (host code): unset leaves the defaults (PDL and the skinny GEMM on, no profiling); "1" turns
// each kill switch on, "0" leaves it off.
TEST(TuningRecord, FlagsFromTheEnvironment) {
  const ScopedEnv pdl("DEEPINFER_DISABLE_PDL", ""), skinny("DEEPINFER_DISABLE_SKINNY_GEMM", "");
  const ScopedEnv profile("DEEPINFER_PROFILE_OPS", "");
  for (const char* name : {"DEEPINFER_DISABLE_PDL", "DEEPINFER_DISABLE_SKINNY_GEMM", "DEEPINFER_PROFILE_OPS"}) {
    ::unsetenv(name);
  }
  const cuda::CudaTuning defaults = cuda::CudaTuning::from_env();
  EXPECT_TRUE(defaults.pdl);
  EXPECT_TRUE(defaults.skinny_gemm);
  EXPECT_FALSE(defaults.profile_ops);
  EXPECT_EQ(defaults.mla_decode_splits, cuda::CudaTuning{}.mla_decode_splits);
  ::setenv("DEEPINFER_DISABLE_PDL", "1", 1);
  ::setenv("DEEPINFER_DISABLE_SKINNY_GEMM", "0", 1);
  ::setenv("DEEPINFER_PROFILE_OPS", "1", 1);
  const cuda::CudaTuning set = cuda::CudaTuning::from_env();
  EXPECT_FALSE(set.pdl);
  EXPECT_TRUE(set.skinny_gemm);
  EXPECT_TRUE(set.profile_ops);
}

constexpr OpKind kImplemented[] = {OpKind::kEmbedding, OpKind::kGatherRows, OpKind::kCopyStrided,
                                   OpKind::kRmsNorm,   OpKind::kAddRmsNorm, OpKind::kSiluMul,
                                   OpKind::kAdd,       OpKind::kRope,       OpKind::kMlaCacheWrite,
                                   OpKind::kMlaPrepare, OpKind::kMlaDecode, OpKind::kMoeRoute,
                                   OpKind::kMoeExperts, OpKind::kMoe, OpKind::kSample};
constexpr OpKind kGemms[] = {OpKind::kLinear, OpKind::kHeadLinear, OpKind::kMlaPrefill};  // need cuBLAS

// supports() reports exactly the implemented ops (the GEMMs only with cuBLAS), and every supported op has cases.
TEST(CudaBackend, ReportsTheOpsItImplements) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  EXPECT_EQ(cuda->device(), Device::kCuda);
  EXPECT_EQ(cuda->name(), "cuda");
  for (OpKind op : kImplemented) EXPECT_TRUE(cuda->supports(op)) << op_name(op);
#ifdef DEEPINFER_HAVE_CUBLAS
  for (OpKind op : kGemms) EXPECT_TRUE(cuda->supports(op)) << op_name(op);
#else
  for (OpKind op : kGemms) EXPECT_FALSE(cuda->supports(op)) << op_name(op);
#endif
  for (int i = 0; i <= static_cast<int>(OpKind::kSample); ++i) {
    const auto op = static_cast<OpKind>(i);
    if (cuda->supports(op)) {
      EXPECT_GT(registry().count(op), 0) << "no CUDA case for " << op_name(op);
    }
  }
}

// The memory functions: stream-ordered device tensors, zeros, copies both ways, and uploads that narrow float32 to
// bfloat16 the way the host conversion does.
// A step that frees a tensor below live ones: the pool's high-water mark (what the warm-up measures) reuses the hole
// at once, the graph arena only once the tensors above it go, so the recording needs more arena than the warm-up
// reserved. capture() must then grow the arena and record again, and the graph must compute what the eager run does.
TEST(CudaBackend, CaptureRecordsAgainWhenTheArenaRunsShort) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();  // a fresh arena: sized by this capture alone
  constexpr int64_t n = 1 << 18;                              // 1 MiB of float32
  const std::vector<float> one(static_cast<size_t>(n), 1.0f);
  Tensor ones = cuda->empty({1, n}, DType::kF32);
  cuda->copy_to_device(ConstTensorView(one.data(), DType::kF32, {1, n}, Device::kCpu), ones.view());
  Tensor out = cuda->zeros({1, n}, DType::kF32);
  const auto work = [&] {
    Tensor a = cuda->zeros({1, n}, DType::kF32);      // [a][b]: the pool's peak is 2 blocks here
    Tensor b = cuda->zeros({1, n}, DType::kF32);
    cuda->add({.x = a.view(), .y = ones.cview()});
    cuda->add({.x = b.view(), .y = a.cview()});       // b = 1
    a = Tensor();                                      // a hole below b
    Tensor c = cuda->zeros({2, n}, DType::kF32);      // the pool: [c][b] (3 blocks); the arena: [ ][b][c] (4)
    cuda->add({.x = c.view().rows(0, 1), .y = b.cview()});
    cuda->add({.x = out.view(), .y = c.view().rows(0, 1)});  // out += 1
  };
  const std::unique_ptr<StepGraph> graph = cuda->capture(work);  // runs `work` once (out = 1), then records it
  ASSERT_NE(graph, nullptr);
  ASSERT_TRUE(graph->replay());
  ASSERT_TRUE(graph->replay());
  std::vector<float> back(static_cast<size_t>(n), 0.0f);
  cuda->copy_to_host(out.cview(), TensorView{back.data(), DType::kF32, {1, n}, Device::kCpu});
  for (int64_t i = 0; i < n; i += 4099) EXPECT_EQ(back[static_cast<size_t>(i)], 3.0f) << i;
  EXPECT_EQ(back.back(), 3.0f);
}

TEST(CudaBackend, MemoryRoundTrips) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  EXPECT_EQ(cuda->activation_dtype(), DType::kBF16);
  {
    const Tensor none = cuda->empty({0, 5}, DType::kBF16);
    EXPECT_EQ(none.device(), Device::kCuda);
    EXPECT_EQ(none.numel(), 0);
  }
  const std::vector<float> values = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, -0.0f, 7.0f};
  const auto n = static_cast<int64_t>(values.size());
  const ConstTensorView host_values{values.data(), DType::kF32, {n}, Device::kCpu};
  Tensor dev = cuda->empty({n}, DType::kF32);
  EXPECT_EQ(dev.device(), Device::kCuda);
  cuda->copy_to_device(host_values, dev.view());
  std::vector<float> back(values.size());
  cuda->copy_to_host(dev.cview(), TensorView{back.data(), DType::kF32, {n}, Device::kCpu});
  EXPECT_EQ(back, values);

  Tensor host = Tensor::empty({n}, DType::kF32);
  std::copy(values.begin(), values.end(), host.f32());
  const Tensor narrowed = cuda->upload(std::move(host), DType::kBF16);
  EXPECT_EQ(narrowed.device(), Device::kCuda);
  EXPECT_EQ(narrowed.dtype(), DType::kBF16);
  std::vector<uint16_t> bits(values.size());
  cuda->copy_to_host(narrowed.cview(), TensorView{bits.data(), DType::kBF16, {n}, Device::kCpu});
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(bits[i], float_to_bf16(values[i])) << i;

  const Tensor zeros = cuda->zeros({3, 1000}, DType::kBF16);
  std::vector<uint16_t> zero_bits(3000, 0xffff);
  cuda->copy_to_host(zeros.cview(), TensorView{zero_bits.data(), DType::kBF16, {3, 1000}, Device::kCpu});
  EXPECT_TRUE(std::all_of(zero_bits.begin(), zero_bits.end(), [](uint16_t b) { return b == 0; }));

  EXPECT_THROW(cuda->copy_to_device(host_values, TensorView{back.data(), DType::kF32, {n}, Device::kCpu}), Error);
  EXPECT_THROW(cuda->copy_to_host(dev.cview(), TensorView{bits.data(), DType::kBF16, {n}, Device::kCpu}), Error);
  EXPECT_THROW(cuda->upload(Tensor::empty({2}, DType::kI32), DType::kF32), Error);
}

// Host tensors, mixed dtypes and unsupported dtypes are rejected before anything is queued.
TEST(CudaBackend, RejectsHostTensorsAndMixedDtypes) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  DeviceMemory memory;
  OpRunner run(memory);
  std::vector<float> host(8, 1.0f);
  const TensorView host_view{host.data(), DType::kF32, {2, 4}, Device::kCpu};
  const TensorView dev_f32 = run.upload(HostTensor::f32({2, 4}, host), Access::kReadWrite);
  const TensorView dev_bf16 = run.upload(HostTensor::bf16({2, 4}, host), Access::kReadWrite);
  const std::vector<int32_t> host_ids = {0, 1};
  const TensorView dev_i32 = run.upload(HostTensor::i32({2}, host_ids), Access::kReadWrite);
  const auto view = [](const TensorView& t, DType dtype, Shape shape) {
    return TensorView{t.data, dtype, shape, t.device};
  };
  EXPECT_THROW(cuda->add({.x = host_view, .y = host_view}), Error);
  EXPECT_THROW(cuda->add({.x = dev_f32, .y = dev_bf16}), Error);
  EXPECT_THROW(cuda->add({.x = dev_i32, .y = dev_i32}), Error);
  EXPECT_THROW(cuda->silu_mul({.gate_up = dev_bf16, .out = view(dev_f32, DType::kF32, {2, 2})}), Error);
  EXPECT_THROW(cuda->add_rms_norm({.residual = dev_bf16, .x = dev_bf16, .weight = view(dev_bf16, DType::kBF16, {4}),
                                   .out = dev_f32}),
               Error);
  EXPECT_THROW(cuda->rms_norm({.x = dev_bf16, .weight = view(host_view, DType::kF32, {4}), .out = dev_bf16}), Error);
  const ConstTensorView host_ids_view{host_ids.data(), DType::kI32, {2}, Device::kCpu};
  const TensorView dev_table = view(dev_f32, DType::kF32, {2, 4});
  EXPECT_THROW(cuda->embedding({.token_ids = host_ids_view, .table = dev_table, .out = dev_f32}), Error);
  EXPECT_THROW(cuda->embedding({.token_ids = dev_i32, .table = host_view, .out = dev_f32}), Error);
  EXPECT_THROW(cuda->gather_rows({.src = dev_table, .indices = host_ids_view, .out = dev_f32}), Error);
  EXPECT_THROW(cuda->copy_strided({.src = host_view, .dst = dev_f32}), Error);
  EXPECT_THROW(cuda->copy_strided({.src = dev_bf16, .dst = dev_f32}), Error);
  const ConstTensorView host_freq{host.data(), DType::kF32, {1}, Device::kCpu};
  EXPECT_THROW(cuda->rope({.x = host.data(), .dtype = DType::kF32, .device = Device::kCpu, .num_heads = 1,
                           .rot_dim = 2, .token_stride = 2, .head_stride = 2,
                           .positions = ConstTensorView{host_ids.data(), DType::kI32, {1}, Device::kCpu},
                           .inv_freq = host_freq}),
               Error);
  EXPECT_THROW(cuda->rope({.x = dev_f32.data, .dtype = DType::kF32, .device = Device::kCuda, .num_heads = 1,
                           .rot_dim = 2, .token_stride = 2, .head_stride = 2, .positions = dev_i32.rows(0, 1),
                           .inv_freq = host_freq}),
               Error);
  EXPECT_THROW(cuda->linear({.x = dev_bf16, .w = dev_f32, .out = view(dev_bf16, DType::kBF16, {2, 2})}), Error);
  EXPECT_TRUE(run.memory_errors().empty());
}

// The fused mla_prepare kernel against the five ops it replaces, run on the CUDA backend itself (Backend's default
// mla_prepare): bfloat16 results equal bit for bit, so the fusion leaves the model's CUDA results where they were.
TEST(CudaBackend, MlaPrepareMatchesTheUnfusedOpsBitForBit) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  for (const int64_t heads : {int64_t{16}, int64_t{128}}) {
    for (const bool interleaved : {true, false}) {
      SCOPED_TRACE(str_cat(heads, " heads, ", interleaved ? "interleaved" : "half-split"));
      const int64_t tokens = 9, decode = 3, rank = 512, rope = 64, qk = 192, ld = 576, page_size = 7, pages = 4;
      Rng rng(static_cast<uint64_t>(heads) + (interleaved ? 1 : 0));
      const HostTensor latent = HostTensor::bf16({tokens, ld}, rng.uniform(tokens * ld, -3.0f, 3.0f));
      const HostTensor q = HostTensor::bf16({tokens, heads, qk}, rng.uniform(tokens * heads * qk));
      const HostTensor q_abs = HostTensor::bf16({decode, heads, ld}, rng.uniform(decode * heads * ld));
      const HostTensor cache = HostTensor::bf16({pages, page_size, ld}, rng.uniform(pages * page_size * ld));
      const std::vector<int32_t> slots = {3, 27, 0, 14, -1, 8, 21, 6, 15};  // -1: a padding token, not written
      std::vector<int32_t> positions(static_cast<size_t>(tokens));
      for (int32_t& p : positions) p = rng.integer(0, 163839);
      const std::vector<float> norm = rng.uniform(rank, 0.5f, 1.5f), inv_freq = rope_inv_freq(rope);
      DeviceMemory memory;
      OpRunner run(*cuda, memory);
      // One set of device tensors per path, from the same host values.
      const auto make_args = [&]() -> MlaPrepareArgs {
        return {.latent = run.upload(latent, Access::kReadWrite), .q = run.upload(q, Access::kReadWrite),
                .q_abs = run.upload(q_abs, Access::kReadWrite), .cache = run.upload(cache, Access::kReadWrite),
                .slot_mapping = run.upload(HostTensor::i32({tokens}, slots)),
                .positions = run.upload(HostTensor::i32({tokens}, positions)),
                .kv_a_norm = run.upload(HostTensor::f32({rank}, norm)),
                .inv_freq = run.upload(HostTensor::f32({rope / 2}, inv_freq)), .kv_lora_rank = rank, .eps = 1e-6f,
                .attention_scaling = 1.1f, .interleaved = interleaved};
      };
      const MlaPrepareArgs fused = make_args(), composed = make_args();
      cuda->mla_prepare(fused);
      cuda->Backend::mla_prepare(composed);
      EXPECT_EQ(run.download(fused.latent).bytes, run.download(composed.latent).bytes) << "latent";
      EXPECT_EQ(run.download(fused.q).bytes, run.download(composed.q).bytes) << "q";
      EXPECT_EQ(run.download(fused.q_abs).bytes, run.download(composed.q_abs).bytes) << "q_abs";
      EXPECT_EQ(run.download(fused.cache).bytes, run.download(composed.cache).bytes) << "cache";
      for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
    }
  }
}

// A routing configuration of the moe op tests below, and its random inputs on the device: logits in [-4, 4], V3's
// bias in [-0.5, 0.5], x in [-1, 1], weights in [-0.1, 0.1]; normalized weights scaled by 2.5. args() gives the op's
// arguments with fresh outputs each call.
struct MoeTestShape {
  int64_t tokens, routed, top_k, shared, n_group, topk_group;
  ExpertScoring scoring;
  TopkMethod method;
};

struct MoeTestInputs {
  MoeTestShape sh;
  int64_t dim = 0;
  ConstTensorView logits, bias, x, w_gate_up, w_down;
  ConstTensorView router;  // [routed, dim] with `with_router`: the op computes the logits itself

  MoeTestInputs(OpRunner& run, const MoeTestShape& shape, int64_t dim_, int64_t inter, uint64_t seed,
                bool with_router = false)
      : sh(shape), dim(dim_) {
    const int64_t experts = sh.routed + sh.shared;
    Rng rng(seed);
    logits = run.upload(HostTensor::f32({sh.tokens, sh.routed}, rng.uniform(sh.tokens * sh.routed, -4.0f, 4.0f)));
    if (sh.scoring == ExpertScoring::kSigmoid) {
      bias = run.upload(HostTensor::f32({sh.routed}, rng.uniform(sh.routed, -0.5f, 0.5f)));
    }
    x = run.upload(HostTensor::bf16({sh.tokens, dim}, rng.uniform(sh.tokens * dim)));
    w_gate_up =
        run.upload(HostTensor::bf16({experts, 2 * inter, dim}, rng.uniform(experts * 2 * inter * dim, -0.1f, 0.1f)));
    w_down = run.upload(HostTensor::bf16({experts, dim, inter}, rng.uniform(experts * dim * inter, -0.1f, 0.1f)));
    if (with_router) {
      router = run.upload(HostTensor::bf16({sh.routed, dim}, rng.uniform(sh.routed * dim, -0.1f, 0.1f)));
    }
  }

  MoeArgs args(OpRunner& run) const {
    const int64_t pairs = sh.top_k + sh.shared;
    TensorView router_logits;
    if (router.data != nullptr) router_logits = run.output({sh.tokens, sh.routed}, DType::kF32);
    return {.route = {.logits = router.data != nullptr ? ConstTensorView(router_logits) : logits,
                      .correction_bias = bias,
                      .topk_ids = run.output({sh.tokens, pairs}, DType::kI32),
                      .topk_weights = run.output({sh.tokens, pairs}, DType::kF32), .scoring = sh.scoring,
                      .method = sh.method, .n_group = sh.n_group, .topk_group = sh.topk_group,
                      .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .num_shared_experts = sh.shared},
            .x = x, .w_gate_up = w_gate_up, .w_down = w_down, .out = run.output({sh.tokens, dim}, DType::kBF16),
            .router = router, .router_logits = router_logits};
  }
};

// The moe op (one alignment, made by the route kernel) against moe_route then moe_experts on the CUDA backend itself
// (Backend's default moe, which aligns the given ids again): the ids, weights and bfloat16 output equal bit for bit,
// on the decode path (1 and 5 tokens) and the grouped one (300 tokens), V3 and V2-Lite routing with shared experts.
TEST(CudaBackend, MoeMatchesRouteThenExpertsBitForBit) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const MoeTestShape shapes[] = {{1, 256, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc},
                                 {5, 256, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc},
                                 {300, 256, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc},
                                 {1, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy},
                                 {300, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy}};
  for (const MoeTestShape& sh : shapes) {
    SCOPED_TRACE(str_cat(sh.tokens, " tokens, ", sh.routed, " + ", sh.shared, " experts"));
    DeviceMemory memory;
    OpRunner run(*cuda, memory);
    const MoeTestInputs inputs(run, sh, /*dim=*/256, /*inter=*/128,
                               /*seed=*/static_cast<uint64_t>(sh.tokens * 1000 + sh.routed));
    const MoeArgs fused = inputs.args(run), composed = inputs.args(run);
    cuda->moe(fused);
    cuda->Backend::moe(composed);
    EXPECT_EQ(run.download(fused.route.topk_ids).bytes, run.download(composed.route.topk_ids).bytes) << "ids";
    EXPECT_EQ(run.download(fused.route.topk_weights).bytes, run.download(composed.route.topk_weights).bytes)
        << "weights";
    EXPECT_EQ(run.download(fused.out).bytes, run.download(composed.out).bytes) << "out";
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

// The split heuristic's choices (host code) where they were measured on an H200, v2-lite at batch 1: one 64-token
// tile a split at 1k (17 splits), four at 8k (33, not 65 of two); larger batches fill the GPU with fewer splits.
TEST(MlaDecodeSplitsHeuristic, PicksTheMeasuredCounts) {
  const auto splits = [](int32_t batch, int32_t context) {
    return cuda::mla_decode_num_splits(
        {.batch = batch, .num_heads = 16, .max_context_len = context + 1, .num_sms = 132});
  };
  EXPECT_EQ(splits(1, 1024), 17);
  EXPECT_EQ(splits(1, 8192), 33);
  EXPECT_EQ(splits(8, 1024), 9);
  EXPECT_EQ(splits(32, 8192), 4);
  EXPECT_EQ(splits(128, 8192), 1);
  EXPECT_EQ(splits(1, 32), 1);  // one tile: nothing to split
}

// The FP8 decode route (host code): DeepSeek-V3's projections at the token counts decode takes.
TEST(Fp8DecodeRoute, LargeW8A8ProjectionsLeaveTheSkinnyKernelPastTheCap) {
  constexpr int kCap = cuda::CudaTuning{}.fp8_skinny_max_tokens;
  const auto launch = [](int64_t tokens, int64_t rows, int64_t k, bool w8a8 = true) {
    return cuda::Fp8DecodeLaunch{.tokens = tokens, .code_bytes = rows * k, .all_w8a8 = w8a8,
                                 .block_scaled_k = k % 512 == 0};
  };
  for (const int64_t tokens : {int64_t{1}, int64_t{kCap}}) {
    EXPECT_TRUE(cuda::fp8_decode_takes_skinny(launch(tokens, 7168, 16384), kCap)) << tokens;  // o_proj
  }
  for (const int64_t tokens : {int64_t{kCap + 1}, int64_t{32}, int64_t{64}}) {
    EXPECT_FALSE(cuda::fp8_decode_takes_skinny(launch(tokens, 7168, 16384), kCap)) << tokens;   // o_proj
    EXPECT_FALSE(cuda::fp8_decode_takes_skinny(launch(tokens, 24576, 1536), kCap)) << tokens;   // q_b_proj
    EXPECT_TRUE(cuda::fp8_decode_takes_skinny(launch(tokens, 1536 + 576, 7168), kCap)) << tokens;  // q_a + kv_a
    EXPECT_TRUE(cuda::fp8_decode_takes_skinny(launch(tokens, 7168, 16384, false), kCap)) << tokens;  // W8A16
    EXPECT_TRUE(cuda::fp8_decode_takes_skinny(launch(tokens, 2 * 10944, 2048 + 128), kCap)) << tokens;  // odd K
  }
  // The switch moves the cap: 0 sends even one token of a large W8A8 projection to the block-scaled GEMM.
  EXPECT_FALSE(cuda::fp8_decode_takes_skinny(launch(1, 7168, 16384), 0));
  EXPECT_TRUE(cuda::fp8_decode_takes_skinny(launch(64, 7168, 16384), 64));
}

// The small-M expert kernels' token tiles at DeepSeek's shapes (host code): one tile up to 8 tokens; beyond, by the
// experts' average rows, bf16 below 4, FP8 up to 6; INT4 and FP4 four tiles past 8 tokens.
TEST(MoeSmallTokenTiles, FollowTheExpertsAverageRows) {
  using cuda::MoeWeightFormat;
  const auto v3 = [](int64_t tokens, MoeWeightFormat f) { return cuda::moe_small_token_tiles(tokens, 8, 256, f); };
  const auto v2_lite = [](int64_t tokens, MoeWeightFormat f) { return cuda::moe_small_token_tiles(tokens, 6, 64, f); };
  for (const MoeWeightFormat f : {MoeWeightFormat::kBf16, MoeWeightFormat::kFp8, MoeWeightFormat::kInt4,
                                  MoeWeightFormat::kFp4}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{8}}) {
      EXPECT_EQ(v3(tokens, f), 1) << tokens;
      EXPECT_EQ(v2_lite(tokens, f), 1) << tokens;
    }
    if (f == MoeWeightFormat::kInt4 || f == MoeWeightFormat::kFp4) {
      EXPECT_EQ(v3(9, f), 4);
      EXPECT_EQ(v2_lite(32, f), 4);
    }
  }
  EXPECT_EQ(v3(64, MoeWeightFormat::kBf16), 1);    // 2 rows an expert
  EXPECT_EQ(v3(127, MoeWeightFormat::kBf16), 1);   // just under 4
  EXPECT_EQ(v3(128, MoeWeightFormat::kBf16), 4);   // 4
  EXPECT_EQ(v2_lite(32, MoeWeightFormat::kBf16), 1);  // 3
  EXPECT_EQ(v2_lite(64, MoeWeightFormat::kBf16), 4);  // 6
  EXPECT_EQ(v3(128, MoeWeightFormat::kFp8), 1);       // 4
  EXPECT_EQ(v3(192, MoeWeightFormat::kFp8), 1);       // 6
  EXPECT_EQ(v3(193, MoeWeightFormat::kFp8), 4);
  EXPECT_EQ(v2_lite(64, MoeWeightFormat::kFp8), 1);   // 6
  EXPECT_EQ(v2_lite(65, MoeWeightFormat::kFp8), 4);
  // Under expert parallelism the rows spread over the whole model's routed experts, which the caller passes.
  EXPECT_EQ(cuda::moe_small_token_tiles(64, 8, 256, MoeWeightFormat::kBf16), 1);
}

// DEEPINFER_FP8_SKINNY_MAX_TOKENS's values (host code): unset or empty keeps the default, a count in [0, 64] sets
// it, anything else is an error that names the variable.
TEST(Fp8SkinnyMaxTokensSwitch, AcceptsCountsAndRejectsTheRest) {
  const auto max_tokens = [](const char* value) {
    const ScopedEnv env("DEEPINFER_FP8_SKINNY_MAX_TOKENS", value == nullptr ? "" : value);
    if (value == nullptr) ::unsetenv("DEEPINFER_FP8_SKINNY_MAX_TOKENS");
    return cuda::CudaTuning::from_env().fp8_skinny_max_tokens;
  };
  EXPECT_EQ(max_tokens(nullptr), cuda::CudaTuning{}.fp8_skinny_max_tokens);
  EXPECT_EQ(max_tokens(""), cuda::CudaTuning{}.fp8_skinny_max_tokens);
  EXPECT_EQ(max_tokens("0"), 0);
  EXPECT_EQ(max_tokens("16"), 16);
  EXPECT_EQ(max_tokens("64"), 64);
  for (const char* bad : {"-1", "65", "abc", "8 ", " "}) {
    try {
      max_tokens(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DEEPINFER_FP8_SKINNY_MAX_TOKENS"), std::string::npos) << e.what();
    }
  }
}

// DEEPINFER_MLA_DECODE_SPLITS's values (host code: runs without a device): unset or empty leaves the heuristic, a
// count in [1, 256] forces it, anything else is an error that names the variable.
TEST(MlaDecodeSplitsSwitch, AcceptsCountsAndRejectsTheRest) {
  const auto splits = [](const char* value) {
    const ScopedEnv env("DEEPINFER_MLA_DECODE_SPLITS", value == nullptr ? "" : value);
    if (value == nullptr) ::unsetenv("DEEPINFER_MLA_DECODE_SPLITS");
    return cuda::CudaTuning::from_env().mla_decode_splits;
  };
  EXPECT_EQ(splits(nullptr), 0);
  EXPECT_EQ(splits(""), 0);
  EXPECT_EQ(splits("1"), 1);
  EXPECT_EQ(splits("9"), 9);
  EXPECT_EQ(splits("256"), 256);
  for (const char* bad : {"0", "-3", "257", "abc", "9x", " ", "99999999999999999999"}) {
    try {
      splits(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DEEPINFER_MLA_DECODE_SPLITS"), std::string::npos) << e.what();
    }
  }
}

// The skinny kernel's split-K choice at the shapes of the cases above, on an H200's 132 SMs (host arithmetic: runs
// without a device). A split must leave every warp at least 4 K steps of 32 and keep the grid within two waves.
TEST(SkinnyGemm, SplitsKOnlyWhenTheGridIsSmall) {
  alignas(16) static const uint16_t operand[8] = {};  // never read: the choice depends on shapes only
  const auto split = [](int64_t n_out, int64_t k, cuda::SkinnyEpilogue epilogue) {
    cuda::SkinnyGemmParams p{.x = operand, .tokens = 1, .k_dim = k, .x_row_stride = k, .num_problems = 1,
                             .num_sms = 132};
    p.problems[0] = {.w = operand, .n_out = n_out, .out_row_stride = n_out, .epilogue = epilogue};
    return cuda::skinny_gemm_split(p);
  };
  using enum cuda::SkinnyEpilogue;
  EXPECT_EQ(split(64, 2048, kStore), 2);        // V2-Lite's router: 4 CTAs of 8 steps a warp -> 8 of 4
  EXPECT_EQ(split(256, 7168, kStore), 4);       // V3's router: 16 CTAs of 28 steps a warp -> 64 of 7
  EXPECT_EQ(split(64, 8192, kStore), 8);
  EXPECT_EQ(split(40, 4096, kAccumulate), 4);
  EXPECT_EQ(split(96, 2048, kSiluMul), 4);      // a gated tile has 4 warps
  EXPECT_EQ(split(3072, 2048, kStore), 1);      // q_proj: 192 CTAs
  EXPECT_EQ(split(64, 512, kStore), 1);         // 16 steps: too short
  EXPECT_EQ(split(512, 128, kStore), 1);        // K 128: 4 CTAs of 4 steps a warp, nothing to split
  EXPECT_EQ(split(16, 65536, kStore), 8);       // one CTA
  EXPECT_EQ(split(16 * 40, 65536, kStore), 4);  // 40 CTAs: 8-way would pass two waves
}

// How many K steps a warp of the skinny kernel loads at once (host arithmetic): the whole range, before the grid
// dependency wait, when it is 5..8 steps (K = 2048 at 8 warps a tile); else 4 at a time, pipelined.
TEST(SkinnyGemm, LoadsShortWarpRangesWholeBeforeTheWait) {
  alignas(16) static const uint16_t operand[8] = {};  // never read: the choice depends on shapes only
  const auto in_flight = [](std::vector<int64_t> n_outs, int64_t k, cuda::SkinnyEpilogue epilogue) {
    cuda::SkinnyGemmParams p{.x = operand, .tokens = 1, .k_dim = k, .x_row_stride = k,
                             .num_problems = static_cast<int>(n_outs.size()), .num_sms = 132};
    for (size_t i = 0; i < n_outs.size(); ++i) {
      p.problems[i] = {.w = operand, .n_out = n_outs[i], .out_row_stride = n_outs[i], .epilogue = epilogue};
    }
    return cuda::skinny_gemm_loads_in_flight(p);
  };
  using enum cuda::SkinnyEpilogue;
  EXPECT_EQ(in_flight({3072, 576}, 2048, kStore), 8);  // V2-Lite's q_proj with kv_a: 8 steps a warp
  EXPECT_EQ(in_flight({2048}, 2048, kAccumulate), 8);  // o_proj
  EXPECT_EQ(in_flight({2048}, 1408, kStore), 8);       // 44 steps over 8 warps: 5 or 6
  EXPECT_EQ(in_flight({2048}, 2816, kStore), 4);       // 11 steps: pipelined
  EXPECT_EQ(in_flight({1408}, 2048, kSiluMul), 4);     // a gated tile has 4 warps: 16 steps
  EXPECT_EQ(in_flight({64}, 2048, kStore), 4);         // split 2 ways: 4 steps, one group already
  EXPECT_EQ(in_flight({512}, 128, kStore), 4);         // 4 steps
}

// Split K adds the cluster's partial sums in rank order, so the bits do not depend on timing: the same launch twice
// and a graph replay of it give the same output (V3's router shape, 4 CTAs a cluster).
TEST(CudaBackend, SplitKSkinnyGemmIsDeterministic) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const int64_t m = 3, n = 256, k = 7168;
  Rng rng(77);
  DeviceMemory memory;
  OpRunner run(*cuda, memory);
  const TensorView x = run.upload(HostTensor::bf16({m, k}, rng.uniform(m * k)));
  const TensorView w = run.upload(HostTensor::bf16({n, k}, rng.uniform(n * k)));
  const TensorView first = run.output({m, n}, DType::kF32), second = run.output({m, n}, DType::kF32);
  const TensorView replayed = run.output({m, n}, DType::kF32);
  cuda->linear({.x = x, .w = w, .out = first});
  cuda->linear({.x = x, .w = w, .out = second});
  const std::unique_ptr<StepGraph> graph = cuda->capture([&] { cuda->linear({.x = x, .w = w, .out = replayed}); });
  ASSERT_NE(graph, nullptr);
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemset(replayed.data, 0xff, replayed.bytes()));  // NaN: only the replay writes what is compared
  CUDA_TRY(cudaDeviceSynchronize());
  ASSERT_TRUE(graph->replay());
  const std::vector<std::byte> bits = run.download(first).bytes;
  EXPECT_EQ(run.download(second).bytes, bits);
  EXPECT_EQ(run.download(replayed).bytes, bits);
  for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
}

// The moe calls `args`, in order and `rounds` times over, on one workspace without a host synchronization between
// them: run eagerly `eager_runs` times, then captured as a graph and replayed 3 times, every output poisoned with NaN
// before each run. Each call's output must come back as `expected` (its bits when run alone).
void expect_moe_calls_repeat_and_replay(Backend& cuda, OpRunner& run, std::span<const MoeArgs> args,
                                        std::span<const std::vector<std::byte>> expected, int eager_runs, int rounds) {
  const auto poison_outputs = [&] {
    CUDA_TRY(cudaDeviceSynchronize());
    for (const MoeArgs& a : args) CUDA_TRY(cudaMemset(a.out.data, 0xff, a.out.bytes()));  // bf16 NaN
    CUDA_TRY(cudaDeviceSynchronize());
  };
  const auto calls = [&] {
    for (int round = 0; round < rounds; ++round) {
      for (const MoeArgs& a : args) cuda.moe(a);
    }
  };
  const auto expect_expected = [&](const std::string& what) {
    for (size_t i = 0; i < args.size(); ++i) {
      EXPECT_EQ(run.download(args[i].out).bytes, expected[i]) << what << ", call " << i + 1;
    }
  };
  for (int again = 0; again < eager_runs; ++again) {
    poison_outputs();
    calls();
    expect_expected(str_cat("eager run ", again + 1));
  }
  const std::unique_ptr<StepGraph> graph = cuda.capture(calls);
  ASSERT_NE(graph, nullptr);
  for (int replay = 0; replay < 3; ++replay) {
    poison_outputs();
    ASSERT_TRUE(graph->replay());
    expect_expected(str_cat("replay ", replay + 1));
  }
}

// The decode MoE in one persistent launch (up to 4 tokens at a hidden size of 4096 or more) hands out its work by
// tickets and counts finished gate/up items per slot; the last CTA out resets those counters. Several runs on one
// workspace, then graph replays, each onto an output poisoned with NaN first, must give the first run's bits (a
// counter left over would make a run skip its work or read act too early). V2-Lite's routing with two shared experts
// (their gate/up items may run before the grid dependency wait) and V3's with one, at 1, 3 and 4 tokens.
TEST(CudaBackend, MoeDecodeOneLaunchRepeatsAndReplaysBitForBit) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const MoeTestShape shapes[] = {{1, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy},
                                 {3, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy},
                                 {4, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy},
                                 {1, 32, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc},
                                 {4, 32, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc}};
  for (const MoeTestShape& sh : shapes) {
    SCOPED_TRACE(str_cat(sh.tokens, " tokens, ", sh.routed, " + ", sh.shared, " experts"));
    DeviceMemory memory;
    OpRunner run(*cuda, memory);
    const MoeTestInputs inputs(run, sh, /*dim=*/4096, /*inter=*/64,
                               /*seed=*/static_cast<uint64_t>(sh.tokens * 7919 + sh.routed));
    const MoeArgs args = inputs.args(run);
    cuda->moe(args);
    const std::vector<std::byte> first = run.download(args.out).bytes;
    expect_moe_calls_repeat_and_replay(*cuda, run, std::span(&args, 1), std::span(&first, 1), /*eager_runs=*/3,
                                       /*rounds=*/1);
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

// The decode MoE keeps counters in its workspace between calls (route blocks, each column block's down CTAs for the
// fused combine), which every call must leave zero. Three calls on different inputs (so act rows or counts left by
// the call before are wrong for the next) run back to back on one workspace, twice, without a host synchronization
// between them; then as a replayed graph. Each output must equal the bits of that call run alone; the lone runs are
// checked against the CPU by the moe cases of CudaVsCpu. V2-Lite's routing at its width (2048, the router in the
// route kernel) at 1 and 5 tokens, V3's with one shared expert at 3, and a case of given logits.
TEST(CudaBackend, MoeDecodeCallsChainAndReplayBitForBit) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  struct ChainCase {
    MoeTestShape sh;
    int64_t dim;
    bool router;
  };
  const ChainCase cases[] = {
      {{1, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy}, 2048, true},
      {{5, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy}, 2048, true},
      {{3, 32, 8, 1, 8, 4, ExpertScoring::kSigmoid, TopkMethod::kNoauxTc}, 256, true},
      {{2, 64, 6, 2, 1, 1, ExpertScoring::kSoftmax, TopkMethod::kGreedy}, 512, false}};
  for (const ChainCase& c : cases) {
    SCOPED_TRACE(str_cat(c.sh.tokens, " tokens, ", c.sh.routed, " + ", c.sh.shared, " experts, width ", c.dim,
                         c.router ? ", router in the route kernel" : ""));
    DeviceMemory memory;
    OpRunner run(*cuda, memory);
    std::vector<MoeTestInputs> inputs;
    std::vector<MoeArgs> args;
    std::vector<std::vector<std::byte>> alone;
    for (uint64_t i = 0; i < 3; ++i) {
      inputs.emplace_back(run, c.sh, c.dim, /*inter=*/128, /*seed=*/900 + 10 * i + static_cast<uint64_t>(c.sh.tokens),
                          c.router);
      args.push_back(inputs.back().args(run));
      cuda->moe(args.back());
      alone.push_back(run.download(args.back().out).bytes);
    }
    expect_moe_calls_repeat_and_replay(*cuda, run, args, alone, /*eager_runs=*/1, /*rounds=*/2);
    for (const std::string& e : run.memory_errors()) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace deepinfer::op_test

#endif  // DEEPINFER_HAVE_CUDA
