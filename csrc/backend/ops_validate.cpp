// Argument checks of every op. Each throws with the op name and the offending shapes or values.
//
// Shapes, dtypes and devices are checked always. Values inside index tensors (token ids, slots, pages, query
// starts, expert ids) are checked only when the tensor is in host memory: validate() never reads device memory, so
// a device backend can run it on every call.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/ops/latent_fp8.h"

namespace deepinfer {
namespace {

bool on_host(const ConstTensorView& t) { return t.device == Device::kCpu; }

void expect_dtype(const ConstTensorView& t, DType dtype, const char* op, const char* name) {
  DI_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype));
}

void expect_ndim(const ConstTensorView& t, int ndim, const char* op, const char* name) {
  DI_CHECK(t.shape.ndim() == ndim, op, ": ", name, " must have ", ndim, " dims, got ", t.shape.str());
}

// float32 or bfloat16, the two activation types.
void expect_activation(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, op, ": ", name,
           " must be float32 or bfloat16, got ", dtype_name(t.dtype));
}

void expect_same_dtype(const ConstTensorView& a, const ConstTensorView& b, const char* op, const char* a_name,
                       const char* b_name) {
  DI_CHECK(a.dtype == b.dtype, op, ": ", a_name, " is ", dtype_name(a.dtype), " but ", b_name, " is ",
           dtype_name(b.dtype));
}

// Every non-empty tensor of an op is on one device (an empty one is never read, and may be a default view).
void expect_one_device(std::initializer_list<ConstTensorView> tensors, const char* op) {
  const ConstTensorView* first = nullptr;
  for (const ConstTensorView& t : tensors) {
    if (t.numel() == 0) continue;
    if (first == nullptr) {
      first = &t;
    } else {
      DI_CHECK(t.device == first->device, op, ": tensors on ", device_name(first->device), " and ",
               device_name(t.device));
    }
  }
}

// A 1-D int32 tensor of `count` entries.
void expect_index_array(const ConstTensorView& t, int64_t count, const char* op, const char* name) {
  expect_dtype(t, DType::kI32, op, name);
  DI_CHECK(t.shape.ndim() == 1 && t.shape[0] == count, op, ": ", name, " ", t.shape.str(), " for ", count,
           " entries");
}

// When `t` is on the host: every entry in [0, limit).
void expect_entries_below(const ConstTensorView& t, int64_t limit, const char* op, const char* what) {
  if (!on_host(t)) return;
  const int32_t* v = t.as<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    DI_CHECK(v[i] >= 0 && v[i] < limit, op, ": ", what, " ", v[i], " at [", i, "] outside [0, ", limit, ")");
  }
}

// Row stride 0 means dense; otherwise at least the row size.
void expect_row_stride(int64_t stride, int64_t row, const char* op, const char* name) {
  DI_CHECK(stride == 0 || stride >= row, op, ": ", name, " ", stride, " < row size ", row);
}

// A linear weight: x's dtype, or block-scaled FP8 with float32 scales of its block grid on the same device.
// A layer of the latent cache for rows of `latent_dim` values whose first `rank` are c_kv: [pages, page_size, latent_dim]
// in `activations`' dtype, or [pages, page_size, row bytes] in the FP8 layout (latent_fp8.h).
void expect_latent_cache(const ConstTensorView& cache, const ConstTensorView& activations, const char* activations_name,
                         int64_t rank, int64_t latent_dim, const char* op) {
  expect_ndim(cache, 3, op, "cache");
  if (is_fp8_latent_cache(cache)) {
    DI_CHECK(rank > 0 && rank <= latent_dim, op, ": an FP8 latent cache needs kv_lora_rank in (0, ", latent_dim,
             "], got ", rank);
    const LatentFp8Layout layout{.rank = rank, .rope_dim = latent_dim - rank};
    DI_CHECK(cache.shape[2] == layout.row_bytes(), op, ": FP8 cache ", cache.shape.str(), " for rows of ", rank,
             " + ", latent_dim - rank, " values needs ", layout.row_bytes(), " bytes a row");
    return;
  }
  DI_CHECK(cache.shape[2] == latent_dim, op, ": cache ", cache.shape.str(), " for latent rows of ", latent_dim);
  expect_same_dtype(activations, cache, op, activations_name, "cache");
}

