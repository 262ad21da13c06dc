#include "model/int4_source.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/packed_source.h"

namespace deepinfer {
namespace {

constexpr std::string_view kWeight = ".weight";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool same_shape(std::span<const int64_t> a, std::span<const int64_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Where one 4-bit weight's tensors are, and its dimensions (checked against them when indexed).
struct PackedEntry {
  std::string qweight, scales, zeros;  // zeros empty: symmetric
  int64_t rows = 0, cols = 0, group_size = 0;
};

class Int4CheckpointSource final : public PackedWeightSource {
 public:
  Int4CheckpointSource(Checkpoint checkpoint, const ModelConfig& config)
      : PackedWeightSource(std::move(checkpoint)),
        layout_(config.int4.format == Int4Format::kAwq ? Int4Layout::kAwq : Int4Layout::kCompressedTensors) {
    DI_CHECK(config.int4.enabled(), "internal: an INT4 source for a checkpoint without 4-bit weights");
    const std::string_view suffix = layout_ == Int4Layout::kAwq ? ".qweight" : ".weight_packed";
    for (const std::string& name : checkpoint_.names()) {
      if (!ends_with(name, suffix)) continue;
      const std::string module = name.substr(0, name.size() - suffix.size());
      const std::string logical = module + std::string(kWeight);
      PackedEntry e = layout_ == Int4Layout::kAwq ? index_awq(module, config.int4)
                                                  : index_compressed_tensors(module, config.int4);
      add_packed(logical, name, e.rows, e.cols);
      entries_.emplace(logical, std::move(e));
    }
    DI_CHECK_ARG(has_packed(), "checkpoint ", checkpoint_.dir(), ": config.json's quantization_config says ",
                 layout_ == Int4Layout::kAwq ? "AWQ" : "compressed-tensors", " 4-bit weights, but no tensor is stored ",
                 "as *", suffix);
  }

 private:
  std::optional<Int4Form> int4_form(const std::string& name) const override {
    const auto it = entries_.find(name);
    if (it == entries_.end()) return std::nullopt;
    return Int4Form{.group_size = it->second.group_size,
                    .symmetric = layout_ == Int4Layout::kCompressedTensors && it->second.zeros.empty()};
  }

  void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                      Int4Rows& out) const override {
    const PackedEntry& e = entry(name, shape);
    std::vector<float> scales;
    unpack_int4_rows(packed(e, scales), first_row, num_rows, out);
  }

  void read_packed_rows(const std::string& name, int64_t first_row, int64_t num_rows,
                        std::span<float> out) const override {
    std::vector<float> scales;
    dequantize_int4_rows(packed(entries_.at(name), scales), first_row, num_rows, out);
  }

  const PackedEntry& entry(const std::string& name, std::span<const int64_t> shape) const {
    const auto it = entries_.find(name);
    DI_CHECK(it != entries_.end(), "tensor ", name, " is not stored in 4 bits");
    DI_CHECK(shape.size() == 2 && shape[0] == it->second.rows && shape[1] == it->second.cols, "tensor ", name,
             " is a 4-bit weight [", it->second.rows, ", ", it->second.cols, "], asked for as ", shape_str(shape));
    return it->second;
  }

  // The stored tensors of `e` (its scales widened to float32 into `scales`).
  PackedInt4 packed(const PackedEntry& e, std::vector<float>& scales) const {
    const int64_t groups = e.cols / e.group_size;
    const std::vector<int64_t> scale_shape = layout_ == Int4Layout::kAwq ? std::vector{groups, e.rows}
                                                                         : std::vector{e.rows, groups};
    scales.resize(static_cast<size_t>(e.rows * groups));
    checkpoint_.read_f32(e.scales, scale_shape, scales);
    return {.layout = layout_,
            .rows = e.rows,
            .cols = e.cols,
            .group_size = e.group_size,
            .qweight = checkpoint_.get(e.qweight).bytes,
            .zeros = e.zeros.empty() ? std::span<const std::byte>() : checkpoint_.get(e.zeros).bytes,
            .scales = scales};
  }

  void check_int32(const TensorInfo& t, std::span<const int64_t> shape, std::string_view what) const {
    DI_CHECK_ARG(t.supported && t.dtype == DType::kI32, "tensor ", t.name, " is ", t.dtype_tag, "; ", what,
                 " are int32 words");
    DI_CHECK_ARG(same_shape(t.shape, shape), "tensor ", t.name, " has shape ", shape_str(t.shape), ", expected ",
                 shape_str(shape), " (", what, ")");
  }

  void check_scales(const TensorInfo& t, std::span<const int64_t> shape, std::string_view what) const {
    const bool is_float = t.supported && (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16);
    DI_CHECK_ARG(is_float, "tensor ", t.name, " is ", t.dtype_tag, "; scales are F32, BF16 or F16");
    DI_CHECK_ARG(same_shape(t.shape, shape), "tensor ", t.name, " has shape ", shape_str(t.shape), ", expected ",
                 shape_str(shape), " (", what, ")");
  }

  static int64_t group_of(const Int4Config& c, int64_t k, const std::string& module) {
    const int64_t g = c.group_size == -1 ? k : c.group_size;
    DI_CHECK_ARG(g > 0 && k % g == 0, "quantization_config.group_size ", c.group_size, " (config.json) does not ",
                 "divide K = ", k, ", the input size of ", module);
    return g;
  }

  // compressed-tensors: weight_packed [N, ceil(K / 8)], weight_scale [N, K / G], weight_zero_point [ceil(N / 8), K / G]
  // when asymmetric, weight_shape {N, K}.
  PackedEntry index_compressed_tensors(const std::string& module, const Int4Config& c) const {
    PackedEntry e{.qweight = module + ".weight_packed", .scales = module + ".weight_scale"};
    const TensorInfo& shape_t = require(module + ".weight_shape", e.qweight);
    const auto [rows, cols] = read_weight_shape(shape_t);
    e.rows = rows;
    e.cols = cols;
    DI_CHECK_ARG(e.rows > 0 && e.cols > 0, "tensor ", shape_t.name, " says shape [", e.rows, ", ", e.cols, "]");
    const TensorInfo& packed = checkpoint_.get(e.qweight);
    DI_CHECK_ARG(packed.supported && packed.dtype == DType::kI32, "tensor ", e.qweight, " is ", packed.dtype_tag,
                 "; packed 4-bit weights are int32 words");
    const std::vector<int64_t> packed_shape{e.rows, (e.cols + 7) / 8};
    DI_CHECK_ARG(same_shape(packed.shape, packed_shape), "tensor ", e.qweight, " has shape ", shape_str(packed.shape),
                 ", but ", shape_t.name, " is [", e.rows, ", ", e.cols, "]: 8 values a word along K make ",
                 shape_str(packed_shape));
    e.group_size = group_of(c, e.cols, module);
    const int64_t groups = e.cols / e.group_size;
    check_scales(require(e.scales, e.qweight), std::vector{e.rows, groups}, "one scale per group of each row");
    if (!c.symmetric) {
      e.zeros = module + ".weight_zero_point";
      check_int32(require(e.zeros, e.qweight), std::vector{(e.rows + 7) / 8, groups},
                  "zero points packed 8 a word along N");
    }
    return e;
  }

  // AWQ: qweight [K, N / 8], qzeros [K / G, N / 8], scales [K / G, N].
  PackedEntry index_awq(const std::string& module, const Int4Config& c) const {
    PackedEntry e{.qweight = module + ".qweight", .scales = module + ".scales", .zeros = module + ".qzeros"};
    const TensorInfo& packed = checkpoint_.get(e.qweight);
    DI_CHECK_ARG(packed.supported && packed.dtype == DType::kI32 && packed.shape.size() == 2 &&
                     packed.shape[0] > 0 && packed.shape[1] > 0,
                 "tensor ", e.qweight, " is ", packed.dtype_tag, " ", shape_str(packed.shape),
                 "; AWQ weights are int32 [K, N / 8]");
    e.cols = packed.shape[0];
    e.rows = 8 * packed.shape[1];
    e.group_size = group_of(c, e.cols, module);
    const int64_t groups = e.cols / e.group_size;
    check_int32(require(e.zeros, e.qweight), std::vector{groups, e.rows / 8}, "zero points packed 8 a word along N");
    check_scales(require(e.scales, e.qweight), std::vector{groups, e.rows}, "one scale per group of each column");
    return e;
  }

  Int4Layout layout_;
  std::map<std::string, PackedEntry, std::less<>> entries_;  // by the plain name the loader asks for (X.weight)
};

class Int4RoundingSource final : public WeightSource {
 public:
  Int4RoundingSource(std::unique_ptr<WeightSource> inner, Int4Rounding rounding)
      : inner_(std::move(inner)), rounding_(rounding) {}

