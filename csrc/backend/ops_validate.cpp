// Shape checks of every op's arguments. Each throws with the op name and the offending shapes.
#include "backend/backend.h"

namespace deepinfer {
namespace {

void expect_f32(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.dtype == DType::kF32, op, ": ", name, " must be float32, got ", dtype_name(t.dtype));
}

void expect_ndim(const ConstTensorView& t, int ndim, const char* op, const char* name) {
  DI_CHECK(t.shape.ndim() == ndim, op, ": ", name, " must have ", ndim, " dims, got ", t.shape.str());
}

}  // namespace

std::string_view op_name(OpKind op) {
  switch (op) {
    case OpKind::kLinear: return "linear";
    case OpKind::kHeadLinear: return "head_linear";
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kRmsNorm: return "rms_norm";
    case OpKind::kAddRmsNorm: return "add_rms_norm";
    case OpKind::kSiluMul: return "silu_mul";
    case OpKind::kAdd: return "add";
    case OpKind::kRope: return "rope";
    case OpKind::kMlaCacheWrite: return "mla_cache_write";
    case OpKind::kMlaDecode: return "mla_decode";
    case OpKind::kMlaPrefill: return "mla_prefill";
    case OpKind::kMoeRoute: return "moe_route";
    case OpKind::kMoeExperts: return "moe_experts";
  }
  return "unknown";
}

void LinearArgs::validate() const {
  expect_ndim(x, 2, "linear", "x");
  expect_ndim(w, 2, "linear", "w");
  expect_ndim(out, 2, "linear", "out");
  DI_CHECK(x.shape[1] == w.shape[1] && out.shape[0] == x.shape[0] && out.shape[1] == w.shape[0],
           "linear: x ", x.shape.str(), " · w ", w.shape.str(), "^T does not fit out ", out.shape.str());
}

void HeadLinearArgs::validate() const {
  expect_ndim(x, 3, "head_linear", "x");
  expect_ndim(w, 3, "head_linear", "w");
  expect_ndim(out, 3, "head_linear", "out");
  DI_CHECK(x.shape[1] == w.shape[0] && x.shape[2] == w.shape[2] && out.shape[0] == x.shape[0] &&
               out.shape[1] == x.shape[1] && out.shape[2] == w.shape[1],
           "head_linear: x ", x.shape.str(), " w ", w.shape.str(), " out ", out.shape.str());
}

void EmbeddingArgs::validate() const {
  expect_ndim(table, 2, "embedding", "table");
  DI_CHECK(out.shape.ndim() == 2 && out.shape[0] == static_cast<int64_t>(token_ids.size()) &&
               out.shape[1] == table.shape[1],
           "embedding: out ", out.shape.str(), " for ", token_ids.size(), " tokens of table ", table.shape.str());
  for (int32_t id : token_ids) {
    DI_CHECK(id >= 0 && id < table.shape[0], "embedding: token id ", id, " outside [0, ", table.shape[0], ")");
  }
}

void RmsNormArgs::validate() const {
  expect_f32(x, "rms_norm", "x");
  DI_CHECK(x.shape.ndim() == 2 && out.shape == x.shape && weight.numel() == x.shape[1], "rms_norm: x ",
           x.shape.str(), " weight ", weight.shape.str(), " out ", out.shape.str());
  DI_CHECK(row_stride == 0 || row_stride >= x.shape[1], "rms_norm: row stride ", row_stride, " < row size ",
           x.shape[1]);
}

void AddRmsNormArgs::validate() const {
  DI_CHECK(residual.shape.ndim() == 2 && x.shape == residual.shape && out.shape == residual.shape &&
               weight.numel() == residual.shape[1],
           "add_rms_norm: residual ", residual.shape.str(), " x ", x.shape.str(), " out ", out.shape.str());
}

void SiluMulArgs::validate() const {
  DI_CHECK(gate_up.shape.ndim() == 2 && out.shape.ndim() == 2 && gate_up.shape[0] == out.shape[0] &&
               gate_up.shape[1] == 2 * out.shape[1],
           "silu_mul: gate_up ", gate_up.shape.str(), " out ", out.shape.str());
}