void expect_weight(const WeightView& w, const ConstTensorView& x, const char* op, const char* name) {
  if (w.is_packed4()) {
    const char* const kind = w.is_fp4() ? "FP4" : "INT4";
    const int64_t k = w.shape[w.shape.ndim() - 1], groups = w.scale_inv.shape[w.scale_inv.shape.ndim() - 1];
    DI_CHECK(k % 8 == 0 && groups > 0 && k % groups == 0 && (k / groups) % 8 == 0, op, ": ", kind, " ", name, " ",
             w.shape.str(), " needs K a multiple of 8 and groups of a multiple of 8 inputs; it has ", groups,
             " groups a row");
    const Shape scales = w.shape.with_dim(-1, groups);
    DI_CHECK(w.scale_inv.dtype == DType::kF32 && w.scale_inv.shape == scales, op, ": ", kind, " ", name, " ",
             w.shape.str(), " needs float32 group scales ", scales.str(), ", got ", dtype_name(w.scale_inv.dtype),
             " ", w.scale_inv.shape.str());
    DI_CHECK(!w.is_fp4() || w.symmetric(), op, ": FP4 ", name, " ", w.shape.str(), " has zero points; e2m1 codes ",
             "have none");
    if (!w.symmetric()) {
      const Shape zeros = w.shape.with_dim(-1, int4_zero_words(groups));
      DI_CHECK(w.zeros.dtype == DType::kI32 && w.zeros.shape == zeros, op, ": INT4 ", name, " ", w.shape.str(),
               " needs int32 packed zero points ", zeros.str(), ", got ", dtype_name(w.zeros.dtype), " ",
               w.zeros.shape.str());
    }
    DI_CHECK(w.scale_inv.device == w.device && (w.symmetric() || w.zeros.device == w.device), op, ": ", name,
             " and its scales are on different devices");
    DI_CHECK(x.dtype == DType::kBF16 || x.dtype == DType::kF32, op, ": with an ", kind, " ", name,
             " x must be bfloat16 or float32, got ", dtype_name(x.dtype));
    return;
  }
  if (!w.is_fp8()) {
    expect_same_dtype(x, w, op, "x", name);
    return;
  }
  const Shape grid = fp8_scale_shape(w.shape);
  DI_CHECK(w.scale_inv.dtype == DType::kF32 && w.scale_inv.shape == grid, op, ": FP8 ", name, " ", w.shape.str(),
           " needs float32 scale_inv ", grid.str(), " (one per ", kFp8Block, "x", kFp8Block, " block), got ",
           dtype_name(w.scale_inv.dtype), " ", w.scale_inv.shape.str());
  DI_CHECK(w.scale_inv.device == w.device, op, ": ", name, " and its scales are on different devices");
}

// An expert shard that is not all(): its routed range inside [0, num_routed), and weights of the experts it holds.
void expect_shard(const ExpertShard& shard, int64_t num_shared, int64_t weight_experts, const char* op) {
  DI_CHECK(shard.num_routed >= 1 && shard.num_routed + num_shared <= std::numeric_limits<int32_t>::max() &&
               shard.first_routed >= 0 && shard.first_routed + shard.num_local_routed <= shard.num_routed,
           op, ": shard of routed experts [", shard.first_routed, ", ", shard.first_routed + shard.num_local_routed,
           ") outside [0, ", shard.num_routed, ")");
  DI_CHECK(weight_experts == shard.num_held(num_shared), op, ": the weights hold ", weight_experts,
           " experts, but the shard holds ", shard.num_local_routed, " routed ones",
           shard.holds_shared ? str_cat(" and the ", num_shared, " shared") : std::string(" and no shared one"));
}

}  // namespace

std::string_view op_name(OpKind op) {
  switch (op) {
    case OpKind::kLinear: return "linear";
    case OpKind::kLinearSiluMul: return "linear_silu_mul";
    case OpKind::kMultiLinear: return "multi_linear";
    case OpKind::kHeadLinear: return "head_linear";
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kGatherRows: return "gather_rows";
    case OpKind::kCopyStrided: return "copy_strided";
    case OpKind::kRmsNorm: return "rms_norm";
    case OpKind::kAddRmsNorm: return "add_rms_norm";
    case OpKind::kSiluMul: return "silu_mul";
    case OpKind::kAdd: return "add";
    case OpKind::kRope: return "rope";
    case OpKind::kMlaCacheWrite: return "mla_cache_write";
    case OpKind::kMlaPrepare: return "mla_prepare";
    case OpKind::kMlaDecode: return "mla_decode";
    case OpKind::kMlaPrefill: return "mla_prefill";
    case OpKind::kMoeRoute: return "moe_route";
    case OpKind::kMoeExperts: return "moe_experts";
    case OpKind::kMoe: return "moe";
    case OpKind::kSample: return "sample";
  }
  return "unknown";
}

void LinearArgs::validate() const {
  expect_ndim(x, 2, "linear", "x");
  expect_ndim(w, 2, "linear", "w");
  expect_ndim(out, 2, "linear", "out");
  DI_CHECK(x.shape[1] == w.shape[1] && out.shape[0] == x.shape[0] && out.shape[1] == w.shape[0],
           "linear: x ", x.shape.str(), " · w ", w.shape.str(), "^T does not fit out ", out.shape.str());
  expect_activation(x, "linear", "x");
  expect_weight(w, x, "linear", "w");
  // out is x's dtype, or float32 (router and vocabulary logits keep full precision from bf16 activations).
  if (out.dtype != DType::kF32) expect_same_dtype(x, out, "linear", "x", "out");
  expect_one_device({x, w, out}, "linear");
}

