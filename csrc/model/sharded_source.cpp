#include "model/sharded_source.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "model/safetensors.h"

namespace deepinfer {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The last two dimensions of a [.., R, C] shape (a 1-D shape is one row).
struct Matrix {
  int64_t rows, cols, leading;  // leading: the product of the dimensions before them
};
Matrix matrix_of(std::span<const int64_t> shape) {
  const auto n = shape.size();
  if (n == 0) return {1, 1, 1};
  if (n == 1) return {1, shape[0], 1};
  int64_t leading = 1;
  for (size_t i = 0; i + 2 < n; ++i) leading *= shape[i];
  return {shape[n - 2], shape[n - 1], leading};
}

class ShardedSource final : public WeightSource {
 public:
  // Under data-parallel attention nothing is split by channels: the source reads whole tensors (the loader picks the
  // rank's experts).
  ShardedSource(const WeightSource& inner, const ModelShard& shard)
      : inner_(inner), shard_(shard.splits_attention() ? shard : ModelShard{.expert_parallel = shard.expert_parallel}) {}

  bool contains(const std::string& name) const override { return inner_.contains(name); }

  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const override {
    std::optional<std::vector<int64_t>> shape = inner_.stored_shape(name);
    if (!shape || shape->size() < 2) return shape;
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated) return shape;
    const size_t dim = split == TensorSplit::kColumns ? shape->size() - 1 : shape->size() - 2;
    int64_t& d = (*shape)[dim];
    const int64_t parts = split == TensorSplit::kHalvesRows ? 2 * shard_.size : shard_.size;
    DI_CHECK_ARG(d % parts == 0, "tensor ", name, " of shape ", shape_str(*shape), " cannot be split across ",
                 shard_.size, " tensor-parallel ranks");
    d /= shard_.size;
    return shape;
  }