  bool contains(const std::string& name) const override { return inner_->contains(name); }
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const override {
    return inner_->stored_shape(name);
  }
  // stores_fp8 stays false: the loader reads float32 values, which are rounded here.
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    inner_->read_rows(name, shape, first_row, num_rows, out);
    if (is_int4_linear(name) && shape.size() >= 2) round_int4(out, shape.back(), rounding_);
  }
  // The 2-D linear weights (transformers 5's fused [E, ..] experts are read as float32 rows and rounded there).
  std::optional<Int4Form> int4_form(const std::string& name) const override {
    if (!is_int4_linear(name) || !ends_with(name, kWeight)) return std::nullopt;
    const std::optional<std::vector<int64_t>> shape = inner_->stored_shape(name);
    if (shape && shape->size() != 2) return std::nullopt;
    const int64_t group = rounding_.group_size;
    if (shape && group != -1 && (*shape)[1] % group != 0) return std::nullopt;
    // -1 (a group per row) has no fixed size; the loader asks read_int4_rows with the row's K.
    return Int4Form{.group_size = group, .symmetric = rounding_.symmetric};
  }
  void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                      Int4Rows& out) const override {
    DI_CHECK(shape.size() == 2, "tensor ", name, ": INT4 rows are read from 2-D weights, not ", shape_str(shape));
    std::vector<float> values(static_cast<size_t>(num_rows * shape[1]));
    inner_->read_rows(name, shape, first_row, num_rows, values);
    quantize_int4_rows(values, shape[1], rounding_, out);
  }