void LinearSiluMulArgs::validate() const {
  expect_ndim(x, 2, "linear_silu_mul", "x");
  expect_ndim(w, 2, "linear_silu_mul", "w");
  expect_ndim(out, 2, "linear_silu_mul", "out");
  DI_CHECK(x.shape[1] == w.shape[1] && w.shape[0] % 2 == 0 && out.shape[0] == x.shape[0] &&
               out.shape[1] == w.shape[0] / 2,
           "linear_silu_mul: x ", x.shape.str(), " · w ", w.shape.str(), "^T (gate rows, then as many up rows) "
           "does not fit out ", out.shape.str());
  expect_activation(x, "linear_silu_mul", "x");
  expect_weight(w, x, "linear_silu_mul", "w");
  expect_same_dtype(x, out, "linear_silu_mul", "x", "out");
  expect_one_device({x, w, out}, "linear_silu_mul");
}

void MultiLinearArgs::validate() const {
  DI_CHECK(!targets.empty() && targets.size() <= kMultiLinearMaxTargets, "multi_linear: 1 to ",
           static_cast<int64_t>(kMultiLinearMaxTargets), " targets, got ", static_cast<int64_t>(targets.size()));
  for (const LinearTarget& t : targets) {
    if (t.silu_mul) {
      LinearSiluMulArgs{.x = x, .w = t.w, .out = t.out}.validate();
    } else {
      LinearArgs{.x = x, .w = t.w, .out = t.out}.validate();
    }
  }
}

void HeadLinearArgs::validate() const {
  expect_ndim(x, 3, "head_linear", "x");
  expect_ndim(w, 3, "head_linear", "w");
  expect_ndim(out, 3, "head_linear", "out");
  DI_CHECK(x.shape[1] == w.shape[0] && x.shape[2] == w.shape[2] && out.shape[0] == x.shape[0] &&
               out.shape[1] == x.shape[1] && out.shape[2] == w.shape[1],
           "head_linear: x ", x.shape.str(), " w ", w.shape.str(), " out ", out.shape.str());
  expect_row_stride(x_head_stride, x.shape[2], "head_linear", "x head stride");
  expect_row_stride(out_head_stride, out.shape[2], "head_linear", "out head stride");
  expect_activation(x, "head_linear", "x");
  expect_same_dtype(x, out, "head_linear", "x", "out");
  expect_one_device({x, w, out}, "head_linear");
}

namespace {
// out[i] = src[indices[i]]: what embedding and gather_rows both check.
void validate_row_gather(const ConstTensorView& src, const ConstTensorView& indices, const ConstTensorView& out,
                         const char* op, const char* src_name, const char* indices_name, const char* index_name) {
  expect_ndim(src, 2, op, src_name);
  DI_CHECK(out.shape.ndim() == 2 && out.shape[1] == src.shape[1], op, ": out ", out.shape.str(), " for ", src_name,
           " ", src.shape.str());
  expect_index_array(indices, out.shape[0], op, indices_name);
  expect_same_dtype(src, out, op, src_name, "out");
  expect_one_device({src, indices, out}, op);
  expect_entries_below(indices, src.shape[0], op, index_name);
}
}  // namespace

void EmbeddingArgs::validate() const {
  if (first_row == 0 && (vocab_size == 0 || vocab_size == table.shape[0])) {
    validate_row_gather(table, token_ids, out, "embedding", "table", "token_ids", "token id");
    return;
  }
  expect_ndim(table, 2, "embedding", "table");
  DI_CHECK(first_row >= 0 && first_row + table.shape[0] <= vocab_size, "embedding: a table of rows [", first_row,
           ", ", first_row + table.shape[0], ") of a vocabulary of ", vocab_size);
  DI_CHECK(out.shape.ndim() == 2 && out.shape[1] == table.shape[1], "embedding: out ", out.shape.str(), " for table ",
           table.shape.str());
  expect_index_array(token_ids, out.shape[0], "embedding", "token_ids");
  expect_same_dtype(table, out, "embedding", "table", "out");
  expect_one_device({table, token_ids, out}, "embedding");
  expect_entries_below(token_ids, vocab_size, "embedding", "token id");
}

void GatherRowsArgs::validate() const {
  validate_row_gather(src, indices, out, "gather_rows", "src", "indices", "index");
}

void CopyStridedArgs::validate() const {
  expect_ndim(src, 2, "copy_strided", "src");
  DI_CHECK(dst.shape == src.shape, "copy_strided: src ", src.shape.str(), " dst ", dst.shape.str());
  expect_row_stride(src_row_stride, src.shape[1], "copy_strided", "src row stride");
  expect_row_stride(dst_row_stride, dst.shape[1], "copy_strided", "dst row stride");
  expect_same_dtype(src, dst, "copy_strided", "src", "dst");
  expect_one_device({src, dst}, "copy_strided");
}

void RmsNormArgs::validate() const {
  DI_CHECK(x.shape.ndim() == 2 && out.shape == x.shape && weight.numel() == x.shape[1], "rms_norm: x ",
           x.shape.str(), " weight ", weight.shape.str(), " out ", out.shape.str());
  expect_row_stride(row_stride, x.shape[1], "rms_norm", "row stride");
  expect_activation(x, "rms_norm", "x");
  expect_same_dtype(x, out, "rms_norm", "x", "out");
  expect_dtype(weight, DType::kF32, "rms_norm", "weight");
  expect_one_device({x, weight, out}, "rms_norm");
}