  // Stored FP8 stays FP8 when this rank's slice lies on whole 128 x 128 blocks; otherwise the loader reads float32
  // values and quantizes them again.
  bool stores_fp8(const std::string& name) const override {
    if (!inner_.stores_fp8(name)) return false;
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated) return true;
    const std::optional<std::vector<int64_t>> local = stored_shape(name);
    if (!local || local->size() != 2) return false;
    return (split == TensorSplit::kRows ? (*local)[0] : (*local)[1]) % kFp8Block == 0;
  }

  // Dummy weights: this rank's rows of a row-split matrix are a later range of its stream, its columns of a
  // column-split one a slice of each row. A fused gate_up's halves (two ranges) and slices of stacked 3-D tensors
  // have no one range: they are read as values.
  std::optional<dummy_normal::StreamRange> normal_stream(const std::string& name,
                                                         std::span<const int64_t> shape) const override {
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated || shape.size() < 2) return inner_.normal_stream(name, shape);
    if (shape.size() != 2 || split == TensorSplit::kHalvesRows) return std::nullopt;
    std::optional<dummy_normal::StreamRange> range = inner_.normal_stream(name, global_shape(name, shape));
    if (!range) return std::nullopt;
    range->first += split == TensorSplit::kRows ? shard_.rank * shape[0] * range->row_stride : shard_.rank * shape[1];
    range->row_length = shape[1];
    return range;
  }

  bool fp8_checkpoint() const override { return inner_.fp8_checkpoint(); }
  bool stored_fp8(const std::string& name) const override { return inner_.stored_fp8(name); }

  void read_fp8_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                     std::span<uint8_t> codes, std::span<float> scale_inv) const override {
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated) {
      inner_.read_fp8_rows(name, shape, first_row, num_rows, codes, scale_inv);
      return;
    }
    DI_CHECK(shape.size() == 2, "tensor ", name, ": sharded FP8 reads take 2-D shapes");
    const std::vector<int64_t> global = global_shape(name, shape);
    if (split == TensorSplit::kRows) {
      inner_.read_fp8_rows(name, global, shard_.rank * shape[0] + first_row, num_rows, codes, scale_inv);
      return;
    }
    // Columns: whole stored rows, then this rank's columns and their block columns.
    const int64_t cols = shape[1], global_cols = global[1], blocks = fp8_blocks(cols);
    const int64_t global_blocks = fp8_blocks(global_cols), row_blocks = fp8_blocks(num_rows);
    std::vector<uint8_t> all_codes(static_cast<size_t>(num_rows * global_cols));
    std::vector<float> all_scales(static_cast<size_t>(row_blocks * global_blocks));
    inner_.read_fp8_rows(name, global, first_row, num_rows, all_codes, all_scales);
    DI_CHECK(codes.size() == static_cast<size_t>(num_rows * cols) &&
                 scale_inv.size() == static_cast<size_t>(row_blocks * blocks),
             "tensor ", name, ": FP8 output for ", num_rows, " rows of ", cols, " columns has ", codes.size(),
             " codes and ", scale_inv.size(), " scales");
    for (int64_t r = 0; r < num_rows; ++r) {
      std::copy_n(all_codes.data() + r * global_cols + shard_.rank * cols, cols, codes.data() + r * cols);
    }
    for (int64_t b = 0; b < row_blocks; ++b) {
      std::copy_n(all_scales.data() + b * global_blocks + shard_.rank * blocks, blocks, scale_inv.data() + b * blocks);
    }
  }

  // A 4-bit weight stays packed when this rank's columns fall on whole groups (rows always do).
  std::optional<Int4Form> int4_form(const std::string& name) const override {
    std::optional<Int4Form> form = inner_.int4_form(name);
    if (!form || tensor_split(name, shard_.expert_parallel) != TensorSplit::kColumns) return form;
    // A group per row (group_size -1) spans every rank's columns: such a weight is read as float32 values. A source
    // that makes any shape (dummy weights) is taken at its word; read_int4_rows checks the group edges.
    if (form->group_size <= 0) return std::nullopt;
    const std::optional<std::vector<int64_t>> local = stored_shape(name);
    if (local && (local->size() != 2 || (*local)[1] % form->group_size != 0)) return std::nullopt;
    return form;
  }

  void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                      Int4Rows& out) const override {
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated) {
      inner_.read_int4_rows(name, shape, first_row, num_rows, out);
      return;
    }
    DI_CHECK(shape.size() == 2, "tensor ", name, ": sharded INT4 reads take 2-D shapes");
    const std::vector<int64_t> global = global_shape(name, shape);
    if (split == TensorSplit::kRows) {
      inner_.read_int4_rows(name, global, shard_.rank * shape[0] + first_row, num_rows, out);
      return;
    }
    // Columns: whole stored rows, then this rank's groups.
    Int4Rows whole;
    inner_.read_int4_rows(name, global, first_row, num_rows, whole);
    out = whole.columns(shard_.rank * shape[1], shape[1]);
  }

  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    if (split == TensorSplit::kReplicated || shape.size() < 2) {
      inner_.read_rows(name, shape, first_row, num_rows, out);
      return;
    }
    const std::vector<int64_t> global = global_shape(name, shape);
    if (split == TensorSplit::kRows && shape.size() == 2) {
      inner_.read_rows(name, global, shard_.rank * shape[0] + first_row, num_rows, out);
      return;
    }
    // Whole stored rows of dimension 0 (a matrix's rows, or an expert of a fused [E, M, N] tensor), then the slice.
    const Shape local_shape(shape), global_s(global);
    const int64_t local_row = num_rows == 0 ? 0 : static_cast<int64_t>(out.size()) / num_rows;
    const int64_t global_row = global_s.numel() / std::max<int64_t>(global[0], 1);
    DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * (local_shape.numel() / std::max<int64_t>(shape[0], 1)),
             "tensor ", name, ": output for ", num_rows, " rows of ", local_shape.str(), " holds ", out.size(),
             " floats");
    std::vector<float> whole(static_cast<size_t>(num_rows * global_row));
    inner_.read_rows(name, global, first_row, num_rows, whole);
    const Matrix local = matrix_of(shape.subspan(1));
    const Matrix stored = matrix_of(std::span<const int64_t>(global).subspan(1));
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* src = whole.data() + r * global_row;
      float* dst = out.data() + r * local_row;
      slice(split, src, stored, local, dst);
    }
  }

 private:
  // One stored row of dimension 0 (a [cols] row of a matrix, or an [M, N] expert) -> this rank's slice of it.
  void slice(TensorSplit split, const float* src, const Matrix& stored, const Matrix& local, float* dst) const {
    const int64_t rank = shard_.rank;
    if (split == TensorSplit::kColumns) {
      for (int64_t r = 0; r < local.rows * local.leading; ++r) {
        std::copy_n(src + r * stored.cols + rank * local.cols, local.cols, dst + r * local.cols);
      }
      return;
    }
    // Rows of an [M, N] expert: this rank's rows, of each half for a fused gate_up.
    const int64_t halves = split == TensorSplit::kHalvesRows ? 2 : 1;
    const int64_t stored_half = stored.rows / halves, local_half = local.rows / halves;
    for (int64_t h = 0; h < halves; ++h) {
      std::copy_n(src + (h * stored_half + rank * local_half) * stored.cols, local_half * stored.cols,
                  dst + h * local_half * local.cols);
    }
  }

  std::vector<int64_t> global_shape(const std::string& name, std::span<const int64_t> local) const {
    std::vector<int64_t> g(local.begin(), local.end());
    const TensorSplit split = tensor_split(name, shard_.expert_parallel);
    const size_t dim = split == TensorSplit::kColumns ? g.size() - 1 : g.size() - 2;
    g[dim] *= shard_.size;
    return g;
  }

  const WeightSource& inner_;
  const ModelShard shard_;
};

}  // namespace

TensorSplit tensor_split(const std::string& name, bool expert_parallel) {
  // Under EP each routed expert is whole on the rank that holds it.
  if (expert_parallel && name.find(".mlp.experts.") != std::string::npos) return TensorSplit::kReplicated;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return TensorSplit::kRows;
  if (name.find(".self_attn.") != std::string::npos) {
    for (const char* rows : {"q_proj.weight", "q_b_proj.weight", "kv_b_proj.weight"}) {
      if (ends_with(name, std::string(".self_attn.") + rows)) return TensorSplit::kRows;
    }
    if (ends_with(name, ".self_attn.o_proj.weight")) return TensorSplit::kColumns;
    return TensorSplit::kReplicated;
  }
  if (name.find(".mlp.") == std::string::npos) return TensorSplit::kReplicated;
  if (ends_with(name, ".mlp.experts.gate_up_proj")) return TensorSplit::kHalvesRows;
  if (ends_with(name, ".mlp.experts.down_proj")) return TensorSplit::kColumns;
  if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight")) return TensorSplit::kRows;
  if (ends_with(name, "down_proj.weight")) return TensorSplit::kColumns;
  return TensorSplit::kReplicated;  // the router and its bias
}

std::unique_ptr<WeightSource> make_sharded_source(const WeightSource& inner, const ModelShard& shard) {
  return std::make_unique<ShardedSource>(inner, shard);
}

}  // namespace deepinfer