 private:
  std::unique_ptr<WeightSource> inner_;
  Int4Rounding rounding_;
};

}  // namespace

bool is_int4_linear(std::string_view name) {
  return ends_with(name, "_proj.weight") || ends_with(name, "_proj_with_mqa.weight") ||
         ends_with(name, "experts.gate_up_proj") ||
         ends_with(name, "experts.down_proj");
}

void check_int4_rounding(const ModelConfig& c, const Int4Rounding& rounding) {
  DI_CHECK_ARG(rounding.group_size > 0 || rounding.group_size == -1, "quantization int4: group_size must be > 0 or ",
               "-1 (one group per output channel), got ", rounding.group_size);
  if (rounding.group_size == -1) return;
  std::vector<std::pair<std::string, int64_t>> inputs{
      {"q_a_proj, q_proj, kv_a_proj_with_mqa, gate_proj and up_proj (hidden_size)", c.hidden_size},
      {"kv_b_proj (kv_lora_rank)", c.kv_lora_rank},
      {"o_proj (num_attention_heads * v_head_dim)", c.num_attention_heads * c.v_head_dim}};
  if (c.q_lora_rank) inputs.emplace_back("q_b_proj (q_lora_rank)", *c.q_lora_rank);
  bool dense = c.n_routed_experts == 0;
  for (int64_t i = 0; i < c.num_hidden_layers && !dense; ++i) dense = !c.is_moe_layer(i);
  if (dense) inputs.emplace_back("the dense MLPs' down_proj (intermediate_size)", c.intermediate_size);
  if (c.n_routed_experts > 0) {
    inputs.emplace_back("the experts' down_proj (moe_intermediate_size)", c.moe_intermediate_size);
    if (c.n_shared_experts > 0) {
      inputs.emplace_back("the shared experts' down_proj (n_shared_experts * moe_intermediate_size)",
                          c.n_shared_experts * c.moe_intermediate_size);
    }
  }
  for (const auto& [what, k] : inputs) {
    DI_CHECK_ARG(k % rounding.group_size == 0, "quantization int4: group_size ", rounding.group_size,
                 " does not divide K = ", k, " of ", what, "; use a group size that divides every linear layer's ",
                 "input size, or -1 (one group per output channel)");
  }
}

std::unique_ptr<WeightSource> open_int4_checkpoint_source(Checkpoint checkpoint, const ModelConfig& config) {
  return std::make_unique<Int4CheckpointSource>(std::move(checkpoint), config);
}

std::unique_ptr<WeightSource> make_int4_rounding_source(std::unique_ptr<WeightSource> inner, Int4Rounding rounding) {
  return std::make_unique<Int4RoundingSource>(std::move(inner), rounding);
}

}  // namespace deepinfer