void AddRmsNormArgs::validate() const {
  DI_CHECK(residual.shape.ndim() == 2 && x.shape == residual.shape && out.shape == residual.shape &&
               weight.numel() == residual.shape[1],
           "add_rms_norm: residual ", residual.shape.str(), " x ", x.shape.str(), " out ", out.shape.str());
  expect_activation(residual, "add_rms_norm", "residual");
  expect_same_dtype(residual, x, "add_rms_norm", "residual", "x");
  expect_same_dtype(residual, out, "add_rms_norm", "residual", "out");
  expect_dtype(weight, DType::kF32, "add_rms_norm", "weight");
  expect_one_device({residual, x, weight, out}, "add_rms_norm");
}

void SiluMulArgs::validate() const {
  DI_CHECK(gate_up.shape.ndim() == 2 && out.shape.ndim() == 2 && gate_up.shape[0] == out.shape[0] &&
               gate_up.shape[1] == 2 * out.shape[1],
           "silu_mul: gate_up ", gate_up.shape.str(), " out ", out.shape.str());
  expect_activation(gate_up, "silu_mul", "gate_up");
  expect_same_dtype(gate_up, out, "silu_mul", "gate_up", "out");
  expect_one_device({gate_up, out}, "silu_mul");
}

void AddArgs::validate() const {
  DI_CHECK(x.numel() == y.numel(), "add: x ", x.shape.str(), " y ", y.shape.str());
  expect_activation(x, "add", "x");
  expect_same_dtype(x, y, "add", "x", "y");
  expect_one_device({x, y}, "add");
}

void RopeArgs::validate() const {
  DI_CHECK(rot_dim >= 0 && rot_dim % 2 == 0 && num_heads >= 0, "rope: rot_dim ", rot_dim, " (must be even), ",
           num_heads, " heads");
  expect_dtype(inv_freq, DType::kF32, "rope", "inv_freq");
  DI_CHECK(inv_freq.shape.ndim() == 1 && inv_freq.shape[0] == rot_dim / 2, "rope: inv_freq ",
           inv_freq.shape.str(), " for rot_dim ", rot_dim);
  expect_dtype(positions, DType::kI32, "rope", "positions");
  expect_ndim(positions, 1, "rope", "positions");
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "rope: x must be float32 or bfloat16, got ",
           dtype_name(dtype));
  DI_CHECK(num_tokens() == 0 || num_heads == 0 || rot_dim == 0 || x != nullptr, "rope: null input");
  DI_CHECK((positions.numel() == 0 || positions.device == device) &&
               (inv_freq.numel() == 0 || inv_freq.device == device),
           "rope: x is on ", device_name(device), ", positions on ", device_name(positions.device),
           ", inv_freq on ", device_name(inv_freq.device));
}

void MlaCacheWriteArgs::validate() const {
  expect_ndim(latent, 2, "mla_cache_write", "latent");
  expect_latent_cache(cache, latent, "latent", kv_lora_rank, latent.shape[1], "mla_cache_write");
  expect_index_array(slot_mapping, latent.shape[0], "mla_cache_write", "slot_mapping");
  expect_one_device({latent, cache, slot_mapping}, "mla_cache_write");
  expect_entries_below(slot_mapping, cache.shape[0] * cache.shape[1], "mla_cache_write", "slot");
}

void MlaPrepareArgs::validate() const {
  constexpr const char* kOp = "mla_prepare";
  expect_ndim(latent, 2, kOp, "latent");
  expect_ndim(q, 3, kOp, "q");
  expect_ndim(cache, 3, kOp, "cache");
  const int64_t tokens = num_tokens(), heads = q.shape[1], latent_dim = latent.shape[1], rope = rope_dim();
  DI_CHECK(kv_lora_rank >= 0 && rope >= 0 && rope % 2 == 0, kOp, ": latent ", latent.shape.str(), " with kv_lora_rank ",
           kv_lora_rank, " leaves ", rope, " rope columns (must be even and >= 0)");
  DI_CHECK(q.shape[0] == tokens && q.shape[2] >= rope, kOp, ": latent ", latent.shape.str(), " q ", q.shape.str(),
           ": q needs ", tokens, " tokens of at least ", rope, " rope columns");
  expect_latent_cache(cache, latent, "latent", kv_lora_rank, latent_dim, kOp);
  // No decode: q_abs is a default view (or any empty one that is not 3-D).
  DI_CHECK(q_abs.shape.ndim() == 3 || q_abs.numel() == 0, kOp, ": q_abs ", q_abs.shape.str(),
           " must be [Td, H, rank + rope] or empty");
  if (q_abs.shape.ndim() == 3) {
    DI_CHECK(q_abs.shape[0] <= tokens && q_abs.shape[1] == heads && q_abs.shape[2] == latent_dim, kOp, ": q_abs ",
             q_abs.shape.str(), " for ", tokens, " tokens of ", heads, " heads and latent rows of ", latent_dim);
    if (q_abs.numel() > 0) expect_same_dtype(latent, q_abs, kOp, "latent", "q_abs");
  }
  expect_index_array(slot_mapping, tokens, kOp, "slot_mapping");
  expect_index_array(positions, tokens, kOp, "positions");
  expect_dtype(kv_a_norm, DType::kF32, kOp, "kv_a_norm");
  DI_CHECK(kv_a_norm.shape.ndim() == 1 && kv_a_norm.shape[0] == kv_lora_rank, kOp, ": kv_a_norm ",
           kv_a_norm.shape.str(), " for kv_lora_rank ", kv_lora_rank);
  expect_dtype(inv_freq, DType::kF32, kOp, "inv_freq");
  DI_CHECK(inv_freq.shape.ndim() == 1 && inv_freq.shape[0] == rope / 2, kOp, ": inv_freq ", inv_freq.shape.str(),
           " for ", rope, " rope columns");
  expect_activation(latent, kOp, "latent");
  expect_same_dtype(latent, q, kOp, "latent", "q");
  expect_one_device({latent, q, q_abs, cache, slot_mapping, positions, kv_a_norm, inv_freq}, kOp);
  expect_entries_below(slot_mapping, cache.shape[0] * cache.shape[1], kOp, "slot");
}