void AddArgs::validate() const {
  DI_CHECK(x.numel() == y.numel(), "add: x ", x.shape.str(), " y ", y.shape.str());
}

void RopeArgs::validate() const {
  DI_CHECK(rot_dim % 2 == 0 && static_cast<int64_t>(inv_freq.size()) == rot_dim / 2, "rope: rot_dim ", rot_dim,
           " with ", inv_freq.size(), " frequencies");
  DI_CHECK(static_cast<int64_t>(positions.size()) == num_tokens, "rope: ", positions.size(), " positions for ",
           num_tokens, " tokens");
  DI_CHECK(num_tokens == 0 || x != nullptr, "rope: null input");
}

void MlaCacheWriteArgs::validate() const {
  expect_ndim(cache, 3, "mla_cache_write", "cache");
  DI_CHECK(latent.shape.ndim() == 2 && latent.shape[1] == cache.shape[2] &&
               static_cast<int64_t>(slot_mapping.size()) == latent.shape[0],
           "mla_cache_write: latent ", latent.shape.str(), " cache ", cache.shape.str(), " slots ",
           slot_mapping.size());
  const int64_t num_slots = cache.shape[0] * cache.shape[1];
  for (int32_t slot : slot_mapping) {
    DI_CHECK(slot >= 0 && slot < num_slots, "mla_cache_write: slot ", slot, " outside [0, ", num_slots, ")");
  }
}

namespace {
// `num_rows`: rows of the query/output tensors that query_start indexes.
void validate_meta(const AttentionMetadata& m, const ConstTensorView& cache, int64_t num_rows, const char* op) {
  DI_CHECK(m.num_seqs >= 0 && static_cast<int32_t>(m.query_start.size()) >= m.num_seqs + 1 &&
               static_cast<int32_t>(m.context_lens.size()) >= m.num_seqs,
           op, ": metadata for ", m.num_seqs, " sequences is too short");
  DI_CHECK(m.page_table.size() >= static_cast<size_t>(m.num_seqs) * static_cast<size_t>(m.max_pages_per_seq), op,
           ": page table has ", m.page_table.size(), " entries for ", m.num_seqs, " sequences of ",
           m.max_pages_per_seq, " pages");
  for (int32_t s = 0; s <= m.num_seqs; ++s) {
    DI_CHECK(m.query_start[s] >= 0 && m.query_start[s] <= num_rows && (s == 0 || m.query_start[s] >= m.query_start[s - 1]),
             op, ": query_start[", s, "] = ", m.query_start[s], " is not a non-decreasing row index in [0, ",
             num_rows, "]");
  }
  const int64_t page_size = cache.shape[1];
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    const int32_t ctx = m.context_lens[s];
    DI_CHECK(m.num_queries(s) >= 0 && m.num_queries(s) <= ctx, op, ": sequence ", s, " has ", m.num_queries(s),
             " queries but a context of ", ctx);
    const int64_t pages = (ctx + page_size - 1) / page_size;
    DI_CHECK(pages <= m.max_pages_per_seq, op, ": sequence ", s, " needs ", pages, " pages, table holds ",
             m.max_pages_per_seq);
    for (int64_t p = 0; p < pages; ++p) {
      const int32_t page = m.page(s, static_cast<int32_t>(p));
      DI_CHECK(page >= 0 && page < cache.shape[0], op, ": page ", page, " out of range [0, ", cache.shape[0],
               ") for sequence ", s);
    }
  }
}
}  // namespace

void MlaDecodeArgs::validate() const {
  expect_ndim(cache, 3, "mla_decode", "cache");
  DI_CHECK(q_latent.shape.ndim() == 3 && q_latent.shape[2] == kv_lora_rank && q_pe.shape.ndim() == 3 &&
               q_pe.shape[0] == q_latent.shape[0] && q_pe.shape[1] == q_latent.shape[1] &&
               cache.shape[2] == kv_lora_rank + q_pe.shape[2] && out_latent.shape == q_latent.shape,
           "mla_decode: q_latent ", q_latent.shape.str(), " q_pe ", q_pe.shape.str(), " cache ", cache.shape.str(),
           " out ", out_latent.shape.str());
  validate_meta(meta, cache, q_latent.shape[0], "mla_decode");
  for (int32_t s = 0; s < meta.num_seqs; ++s) {
    DI_CHECK(meta.num_queries(s) == 1, "mla_decode: sequence ", s, " has ", meta.num_queries(s), " queries");
  }
}

