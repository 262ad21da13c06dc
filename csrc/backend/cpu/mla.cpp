// MLA on the CPU: the latent cache write, the absorbed decode and the decompressing prefill, over a float32 cache or
// the FP8 layout (ops/latent_fp8.h), whose rows are widened to float32 as they are read.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/ops/latent_fp8.h"

namespace deepinfer::cpu {
namespace {

// Reads one layer of the cache, float32 or FP8, as float32 rows of rank + rope values.
class CachedRows {
 public:
  CachedRows(const ConstTensorView& cache, int64_t rank, int64_t latent_dim)
      : cache_(cache), fp8_(is_fp8_latent_cache(cache)), layout_{.rank = rank, .rope_dim = latent_dim - rank} {}

  int64_t latent_dim() const { return layout_.rank + layout_.rope_dim; }

  // Row `j` (a token index within the sequence) of sequence s's cached latents; an FP8 row is widened into
  // `scratch` (latent_dim values), which the pointer then points into.
  const float* row(const AttentionMetadata& m, int32_t s, int64_t j, std::vector<float>& scratch) const {
    const int64_t page_size = cache_.shape[1];
    const int32_t page = m.page(s, static_cast<int32_t>(j / page_size));
    const int64_t slot = static_cast<int64_t>(page) * page_size + j % page_size;
    if (!fp8_) return cache_.f32() + slot * latent_dim();
    const int64_t bytes = layout_.row_bytes();
    scratch.resize(static_cast<size_t>(latent_dim()));
    dequantize_latent_fp8_row({cache_.as<uint8_t>() + slot * bytes, static_cast<size_t>(bytes)}, layout_, scratch);
    return scratch.data();
  }

 private:
  ConstTensorView cache_;
  bool fp8_;
  LatentFp8Layout layout_;
};

void softmax_in_place(std::span<float> scores) {
  const float max_score = *std::max_element(scores.begin(), scores.end());
  double sum = 0.0;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    sum += s;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (float& s : scores) s *= inv;
}

}  // namespace

void mla_cache_write(const MlaCacheWriteArgs& a) {
  a.validate();
  expect_host(a.cache, "mla_cache_write");
  const int64_t dim = a.latent.shape[1];
  const int32_t* slots = a.slot_mapping.as<int32_t>();
  if (is_fp8_latent_cache(a.cache)) {
    const LatentFp8Layout layout{.rank = a.kv_lora_rank, .rope_dim = dim - a.kv_lora_rank};
    const auto bytes = static_cast<size_t>(layout.row_bytes());
    for (int64_t t = 0; t < a.latent.shape[0]; ++t) {
      quantize_latent_fp8_row({a.latent.f32() + t * dim, static_cast<size_t>(dim)}, layout,
                              {a.cache.as<uint8_t>() + static_cast<int64_t>(slots[t]) * bytes, bytes});
    }
    return;
  }
  for (int64_t t = 0; t < a.latent.shape[0]; ++t) {
    std::memcpy(a.cache.f32() + static_cast<int64_t>(slots[t]) * dim, a.latent.f32() + t * dim, sizeof(float) * dim);
  }
}

void mla_decode(const MlaDecodeArgs& a) {
  a.validate();
  expect_host(a.q, "mla_decode");
  const int64_t heads = a.q.shape[1], dim = a.q.shape[2], rank = a.kv_lora_rank, rope_dim = dim - rank;
  const AttentionMetadata& m = a.meta;
  const CachedRows cache(a.cache, rank, dim);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<float> scratch;
      const int64_t row = s;  // one query per sequence
      const int32_t ctx = m.context_len(s);
      const float* q_lat = a.q.f32() + (row * heads + h) * dim;
      const float* q_pe = q_lat + rank;
      std::vector<float> scores(static_cast<size_t>(ctx));
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kv = cache.row(m, s, j, scratch);
        float dot = 0.0f;
        for (int64_t i = 0; i < rank; ++i) dot += q_lat[i] * kv[i];
        for (int64_t i = 0; i < rope_dim; ++i) dot += q_pe[i] * kv[rank + i];
        scores[j] = dot * a.softmax_scale;
      }
      softmax_in_place(scores);
      float* out = a.out_latent.f32() + (row * heads + h) * rank;
      std::fill(out, out + rank, 0.0f);
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kv = cache.row(m, s, j, scratch);
        for (int64_t i = 0; i < rank; ++i) out[i] += scores[j] * kv[i];
      }
    }
  }
  if (a.projects()) head_linear(a.projection());
}

void mla_prefill(const MlaPrefillArgs& a) {
  a.validate();
  expect_host(a.q, "mla_prefill");
  const AttentionMetadata& m = a.meta;
  const int64_t heads = a.q.shape[1], rank = a.kv_lora_rank, nope = a.qk_nope_head_dim, vdim = a.v_head_dim;
  const int64_t qk_dim = a.q.shape[2], rope_dim = qk_dim - nope, kv_width = heads * (nope + vdim);
  const CachedRows cache(a.cache, rank, rank + rope_dim);
  std::vector<float> scratch;
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    const int32_t ctx = m.context_len(s);
    const int32_t num_q = m.num_queries(s);
    if (num_q == 0) continue;
    // Gather the sequence's latents, then decompress: kv[j] = c_kv[j] · kv_b^T -> [H, nope + v].
    std::vector<float> c_kv(static_cast<size_t>(ctx * rank)), k_pe(static_cast<size_t>(ctx * rope_dim));
    for (int64_t j = 0; j < ctx; ++j) {
      const float* row = cache.row(m, s, j, scratch);
      std::memcpy(&c_kv[j * rank], row, sizeof(float) * rank);
      std::memcpy(&k_pe[j * rope_dim], row + rank, sizeof(float) * rope_dim);
    }
    std::vector<float> kv(static_cast<size_t>(ctx * kv_width));
    sgemm({.m = ctx, .n = kv_width, .k = rank, .a = c_kv.data(), .lda = rank, .b = a.kv_b.f32(), .ldb = rank,
           .transpose_b = Transpose::kYes, .c = kv.data(), .ldc = kv_width});
    const int64_t first_pos = ctx - num_q;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t h = 0; h < heads; ++h) {
      for (int32_t i = 0; i < num_q; ++i) {
        const int64_t row = m.query_begin(s) + i;
        const float* q = a.q.f32() + (row * heads + h) * qk_dim;
        const int64_t visible = first_pos + i + 1;  // causal: keys [0, position]
        std::vector<float> scores(static_cast<size_t>(visible));
        for (int64_t j = 0; j < visible; ++j) {
          const float* k_nope = &kv[j * kv_width + h * (nope + vdim)];
          float dot = 0.0f;
          for (int64_t d = 0; d < nope; ++d) dot += q[d] * k_nope[d];
          for (int64_t d = 0; d < rope_dim; ++d) dot += q[nope + d] * k_pe[j * rope_dim + d];
          scores[j] = dot * a.softmax_scale;
        }
        softmax_in_place(scores);
        float* out = a.out.f32() + (row * heads + h) * vdim;
        std::fill(out, out + vdim, 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float* v = &kv[j * kv_width + h * (nope + vdim) + nope];
          for (int64_t d = 0; d < vdim; ++d) out[d] += scores[j] * v[d];
        }
      }
    }
  }
}

}  // namespace deepinfer::cpu