namespace {
// `num_rows`: rows of the query/output tensors that query_start indexes.
void validate_meta(const AttentionMetadata& m, const ConstTensorView& cache, int64_t num_rows, const char* op) {
  DI_CHECK(m.num_seqs >= 0 && m.max_pages_per_seq >= 0 && m.max_context_len >= 0, op, ": ", m.num_seqs,
           " sequences, ", m.max_pages_per_seq, " pages per sequence, longest context ", m.max_context_len);
  expect_index_array(m.query_start, m.num_seqs + 1, op, "query_start");
  expect_index_array(m.context_lens, m.num_seqs, op, "context_lens");
  expect_dtype(m.page_table, DType::kI32, op, "page_table");
  DI_CHECK(m.page_table.shape.ndim() == 2 && m.page_table.shape[0] == m.num_seqs &&
               m.page_table.shape[1] == m.max_pages_per_seq,
           op, ": page table ", m.page_table.shape.str(), " for ", m.num_seqs, " sequences of ", m.max_pages_per_seq,
           " pages");
  expect_one_device({cache, m.query_start, m.context_lens, m.page_table}, op);
  if (!on_host(m.query_start) || !on_host(m.context_lens) || !on_host(m.page_table)) return;

  for (int32_t s = 0; s <= m.num_seqs; ++s) {
    const int32_t begin = m.query_begin(s);
    DI_CHECK(begin >= 0 && begin <= num_rows && (s == 0 || begin >= m.query_begin(s - 1)), op, ": query_start[",
             s, "] = ", begin, " is not a non-decreasing row index in [0, ", num_rows, "]");
  }
  const int64_t page_size = cache.shape[1];
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    const int32_t ctx = m.context_len(s);
    DI_CHECK(m.num_queries(s) <= ctx && ctx <= m.max_context_len, op, ": sequence ", s, " has ", m.num_queries(s),
             " queries and a context of ", ctx, " (longest context ", m.max_context_len, ")");
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
  expect_ndim(q, 3, "mla_decode", "q");
  DI_CHECK(q.shape[0] == meta.num_seqs && kv_lora_rank >= 0 && kv_lora_rank <= q.shape[2] &&
               out_latent.shape.ndim() == 3 && out_latent.shape[0] == q.shape[0] &&
               out_latent.shape[1] == q.shape[1] && out_latent.shape[2] == kv_lora_rank,
           "mla_decode: q ", q.shape.str(), " for ", meta.num_seqs, " sequences, cache ", cache.shape.str(),
           " kv_lora_rank ", kv_lora_rank, " out ", out_latent.shape.str());
  expect_latent_cache(cache, q, "q", kv_lora_rank, q.shape[2], "mla_decode");
  expect_same_dtype(q, out_latent, "mla_decode", "q", "out_latent");
  expect_one_device({q, cache, out_latent}, "mla_decode");
  DI_CHECK(projects() == (out.data != nullptr), "mla_decode: w_uv ", w_uv.shape.str(), " and out ", out.shape.str(),
           " come together (the value projection) or not at all");
  if (projects()) {
    projection().validate();
    expect_one_device({q, w_uv, out}, "mla_decode");
  }
  // Row s of q is sequence s's query; query_start may carry an offset (the decode sequences of a larger batch).
  const bool host_starts = on_host(meta.query_start) && meta.query_start.numel() > 0;
  const int64_t first_row = host_starts ? meta.query_begin(0) : 0;
  validate_meta(meta, cache, first_row + meta.num_seqs, "mla_decode");
  if (!host_starts) return;
  for (int32_t s = 0; s < meta.num_seqs; ++s) {
    DI_CHECK(meta.num_queries(s) == 1, "mla_decode: sequence ", s, " has ", meta.num_queries(s), " queries");
  }
}

void MlaPrefillArgs::validate() const {
  expect_ndim(q, 3, "mla_prefill", "q");
  const int64_t heads = q.shape[1];
  const int64_t rope_dim = q.shape[2] - qk_nope_head_dim;
  DI_CHECK(rope_dim >= 0 && kv_lora_rank >= 0, "mla_prefill: q ", q.shape.str(), " with ", qk_nope_head_dim,
           " nope columns, kv_lora_rank ", kv_lora_rank);
  expect_latent_cache(cache, q, "q", kv_lora_rank, kv_lora_rank + rope_dim, "mla_prefill");
  DI_CHECK(q.shape[2] == qk_nope_head_dim + rope_dim && out.shape.ndim() == 3 && out.shape[0] == q.shape[0] &&
               out.shape[1] == heads && out.shape[2] == v_head_dim && kv_b.shape.ndim() == 2 &&
               kv_b.shape[0] == heads * (qk_nope_head_dim + v_head_dim) && kv_b.shape[1] == kv_lora_rank,
           "mla_prefill: q ", q.shape.str(), " cache ", cache.shape.str(), " kv_b ", kv_b.shape.str(), " out ",
           out.shape.str());
  expect_same_dtype(q, out, "mla_prefill", "q", "out");
  expect_one_device({q, cache, kv_b, out}, "mla_prefill");
  validate_meta(meta, cache, q.shape[0], "mla_prefill");
}

void MoeRouteArgs::validate() const {
  expect_dtype(logits, DType::kF32, "moe_route", "logits");
  expect_ndim(logits, 2, "moe_route", "logits");
  const int64_t num_experts = logits.shape[1];
  DI_CHECK(num_shared_experts >= 0 && num_experts + num_shared_experts <= std::numeric_limits<int32_t>::max(),
           "moe_route: ", num_shared_experts, " shared experts after ", num_experts, " routed ones");
  DI_CHECK(topk_ids.shape.ndim() == 2 && topk_ids.shape == topk_weights.shape &&
               topk_ids.shape[0] == logits.shape[0] && topk_ids.shape[1] >= num_shared_experts &&
               topk_ids.shape[1] - num_shared_experts <= num_experts,
           "moe_route: logits ", logits.shape.str(), " topk ", topk_ids.shape.str(), " (top_k routed experts of ",
           num_experts, ", then ", num_shared_experts, " shared)");
  expect_dtype(topk_ids, DType::kI32, "moe_route", "topk_ids");
  expect_dtype(topk_weights, DType::kF32, "moe_route", "topk_weights");
  DI_CHECK(n_group >= 1 && num_experts % n_group == 0 && topk_group >= 1 && topk_group <= n_group,
           "moe_route: ", num_experts, " experts in ", n_group, " groups, keep ", topk_group);
  DI_CHECK(correction_bias.numel() == 0 || correction_bias.numel() == num_experts,
           "moe_route: correction bias ", correction_bias.shape.str(), " for ", num_experts, " experts");
  expect_one_device({logits, correction_bias, topk_ids, topk_weights}, "moe_route");
  if (method != TopkMethod::kGreedy && n_group > 1) {
    const int64_t per_group = num_experts / n_group, top_k = topk_ids.shape[1] - num_shared_experts;
    DI_CHECK(method != TopkMethod::kNoauxTc || per_group >= 2, "moe_route: noaux_tc scores a group by its top-2 "
             "experts, but groups hold ", per_group);
    DI_CHECK(top_k <= topk_group * per_group, "moe_route: top_k ", top_k, " exceeds the ", topk_group * per_group,
             " experts of the ", topk_group, " kept groups");
  }
}

void MoeExpertsArgs::validate() const {
  DI_CHECK(x.shape.ndim() == 2 && w_gate_up.shape.ndim() == 3 && w_down.shape.ndim() == 3 &&
               w_gate_up.shape[2] == x.shape[1] && w_down.shape[1] == x.shape[1] &&
               w_gate_up.shape[1] == 2 * w_down.shape[2] && w_gate_up.shape[0] == w_down.shape[0] &&
               out.shape == x.shape && topk_ids.shape == topk_weights.shape && topk_ids.shape.ndim() == 2 &&
               topk_ids.shape[0] == x.shape[0],
           "moe_experts: x ", x.shape.str(), " gate_up ", w_gate_up.shape.str(), " down ", w_down.shape.str(),
           " topk ", topk_ids.shape.str(), " out ", out.shape.str());
  expect_dtype(topk_ids, DType::kI32, "moe_experts", "topk_ids");
  expect_dtype(topk_weights, DType::kF32, "moe_experts", "topk_weights");
  expect_activation(x, "moe_experts", "x");
  expect_weight(w_gate_up, x, "moe_experts", "w_gate_up");
  expect_weight(w_down, x, "moe_experts", "w_down");
  expect_same_dtype(x, out, "moe_experts", "x", "out");
  expect_one_device({x, w_gate_up, w_down, topk_ids, topk_weights, out}, "moe_experts");
  if (shard.all()) {
    expect_entries_below(topk_ids, w_down.shape[0], "moe_experts", "expert id");
    return;
  }
  DI_CHECK(num_shared_experts >= 0, "moe_experts: ", num_shared_experts, " shared experts");
  expect_shard(shard, num_shared_experts, w_gate_up.shape[0], "moe_experts");
  expect_entries_below(topk_ids, shard.num_routed + num_shared_experts, "moe_experts", "global expert id");
}

void MoeArgs::validate() const {
  route.validate();
  // The ids are outputs here: only the shapes of the experts half can be checked before routing.
  DI_CHECK(x.shape.ndim() == 2 && w_gate_up.shape.ndim() == 3 && w_down.shape.ndim() == 3 &&
               x.shape[0] == route.logits.shape[0],
           "moe: x ", x.shape.str(), " logits ", route.logits.shape.str(), " gate_up ", w_gate_up.shape.str());
  if (shard.all()) {
    DI_CHECK(w_gate_up.shape[0] == route.logits.shape[1] + route.num_shared_experts, "moe: gate_up ",
             w_gate_up.shape.str(), " (the experts' weights hold the ", route.logits.shape[1],
             " routed experts, then ", route.num_shared_experts, " shared)");
  } else {
    DI_CHECK(shard.num_routed == route.logits.shape[1], "moe: the shard is of ", shard.num_routed,
             " routed experts, but routing chooses among ", route.logits.shape[1], " (logits ",
             route.logits.shape.str(), ")");
    expect_shard(shard, route.num_shared_experts, w_gate_up.shape[0], "moe");
  }
  const MoeExpertsArgs e = experts();
  DI_CHECK(w_gate_up.shape[2] == x.shape[1] && w_down.shape[1] == x.shape[1] &&
               w_gate_up.shape[1] == 2 * w_down.shape[2] && w_gate_up.shape[0] == w_down.shape[0] &&
               out.shape == x.shape,
           "moe: x ", x.shape.str(), " gate_up ", w_gate_up.shape.str(), " down ", w_down.shape.str(), " out ",
           out.shape.str());
  expect_activation(x, "moe", "x");
  expect_weight(w_gate_up, x, "moe", "w_gate_up");
  expect_weight(w_down, x, "moe", "w_down");
  expect_same_dtype(x, out, "moe", "x", "out");
  expect_one_device({x, w_gate_up, w_down, e.topk_ids, out}, "moe");
  if (router.data == nullptr) {
    DI_CHECK(router_logits.data == nullptr, "moe: router_logits ", router_logits.shape.str(),
             " given without a router (they are the router's output)");
    return;
  }
  DI_CHECK(router.shape.ndim() == 2 && router.shape[0] == route.logits.shape[1] && router.shape[1] == x.shape[1],
           "moe: router ", router.shape.str(), " for x ", x.shape.str(), " and ", route.logits.shape[1],
           " routed experts");
  expect_same_dtype(x, router, "moe", "x", "router");
  DI_CHECK(router_logits.data == route.logits.data && router_logits.shape == route.logits.shape &&
               router_logits.dtype == DType::kF32,
           "moe: with a router, router_logits (", router_logits.shape.str(), ") must be the float32 buffer that "
           "route.logits (", route.logits.shape.str(), ") views: the op writes the logits there, then routes on them");
  expect_one_device({x, router, router_logits}, "moe");
}

}  // namespace deepinfer