void MlaPrefillArgs::validate() const {
  expect_ndim(cache, 3, "mla_prefill", "cache");
  const int64_t heads = q.shape[1];
  const int64_t rope_dim = cache.shape[2] - kv_lora_rank;
  DI_CHECK(q.shape.ndim() == 3 && q.shape[2] == qk_nope_head_dim + rope_dim && out.shape.ndim() == 3 &&
               out.shape[0] == q.shape[0] && out.shape[1] == heads && out.shape[2] == v_head_dim &&
               kv_b.shape.ndim() == 2 && kv_b.shape[0] == heads * (qk_nope_head_dim + v_head_dim) &&
               kv_b.shape[1] == kv_lora_rank,
           "mla_prefill: q ", q.shape.str(), " cache ", cache.shape.str(), " kv_b ", kv_b.shape.str(), " out ",
           out.shape.str());
  validate_meta(meta, cache, q.shape[0], "mla_prefill");
}

void MoeRouteArgs::validate() const {
  expect_f32(logits, "moe_route", "logits");
  const int64_t num_experts = logits.shape[1];
  DI_CHECK(logits.shape.ndim() == 2 && topk_ids.shape.ndim() == 2 && topk_ids.shape == topk_weights.shape &&
               topk_ids.shape[0] == logits.shape[0] && topk_ids.shape[1] <= num_experts,
           "moe_route: logits ", logits.shape.str(), " topk ", topk_ids.shape.str());
  DI_CHECK(topk_ids.dtype == DType::kI32, "moe_route: topk_ids must be int32");
  DI_CHECK(n_group >= 1 && num_experts % n_group == 0 && topk_group >= 1 && topk_group <= n_group,
           "moe_route: ", num_experts, " experts in ", n_group, " groups, keep ", topk_group);
  DI_CHECK(correction_bias.numel() == 0 || correction_bias.numel() == num_experts,
           "moe_route: correction bias ", correction_bias.shape.str(), " for ", num_experts, " experts");
  if (method != TopkMethod::kGreedy && n_group > 1) {
    const int64_t per_group = num_experts / n_group;
    DI_CHECK(method != TopkMethod::kNoauxTc || per_group >= 2, "moe_route: noaux_tc scores a group by its top-2 "
             "experts, but groups hold ", per_group);
    DI_CHECK(topk_ids.shape[1] <= topk_group * per_group, "moe_route: top_k ", topk_ids.shape[1],
             " exceeds the ", topk_group * per_group, " experts of the ", topk_group, " kept groups");
  }
}

void MoeExpertsArgs::validate() const {
  DI_CHECK(x.shape.ndim() == 2 && w_gate_up.shape.ndim() == 3 && w_down.shape.ndim() == 3 &&
               w_gate_up.shape[2] == x.shape[1] && w_down.shape[1] == x.shape[1] &&
               w_gate_up.shape[1] == 2 * w_down.shape[2] && w_gate_up.shape[0] == w_down.shape[0] &&
               out.shape == x.shape && topk_ids.shape == topk_weights.shape && topk_ids.shape[0] == x.shape[0],
           "moe_experts: x ", x.shape.str(), " gate_up ", w_gate_up.shape.str(), " down ", w_down.shape.str(),
           " topk ", topk_ids.shape.str(), " out ", out.shape.str());
  const int32_t* ids = static_cast<const int32_t*>(topk_ids.data);
  for (int64_t i = 0; i < topk_ids.numel(); ++i) {
    DI_CHECK(ids[i] >= 0 && ids[i] < w_down.shape[0], "moe_experts: expert id ", ids[i], " out of range");
  }
}

}  // namespace deepinfer
