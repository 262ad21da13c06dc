// Backend::mla_prepare as the composition that defines it (ops/mla.h): five ops in order. This is the CPU reference,
// and the meaning a fused kernel must reproduce.
#include "backend/backend.h"

namespace deepinfer {

void Backend::mla_prepare(const MlaPrepareArgs& a) {
  // Up front, so that bad arguments (a slot outside the cache, on the host) throw before anything is changed.
  a.validate();
  const int64_t heads = a.q.shape[1], qk_dim = a.q.shape[2];
  const int64_t rank = a.kv_lora_rank, rope_dim = a.rope_dim(), nope = qk_dim - rope_dim, latent_dim = rank + rope_dim;

  const TensorView c_kv = a.latent.columns(0, rank);                       // [T, rank], rows latent_dim apart
  rms_norm({.x = c_kv, .weight = a.kv_a_norm, .out = c_kv, .eps = a.eps, .row_stride = latent_dim});
  // Rotates the rope slices starting at `x` (rows token_stride apart, heads head_stride apart).
  const auto rotate = [&](const TensorView& x, int64_t num_heads, int64_t token_stride, int64_t head_stride) {
    rope({.x = x.data, .dtype = x.dtype, .device = x.device, .num_heads = num_heads, .rot_dim = rope_dim,
          .token_stride = token_stride, .head_stride = head_stride, .positions = a.positions,
          .inv_freq = a.inv_freq, .attention_scaling = a.attention_scaling, .interleaved = a.interleaved});
  };
  rotate(a.q.columns(nope, rope_dim), heads, heads * qk_dim, qk_dim);       // q_pe [T, H, rope]
  rotate(a.latent.columns(rank, rope_dim), 1, latent_dim, 0);              // k_pe [T, rope]
  mla_cache_write({.latent = a.latent, .cache = a.cache, .slot_mapping = a.slot_mapping, .kv_lora_rank = rank});

  const int64_t num_decode = a.num_decode_tokens();
  if (num_decode == 0) return;
  // The decode tokens' rotated q_pe, head row by head row, into the rope columns of q_abs.
  const int64_t rows = num_decode * heads;
  copy_strided({.src = a.q.rows(0, num_decode).reshaped({rows, qk_dim}).columns(nope, rope_dim),
                .dst = a.q_abs.reshaped({rows, latent_dim}).columns(rank, rope_dim),
                .src_row_stride = qk_dim, .dst_row_stride = latent_dim});
}

}  // namespace deepinfer