namespace deepinfer {
namespace {

// One row's parameters (host memory): ranges inside their arrays, penalty tokens distinct within the row.
void validate_sampling_row(const SamplingRow& p, int64_t row, int64_t vocab, int64_t num_penalties,
                           int64_t num_masked, int64_t num_allowed_rows, const int32_t* penalty_tokens,
                           std::vector<uint8_t>& seen) {
  DI_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "sample: row ", row, " temperature ",
           p.temperature, " must be finite and >= 0");
  DI_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "sample: row ", row, " top_p ", p.top_p, " outside (0, 1]");
  DI_CHECK(p.top_k >= 0, "sample: row ", row, " top_k ", p.top_k, " must be >= 0 (0 = off)");
  DI_CHECK(p.log_min_p <= 0.0f, "sample: row ", row, " log_min_p ", p.log_min_p,
           " must be <= 0 (log of min_p in [0, 1]; -inf = off)");
  DI_CHECK(p.num_logprobs >= -1 && p.num_logprobs <= kMaxTopLogprobs, "sample: row ", row, " num_logprobs ",
           p.num_logprobs, " outside [-1, ", kMaxTopLogprobs, "]");
  DI_CHECK(p.score_token >= -1 && p.score_token < vocab, "sample: row ", row, " score_token ", p.score_token,
           " outside [-1, ", vocab, ")");
  DI_CHECK(p.score_token < 0 || (p.temperature == 0.0f && p.penalty_begin == p.penalty_end &&
                                 p.mask_begin == p.mask_end),
           "sample: row ", row, " scores token ", p.score_token, " but has a temperature, penalties or masks");
  DI_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f, "sample: row ", row,
           " repetition_penalty ", p.repetition_penalty, " must be finite and > 0");
  DI_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty), "sample: row ", row,
           " presence_penalty ", p.presence_penalty, " and frequency_penalty ", p.frequency_penalty,
           " must be finite");
  DI_CHECK(p.penalty_begin >= 0 && p.penalty_begin <= p.penalty_end && p.penalty_end <= num_penalties,
           "sample: row ", row, " penalty range [", p.penalty_begin, ", ", p.penalty_end, ") outside the ",
           num_penalties, " penalty tokens");
  DI_CHECK(p.mask_begin >= 0 && p.mask_begin <= p.mask_end && p.mask_end <= num_masked, "sample: row ", row,
           " mask range [", p.mask_begin, ", ", p.mask_end, ") outside the ", num_masked, " masked tokens");
  DI_CHECK(p.allowed_row >= -1 && p.allowed_row < num_allowed_rows, "sample: row ", row, " allowed_row ",
           p.allowed_row, " outside [-1, ", num_allowed_rows, ")");
  DI_CHECK(p.score_token < 0 || p.allowed_row < 0, "sample: row ", row, " scores token ", p.score_token,
           " but has a grammar mask");
  if (p.penalty_begin == p.penalty_end) return;
  // Penalties apply once per token (the device applies them as it reads each token's logit).
  seen.assign(static_cast<size_t>(vocab), 0);
  for (int32_t j = p.penalty_begin; j < p.penalty_end; ++j) {
    const int32_t t = penalty_tokens[j];
    DI_CHECK(seen[static_cast<size_t>(t)] == 0, "sample: row ", row, " lists penalty token ", t,
             " twice (at [", j, "])");
    seen[static_cast<size_t>(t)] = 1;
  }
}

}  // namespace

void SampleArgs::validate() const {
  expect_dtype(logits, DType::kF32, "sample", "logits");
  expect_ndim(logits, 2, "sample", "logits");
  const int64_t num_rows = logits.shape[0], vocab = logits.shape[1];
  DI_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max(), "sample: logits ", logits.shape.str(),
           " must have a vocabulary of 1 to 2^31 - 1 tokens");
  expect_dtype(rows, DType::kI32, "sample", "rows");
  DI_CHECK(rows.shape.ndim() == 2 && rows.shape[0] == num_rows && rows.shape[1] == kSamplingRowWords, "sample: rows ",
           rows.shape.str(), " for logits ", logits.shape.str(), ": expected [", num_rows, ", ", kSamplingRowWords,
           "]");
  expect_dtype(out, DType::kI32, "sample", "out");
  DI_CHECK(out.shape.ndim() == 2 && out.shape[0] == num_rows && out.shape[1] == kSampledTokenWords, "sample: out ",
           out.shape.str(), " for logits ", logits.shape.str(), ": expected [", num_rows, ", ", kSampledTokenWords,
           "]");
  // The token lists may be default (empty) views when no row has penalties or masks.
  const auto expect_list = [](const ConstTensorView& t, int64_t count, const char* name) {
    if (t.numel() == 0 && count == 0) return;
    expect_index_array(t, count, "sample", name);
  };
  expect_list(penalty_tokens, penalty_tokens.numel(), "penalty_tokens");
  expect_list(penalty_counts, penalty_tokens.numel(), "penalty_counts");
  expect_list(masked_tokens, masked_tokens.numel(), "masked_tokens");
  int64_t num_allowed_rows = 0;
  if (allowed_tokens.numel() > 0) {
    expect_dtype(allowed_tokens, DType::kI32, "sample", "allowed_tokens");
    DI_CHECK(allowed_tokens.shape.ndim() == 2 && allowed_tokens.shape[1] == allowed_token_words(vocab),
             "sample: allowed_tokens ", allowed_tokens.shape.str(), " for a vocabulary of ", vocab, ": expected [rows, ",
             allowed_token_words(vocab), "]");
    num_allowed_rows = allowed_tokens.shape[0];
  }
  expect_one_device({logits, rows, penalty_tokens, penalty_counts, masked_tokens, out}, "sample");
  if (allowed_tokens.numel() > 0) expect_one_device({logits, allowed_tokens}, "sample");
  expect_entries_below(penalty_tokens, vocab, "sample", "penalty token");
  expect_entries_below(masked_tokens, vocab, "sample", "masked token");
  if (on_host(penalty_counts)) {
    const int32_t* counts = penalty_counts.as<int32_t>();
    for (int64_t j = 0; j < penalty_counts.numel(); ++j) {
      DI_CHECK(counts[j] >= 0, "sample: penalty count ", counts[j], " at [", j, "] is negative");
    }
  }
  if (!on_host(rows)) return;  // then the token lists are in host memory too (one device)
  std::vector<uint8_t> seen;
  for (int64_t r = 0; r < num_rows; ++r) {
    SamplingRow p;
    std::memcpy(static_cast<void*>(&p), rows.as<int32_t>() + r * kSamplingRowWords, sizeof p);
    validate_sampling_row(p, r, vocab, penalty_tokens.numel(), masked_tokens.numel(), num_allowed_rows,
                          penalty_tokens.as<int32_t>(), seen);
  }
}

}  // namespace deepinfer
