#include "model/weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <optional>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

#include "core/counter_rng.h"
#include "core/dummy_normal.h"
#include "core/error.h"
#include "core/fp8.h"
#include "model/checkpoint.h"
#include "model/fp4_source.h"
#include "model/int4_source.h"

namespace deepinfer {
namespace {

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(Checkpoint checkpoint, const ModelConfig& config)
      : checkpoint_(std::move(checkpoint)),
        fp8_block_{config.fp8.block_rows, config.fp8.block_cols},
        fp8_checkpoint_(config.fp8.enabled) {}

  bool contains(const std::string& name) const override { return checkpoint_.contains(name); }
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const override {
    return checkpoint_.get(name).shape;
  }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    checkpoint_.read_rows_f32(name, shape, first_row, num_rows, out, fp8_block_);
  }
  bool stores_fp8(const std::string& name) const override {
    return fp8_block_ == std::array<int64_t, 2>{kFp8Block, kFp8Block} && stored_fp8(name);
  }
  bool fp8_checkpoint() const override { return fp8_checkpoint_; }
  bool stored_fp8(const std::string& name) const override {
    return checkpoint_.contains(name) && checkpoint_.get(name).dtype == DType::kF8E4M3;
  }
  void read_fp8_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                     std::span<uint8_t> codes, std::span<float> scale_inv) const override {
    checkpoint_.read_fp8_rows(name, shape, first_row, num_rows, codes, scale_inv, fp8_block_);
  }

 private:
  Checkpoint checkpoint_;
  std::array<int64_t, 2> fp8_block_;
  bool fp8_checkpoint_;
};

// Rows of dimension 0 of a tensor of shape `s` (a 0-D tensor is one row), and the values a row holds.
int64_t num_rows(const Shape& s) { return s.ndim() == 0 ? 1 : s[0]; }
int64_t row_elems(const Shape& s) { return num_rows(s) == 0 ? 0 : s.numel() / num_rows(s); }

// ---------------------------------------------------------------------------------------------- dummy weights
//
// The values are core/dummy_normal.h's stream per tensor. On the host they are made a block at a time: the 64-bit
// hashes first, then the float math in one vectorized loop; a backend that can make them on its device
// (Backend::fill_dummy_normal) is given the stream instead (Loader::copy_rows).

using counter_rng::kGolden;
using counter_rng::mix64;
constexpr int64_t kNormalBlock = 256;  // values made together; blocks start at multiples of this index

// Values [block * kNormalBlock, (block + 1) * kNormalBlock) of stream `key` into `out` (kNormalBlock floats, 64-byte
// aligned). The hashes are 64-bit scalar work; the rest is one vectorized loop over fixed-size aligned arrays (no
// peeled remainder), so every value is computed the same way whichever range it was asked for.
void normal_block(uint64_t key, int64_t block, float* out) {
  alignas(64) uint32_t hi[kNormalBlock];
  alignas(64) uint32_t lo[kNormalBlock];
  const auto base = static_cast<uint64_t>(block * kNormalBlock);
  for (int64_t j = 0; j < kNormalBlock; ++j) {
    const uint64_t h = mix64(key + (base + static_cast<uint64_t>(j)) * kGolden);
    hi[j] = static_cast<uint32_t>(h >> 32);
    lo[j] = static_cast<uint32_t>(h);
  }
#pragma omp simd aligned(hi, lo, out : 64)
  for (int64_t j = 0; j < kNormalBlock; ++j) {
    out[j] = counter_rng::mul_rn(dummy_normal::kDummyStd, dummy_normal::standard_normal(hi[j], lo[j]));
  }
}

// out[j] = value first + j of stream `key`.
void fill_normal(uint64_t key, int64_t first, std::span<float> out) {
  const auto count = static_cast<int64_t>(out.size());
  if (count == 0) return;
  const int64_t first_block = first / kNormalBlock;
  const int64_t end_block = (first + count + kNormalBlock - 1) / kNormalBlock;
  float* dst = out.data();
#pragma omp parallel for schedule(static) if (count >= 4 * kNormalBlock)
  for (int64_t b = first_block; b < end_block; ++b) {
    alignas(64) float values[kNormalBlock];
    normal_block(key, b, values);
    const int64_t begin = std::max(b * kNormalBlock, first), end = std::min((b + 1) * kNormalBlock, first + count);
    std::copy(values + (begin - b * kNormalBlock), values + (end - b * kNormalBlock), dst + (begin - first));
  }
}

class DummySource final : public WeightSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}
  bool contains(const std::string&) const override { return true; }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    const Shape s(shape);
    const int64_t rows = s.ndim() == 0 ? 1 : s[0];
    const int64_t row_elems = rows == 0 ? 0 : s.numel() / rows;
    DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= rows, "rows [", first_row, ", ",
             first_row + num_rows, ") out of range for tensor ", name, " of shape ", s.str());
    DI_CHECK(static_cast<int64_t>(out.size()) == num_rows * row_elems, "output for rows [", first_row, ", ",
             first_row + num_rows, ") of tensor ", name, " holds ", out.size(), " floats, but they have ",
             num_rows * row_elems, " elements (shape ", s.str(), ")");
    if (const std::optional<float> constant = constant_value(name)) {
      std::fill(out.begin(), out.end(), *constant);
      return;
    }
    fill_normal(dummy_normal::tensor_key(seed_, name), first_row * row_elems, out);
  }
  std::optional<dummy_normal::StreamRange> normal_stream(const std::string& name,
                                                         std::span<const int64_t> shape) const override {
    if (constant_value(name)) return std::nullopt;
    const int64_t row = row_elems(Shape(shape));
    return dummy_normal::StreamRange{
        .key = dummy_normal::tensor_key(seed_, name), .first = 0, .row_length = row, .row_stride = row};
  }

 private:
  // Norm weights are ones and biases zeros; every other tensor is its normal stream.
  static std::optional<float> constant_value(const std::string& name) {
    if (name.find("norm") != std::string::npos) return 1.0f;
    if (name.find("bias") != std::string::npos) return 0.0f;
    return std::nullopt;
  }

  uint64_t seed_;
};

// ---------------------------------------------------------------------------------------------- the loader

// Rows of `row` values a chunk holds: at most kLoadChunkFloats values, or one row when a row is larger.
int64_t chunk_rows(int64_t row) { return std::max<int64_t>(1, kLoadChunkFloats / std::max<int64_t>(row, 1)); }
// The same in whole FP8 block rows, at least one.
int64_t block_chunk_rows(int64_t row) { return std::max<int64_t>(1, chunk_rows(row) / kFp8Block) * kFp8Block; }

// Whether quantizing at load (a bf16 checkpoint into an FP8 sink) rounds a linear weight to FP8: DeepSeek's FP8
// release, which quantization at load follows, quantizes every projection but the MTP layer's eh_proj (vLLM and
// SGLang build that one as a plain linear layer too).
enum class Fp8AtLoad : uint8_t { kQuantize, kKeep };

// Reads tensors piece by piece into one reusable host buffer and hands each piece to the sink.
class Loader {
 public:
  // `modules`: the config's list of quantized linear modules (ModelConfig::quantized_modules).
  Loader(const WeightSource& source, WeightSink& sink, const QuantizedModules& modules, const LoadProgress& progress,
         int64_t total)
      : source_(source), sink_(sink), modules_(modules), progress_(progress), total_(total) {}

  Tensor allocate(Shape shape, WeightRole role) { return sink_.allocate(shape, role); }
  // A linear weight in the sink's format, never packed INT4 (allocate_linear_for decides that by the source).
  Weight allocate_linear(Shape shape) { return sink_.allocate_linear(shape); }
  template <typename Dst>
  void write(Dst& dst, int64_t offset, std::span<const float> values) { sink_.write(dst, offset, values); }
  void finish() { sink_.finish(); }

  // Whether linear weight `name` takes the sink's FP8 format. An FP8 checkpoint answers tensor by tensor: the layers
  // it stores unquantized (DeepSeek-V3's MTP eh_proj, a config's ignore / modules_to_not_convert list) stay in the
  // model dtype as its authors left them, rather than being rounded to FP8 here. Quantizing at load, `at_load` says.
  bool fp8_weight(const std::string& name, Fp8AtLoad at_load = Fp8AtLoad::kQuantize) const {
    if (!sink_.fp8_linear()) return false;
    if (source_.fp8_checkpoint()) return source_.stored_fp8(name);
    // Quantizing at load: every linear module but eh_proj, and but those an FP8 config leaves out (dummy weights of
    // an FP8 checkpoint's config.json, whose memory plan counts them so); a bf16 config lists none.
    return at_load == Fp8AtLoad::kQuantize && modules_.quantizes(module_of(name));
  }
  // Whether the sink's FP8 format rounds values at load (no FP8 checkpoint: a bf16 one, or dummy weights).
  bool quantizes_at_load() const { return sink_.fp8_linear() && !source_.fp8_checkpoint(); }

  // A linear weight of `shape` for source tensor `name` (the first of those it will hold): packed INT4 where the sink
  // keeps 4-bit weights and the source has `name` in 4 bits, FP8 where fp8_weight(name), a matrix otherwise.
  Weight allocate_linear_for(const std::string& name, Shape shape, Fp8AtLoad at_load = Fp8AtLoad::kQuantize) {
    if (sink_.takes_int4()) {
      if (std::optional<Int4Form> form = source_.int4_form(name)) {
        if (form->group_size == -1) form->group_size = shape[shape.ndim() - 1];  // a group per row
        return sink_.allocate_int4(shape, *form);
      }
    }
    if (sink_.fp8_linear() && !fp8_weight(name, at_load)) return Weight(allocate(shape, WeightRole::kMatrix));
    return allocate_linear(shape);
  }
  // A weight stacked from source tensors `names` (gate_proj and up_proj; every expert's) takes the format of the
  // first. An FP8 checkpoint whose pieces disagree is refused rather than loaded in one format: rounding its bf16
  // pieces to FP8, or widening its FP8 ones into a bf16 stack, would load other weights than it stores, and the
  // fused ops take one format a stack. (INT4 stacks check the same as their pieces arrive: copy_int4_rows.)
  Weight allocate_stacked(std::span<const std::string> names, Shape shape) {
    DI_CHECK(!names.empty(), "a stacked weight ", shape.str(), " needs at least one source tensor");
    const bool fp8 = fp8_weight(names[0]);
    for (const std::string& name : names.subspan(1)) {
      DI_CHECK(fp8_weight(name) == fp8, "tensors ", names[0], " and ", name, " are stacked into one weight ",
               shape.str(), ", but the checkpoint stores ", fp8 ? "the first" : "the second", " as FP8 and ",
               fp8 ? "the second" : "the first", " unquantized; a stacked weight (gate and up, the experts, the "
               "shared experts after the routed ones) is loaded in one format");
    }
    return allocate_linear_for(names[0], shape);
  }

  // A linear layer's weight `name` of `shape`, placed in the format allocate_linear_for gives it.
  Weight read_linear(const std::string& name, Shape shape, Fp8AtLoad at_load = Fp8AtLoad::kQuantize) {
    Weight w = allocate_linear_for(name, shape, at_load);
    copy_linear(name, shape, 0, num_rows(shape), w, 0);
    return w;
  }
  // Rows [first_row, first_row + count) of linear weight `name` into `dst` from element `offset` on. Stored FP8 goes
  // into an FP8 sink as it is when the rows fall on whole blocks of both tensors; anything else is read as float32
  // (and quantized by the sink if its weights are FP8).
  void copy_linear(const std::string& name, Shape shape, int64_t first_row, int64_t count, Weight& dst,
                   int64_t offset) {
    const Shape& ds = dst.shape();
    const int64_t rows = ds[ds.ndim() - 2], cols = ds[ds.ndim() - 1];
    const int64_t dst_row = offset / cols, matrix = dst_row / rows, row = dst_row % rows;
    if (dst.is_packed4()) {
      copy_int4_rows(name, shape, first_row, count, dst, matrix, row, offset % cols == 0);
      return;
    }
    const bool whole_blocks = count % kFp8Block == 0 || (first_row + count == shape[0] && row + count == rows);
    if (!(sink_.takes_fp8() && dst.is_fp8() && shape.ndim() == 2 && source_.stores_fp8(name) &&
          offset % cols == 0 && first_row % kFp8Block == 0 && row % kFp8Block == 0 && whole_blocks)) {
      copy_rows(name, shape, first_row, count, dst, offset);
      return;
    }
    const int64_t rows_per_chunk = block_chunk_rows(cols);
    for (int64_t done = 0; done < count; done += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, count - done);
      codes_.resize(static_cast<size_t>(n * cols));
      scales_.resize(static_cast<size_t>(fp8_blocks(n) * fp8_blocks(cols)));
      source_.read_fp8_rows(name, shape.dims(), first_row + done, n, codes_, scales_);
      sink_.write_fp8(dst, matrix, row + done, {.codes = codes_, .scale_inv = scales_, .rows = n});
    }
  }

  // Rows of 4-bit weight `name` into matrix `matrix` of INT4 weight `dst` from row `row` on, as the source holds them.
  void copy_int4_rows(const std::string& name, Shape shape, int64_t first_row, int64_t count, Weight& dst,
                      int64_t matrix, int64_t row, bool whole_rows) {
    DI_CHECK(source_.int4_form(name).has_value() && shape.ndim() == 2 && whole_rows, "tensor ", name, " of shape ",
             shape.str(), " goes into a packed INT4 weight ", dst.shape().str(), " but is not a 2-D 4-bit weight of ",
             "the checkpoint (a stacked weight mixes 4-bit and unquantized tensors?)");
    const int64_t rows_per_chunk = chunk_rows(shape[1]);
    for (int64_t done = 0; done < count; done += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, count - done);
      source_.read_int4_rows(name, shape.dims(), first_row + done, n, int4_rows_);
      sink_.write_int4(dst, matrix, row + done, int4_rows_);
    }
  }

  // Tensor `name` of `shape`, placed.
  Tensor read(const std::string& name, Shape shape, WeightRole role = WeightRole::kMatrix) {
    Tensor t = allocate(shape, role);
    copy(name, shape, t, 0);
    return t;
  }
  // All of source tensor `name` (of `shape`) into `dst`, from element `offset` on.
  void copy(const std::string& name, Shape shape, Tensor& dst, int64_t offset) {
    copy_rows(name, shape, 0, num_rows(shape), dst, offset);
  }
  // Rows [first_row, first_row + count) of source tensor `name` into `dst` from element `offset` on: chunks of
  // whole rows of at most kLoadChunkFloats values, or one row at a time when a row is larger.
  template <typename Dst>
  void copy_rows(const std::string& name, Shape shape, int64_t first_row, int64_t count, Dst& dst,
                 int64_t offset) {
    const int64_t row = row_elems(shape);
    if (count > 0) {
      // Dummy weights the sink can make where they live (a GPU): the stream, not its values.
      if (std::optional<dummy_normal::StreamRange> range = source_.normal_stream(name, shape.dims())) {
        source_.read_rows(name, shape.dims(), first_row, 0, {});  // still checks name, shape and range start
        DI_CHECK(first_row + count <= num_rows(shape), "rows [", first_row, ", ", first_row + count,
                 ") out of range for tensor ", name, " of shape ", shape.str());
        range->first += first_row * range->row_stride;
        if (sink_.fill_normal(dst, offset, count * row, *range)) return;
      }
    }
    int64_t rows_per_chunk = chunk_rows(row);
    if constexpr (std::is_same_v<Dst, Weight>) {
      // Chunks of whole FP8 block rows, which an FP8 sink quantizes as they come (source rows = weight rows here).
      const Shape& ds = dst.shape();
      if (sink_.fp8_linear() && row == ds[ds.ndim() - 1] && rows_per_chunk >= kFp8Block) {
        rows_per_chunk = block_chunk_rows(row);
      }
    }
    if (count == 0) source_.read_rows(name, shape.dims(), first_row, 0, {});  // still checks name and shape
    for (int64_t done = 0; done < count; done += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, count - done);
      write(dst, offset + done * row, read_rows(name, shape, first_row + done, n));
    }
  }
  // Source tensor `name` of `shape` [rows, blocks * width] as `blocks` matrices [rows, width] (its column blocks),
  // one after another in `dst` from element `offset` on: column block j goes to offset + j * rows * width. Reads
  // chunks of whole rows as copy_rows does and writes each chunk's part of each block from a gathered copy.
  template <typename Dst>
  void copy_column_blocks(const std::string& name, Shape shape, int64_t width, Dst& dst, int64_t offset) {
    const int64_t rows = shape[0], cols = shape[1], blocks = cols / width;
    if constexpr (std::is_same_v<Dst, Weight>) {
      if (dst.is_packed4()) {
        copy_int4_column_blocks(name, shape, width, dst, offset / (rows * width));
        return;
      }
      if (sink_.takes_fp8() && dst.is_fp8() && source_.stores_fp8(name) && width % kFp8Block == 0 &&
          offset % (rows * width) == 0) {
        copy_fp8_column_blocks(name, shape, width, dst, offset / (rows * width));
        return;
      }
    }
    const int64_t rows_per_chunk = chunk_rows(cols);
    if (rows == 0) source_.read_rows(name, shape.dims(), 0, 0, {});  // still checks name and shape
    for (int64_t first = 0; first < rows; first += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, rows - first);
      const std::span<const float> chunk = read_rows(name, shape, first, n);  // [n, cols]
      gathered_.resize(static_cast<size_t>(n * width));
      for (int64_t j = 0; j < blocks; ++j) {
        for (int64_t r = 0; r < n; ++r) {
          std::copy_n(chunk.data() + r * cols + j * width, width, gathered_.data() + r * width);
        }
        write(dst, offset + j * rows * width + first * width, gathered_);
      }
    }
  }
  // copy_column_blocks of a 4-bit tensor into matrices first_matrix, first_matrix + 1, ... of an INT4 weight.
  void copy_int4_column_blocks(const std::string& name, Shape shape, int64_t width, Weight& dst, int64_t first_matrix) {
    DI_CHECK(source_.int4_form(name).has_value(), "tensor ", name, " goes into a packed INT4 weight but is not a ",
             "4-bit weight of the checkpoint");
    const int64_t rows = shape[0], blocks = shape[1] / width, rows_per_chunk = chunk_rows(shape[1]);
    for (int64_t first = 0; first < rows; first += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, rows - first);
      source_.read_int4_rows(name, shape.dims(), first, n, int4_rows_);
      for (int64_t j = 0; j < blocks; ++j) {
        sink_.write_int4(dst, first_matrix + j, first, int4_rows_.columns(j * width, width));
      }
    }
  }

  // copy_column_blocks of a stored FP8 tensor into matrices first_matrix, first_matrix + 1, ... of an FP8 weight: the
  // codes and the scales of each block of columns as they are.
  void copy_fp8_column_blocks(const std::string& name, Shape shape, int64_t width, Weight& dst, int64_t first_matrix) {
    const int64_t rows = shape[0], cols = shape[1], blocks = cols / width;
    const int64_t block_cols = fp8_blocks(cols), width_blocks = width / kFp8Block;
    const int64_t rows_per_chunk = block_chunk_rows(cols);
    std::vector<uint8_t> codes_j;
    std::vector<float> scales_j;
    for (int64_t first = 0; first < rows; first += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, rows - first), nb = fp8_blocks(n);
      codes_.resize(static_cast<size_t>(n * cols));
      scales_.resize(static_cast<size_t>(nb * block_cols));
      source_.read_fp8_rows(name, shape.dims(), first, n, codes_, scales_);
      codes_j.resize(static_cast<size_t>(n * width));
      scales_j.resize(static_cast<size_t>(nb * width_blocks));
      for (int64_t j = 0; j < blocks; ++j) {
        for (int64_t r = 0; r < n; ++r) {
          std::copy_n(codes_.data() + r * cols + j * width, width, codes_j.data() + r * width);
        }
        for (int64_t b = 0; b < nb; ++b) {
          std::copy_n(scales_.data() + b * block_cols + j * width_blocks, width_blocks,
                      scales_j.data() + b * width_blocks);
        }
        sink_.write_fp8(dst, first_matrix + j, first, {.codes = codes_j, .scale_inv = scales_j, .rows = n});
      }
    }
  }

  // Rows [first_row, first_row + count) of source tensor `name`, in the loader's buffer (valid until the next read).
  std::span<const float> read_rows(const std::string& name, Shape shape, int64_t first_row, int64_t count) {
    const int64_t n = count * row_elems(shape);
    if (static_cast<int64_t>(buffer_.size()) < n) buffer_.resize(static_cast<size_t>(n));
    const std::span<float> values(buffer_.data(), static_cast<size_t>(n));
    source_.read_rows(name, shape.dims(), first_row, count, values);
    return values;
  }

  bool contains(const std::string& name) const { return source_.contains(name); }
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const {
    return source_.stored_shape(name);
  }
  void step() {
    ++done_;
    if (progress_) progress_(done_, total_);
  }

 private:
  const WeightSource& source_;
  WeightSink& sink_;
  const QuantizedModules& modules_;
  const LoadProgress& progress_;
  int64_t total_;
  int64_t done_ = 0;
  std::vector<float> buffer_;    // the float32 values on their way from the source to the sink
  std::vector<float> gathered_;  // copy_column_blocks: one chunk's columns of one block
  std::vector<uint8_t> codes_;   // stored FP8 codes on their way to an FP8 sink
  std::vector<float> scales_;    // and their scales
  Int4Rows int4_rows_;           // 4-bit rows on their way to an INT4 sink
};

// gate_proj and up_proj [inter, dim] stacked into gate_up [2 * inter, dim].
MlpWeights load_mlp(Loader& loader, const std::string& prefix, int64_t dim, int64_t inter) {
  MlpWeights w;
  w.gate_up = loader.allocate_stacked(std::vector{prefix + "gate_proj.weight", prefix + "up_proj.weight"},
                                      {2 * inter, dim});
  loader.copy_linear(prefix + "gate_proj.weight", {inter, dim}, 0, inter, w.gate_up, 0);
  loader.copy_linear(prefix + "up_proj.weight", {inter, dim}, 0, inter, w.gate_up, inter * dim);
  w.down = loader.read_linear(prefix + "down_proj.weight", {dim, inter});
  return w;
}

MlaWeights load_mla(Loader& loader, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads, rank = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, v = c.v_head_dim;
  MlaWeights w;
  if (c.q_lora_rank) {
    w.q_a_proj = loader.read_linear(p + "q_a_proj.weight", {*c.q_lora_rank, d});
    w.q_a_norm = loader.read(p + "q_a_layernorm.weight", {*c.q_lora_rank}, WeightRole::kVector);
    w.q_b_proj = loader.read_linear(p + "q_b_proj.weight", {h * c.qk_head_dim(), *c.q_lora_rank});
  } else {
    w.q_proj = loader.read_linear(p + "q_proj.weight", {h * c.qk_head_dim(), d});
  }
  w.kv_a_proj = loader.read_linear(p + "kv_a_proj_with_mqa.weight", {c.latent_dim(), d});
  w.kv_a_norm = loader.read(p + "kv_a_layernorm.weight", {rank}, WeightRole::kVector);

  // kv_b_proj, one head at a time: its nope + v rows are placed as they are, and split into W_UK (transposed to
  // [rank, nope]) and W_UV ([v, rank]) for the absorbed form. It stays in the model dtype, but quantizing at load it
  // holds FP8 values: a bf16 checkpoint's kv_b_proj is rounded to FP8 blocks as DeepSeek's FP8 release stores it (the
  // whole tensor, 0.15% of a V3 layer, is read at once for that). An FP8 checkpoint's is read as stored.
  const Shape kv_b_shape{h * (nope + v), rank};
  const std::string kv_b_name = p + "kv_b_proj.weight";
  std::vector<float> kv_b_rounded;
  if (loader.quantizes_at_load()) {
    const std::span<const float> all = loader.read_rows(kv_b_name, kv_b_shape, 0, kv_b_shape[0]);
    std::vector<uint8_t> codes(all.size());
    std::vector<float> scales(static_cast<size_t>(fp8_blocks(kv_b_shape[0]) * fp8_blocks(rank)));
    quantize_fp8_block_rows(all, kv_b_shape[0], rank, Fp8ScaleFormat::kFloat, codes, scales);
    kv_b_rounded.resize(all.size());
    dequantize_fp8_blocks(codes, kv_b_shape[0], rank, scales, {kFp8Block, kFp8Block}, kv_b_rounded);
  }
  w.kv_b_proj = loader.allocate(kv_b_shape, WeightRole::kMatrix);
  w.w_uk_t = loader.allocate({h, rank, nope}, WeightRole::kMatrix);
  w.w_uv = loader.allocate({h, v, rank}, WeightRole::kMatrix);
  std::vector<float> uk_t(static_cast<size_t>(rank * nope));  // [rank, nope]
  for (int64_t head = 0; head < h; ++head) {
    const std::span<const float> rows =
        kv_b_rounded.empty()
            ? loader.read_rows(kv_b_name, kv_b_shape, head * (nope + v), nope + v)
            : std::span<const float>(kv_b_rounded).subspan(static_cast<size_t>(head * (nope + v) * rank),
                                                           static_cast<size_t>((nope + v) * rank));  // [nope + v, rank]
    const float* k_rows = rows.data();                               // [nope, rank]
    loader.write(w.kv_b_proj, head * (nope + v) * rank, rows);
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t r = 0; r < rank; ++r) uk_t[static_cast<size_t>(r * nope + i)] = k_rows[i * rank + r];
    }
    loader.write(w.w_uk_t, head * rank * nope, uk_t);
    loader.write(w.w_uv, head * v * rank, rows.subspan(static_cast<size_t>(nope * rank)));  // [v, rank]
  }
  w.o_proj = loader.read_linear(p + "o_proj.weight", {d, h * v});
  return w;
}

// The shared experts' MLP, n_shared_experts * I wide, as experts E .. E + s - 1 of the stacked tensors: shared expert j
// is rows [j I, (j + 1) I) of gate_proj and of up_proj, and columns [j I, (j + 1) I) of down_proj. The SwiGLU acts on
// each intermediate channel alone, so the s experts' outputs, each with weight 1, sum to the MLP's output.
void load_shared_experts(Loader& loader, const ModelConfig& c, const std::string& p, MoeWeights& w) {
  const int64_t d = c.hidden_size, e = c.n_routed_experts, inter = c.moe_intermediate_size, s = c.n_shared_experts;
  const Shape up_shape{s * inter, d}, down_shape{d, s * inter};
  for (const auto& [name, shape] : {std::pair{p + "gate_proj.weight", up_shape},
                                    std::pair{p + "up_proj.weight", up_shape},
                                    std::pair{p + "down_proj.weight", down_shape}}) {
    const std::optional<std::vector<int64_t>> stored = loader.stored_shape(name);
    if (!stored) continue;  // a source that makes any shape
    DI_CHECK(std::equal(stored->begin(), stored->end(), shape.dims().begin(), shape.dims().end()), "tensor ", name,
             " has shape ", shape_str(*stored), ", expected ", shape.str(), ": the shared experts run as ",
             "n_shared_experts (", s, ") extra experts of moe_intermediate_size (", inter, "), so their MLP must be ",
             s * inter, " wide");
  }
  for (int64_t j = 0; j < s; ++j) {
    const int64_t slot = (e + j) * 2 * inter * d;  // expert e + j of [E + s, 2I, D]
    loader.copy_linear(p + "gate_proj.weight", up_shape, j * inter, inter, w.experts_gate_up, slot);
    loader.copy_linear(p + "up_proj.weight", up_shape, j * inter, inter, w.experts_gate_up, slot + inter * d);
  }
  loader.copy_column_blocks(p + "down_proj.weight", down_shape, inter, w.experts_down, e * d * inter);
}

// Under expert parallelism the rank's routed experts (whole) are stacked alone and its share of the shared experts is
// an MLP of its own (`shard` says which; `c` is the rank's local_config).
MoeWeights load_moe(Loader& loader, const ModelConfig& c, const std::string& p, const ModelShard& shard) {
  const int64_t d = c.hidden_size, e = c.n_routed_experts, inter = c.moe_intermediate_size, s = c.n_shared_experts;
  const bool ep = shard.expert_parallel && !shard.whole();
  const int64_t first = ep ? shard.first_expert(c) : 0, local = ep ? shard.num_experts(c) : e;
  const int64_t stacked_shared = ep ? 0 : s;
  MoeWeights w;
  w.gate = loader.read(p + "gate.weight", {e, d});
  if (c.version == ModelVersion::kV3) {
    w.correction_bias = loader.read(p + "gate.e_score_correction_bias", {e}, WeightRole::kVector);
  }
  // One expert at a time, into its slice of the stacked tensors; the shared experts after the routed ones.
  // In the first expert's format: packed INT4 when its tensors are 4-bit (every expert's must then be), FP8 when the
  // sink's and an FP8 checkpoint's (every piece's must then be).
  const bool fused = loader.contains(p + "experts.gate_up_proj") && !loader.contains(p + "experts.0.gate_proj.weight");
  std::vector<std::string> gate_up_pieces, down_pieces;  // the source tensors of each stacked weight
  if (fused) {
    gate_up_pieces.push_back(p + "experts.gate_up_proj");
    down_pieces.push_back(p + "experts.down_proj");
  }
  for (int64_t x = 0; x < local && !fused; ++x) {
    const std::string ex = p + "experts." + std::to_string(first + x) + ".";
    gate_up_pieces.insert(gate_up_pieces.end(), {ex + "gate_proj.weight", ex + "up_proj.weight"});
    down_pieces.push_back(ex + "down_proj.weight");
  }
  if (stacked_shared > 0) {
    gate_up_pieces.insert(gate_up_pieces.end(), {p + "shared_experts.gate_proj.weight",
                                                 p + "shared_experts.up_proj.weight"});
    down_pieces.push_back(p + "shared_experts.down_proj.weight");
  }
  w.experts_gate_up = loader.allocate_stacked(gate_up_pieces, {local + stacked_shared, 2 * inter, d});
  w.experts_down = loader.allocate_stacked(down_pieces, {local + stacked_shared, d, inter});
  w.num_shared_experts = stacked_shared;
  w.first_expert = first;
  w.num_routed_experts = e;
  if (fused) {
    // transformers 5 may store the experts fused: gate_up_proj [E, 2I, D], down_proj [E, D, I]; row x is expert x.
    for (int64_t x = 0; x < local; ++x) {
      loader.copy_rows(p + "experts.gate_up_proj", {e, 2 * inter, d}, first + x, 1, w.experts_gate_up,
                       x * 2 * inter * d);
      loader.copy_rows(p + "experts.down_proj", {e, d, inter}, first + x, 1, w.experts_down, x * d * inter);
    }
  } else {
    for (int64_t x = 0; x < local; ++x) {
      const std::string ex = p + "experts." + std::to_string(first + x) + ".";
      loader.copy_linear(ex + "gate_proj.weight", {inter, d}, 0, inter, w.experts_gate_up, x * 2 * inter * d);
      loader.copy_linear(ex + "up_proj.weight", {inter, d}, 0, inter, w.experts_gate_up, (x * 2 + 1) * inter * d);
      loader.copy_linear(ex + "down_proj.weight", {d, inter}, 0, d, w.experts_down, x * d * inter);
    }
  }
  if (s > 0 && ep) {
    // Split by channels under TP; whole under data-parallel attention, where each rank runs them for its own tokens.
    w.shared_mlp = load_mlp(loader, p + "shared_experts.", d, s * inter / (shard.splits_attention() ? shard.size : 1));
  } else if (s > 0) {
    load_shared_experts(loader, c, p + "shared_experts.", w);
  }
  return w;
}

// Decoder layer `i` (a main layer, or the MTP layer's block at i = num_hidden_layers), stored as model.layers.{i}.*.
LayerWeights load_layer(Loader& loader, const ModelConfig& c, int64_t i, const ModelShard& shard) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const int64_t d = c.hidden_size;
  LayerWeights layer;
  layer.input_norm = loader.read(p + "input_layernorm.weight", {d}, WeightRole::kVector);
  layer.post_attention_norm = loader.read(p + "post_attention_layernorm.weight", {d}, WeightRole::kVector);
  layer.attn = load_mla(loader, c, p + "self_attn.");
  if (c.is_moe_layer(i)) {
    layer.moe = load_moe(loader, c, p + "mlp.", shard);
  } else {
    layer.mlp = load_mlp(loader, p + "mlp.", d, c.intermediate_size);
  }
  return layer;
}

}  // namespace

void WeightSource::read_fp8_rows(const std::string& name, std::span<const int64_t>, int64_t, int64_t,
                                 std::span<uint8_t>, std::span<float>) const {
  throw Error(str_cat("tensor ", name, " is not stored as FP8 by this source"));
}

void WeightSource::read_int4_rows(const std::string& name, std::span<const int64_t>, int64_t, int64_t,
                                  Int4Rows&) const {
  throw Error(str_cat("tensor ", name, " is not a 4-bit weight of this source"));
}

std::unique_ptr<WeightSource> open_checkpoint_source(const std::filesystem::path& dir, const ModelConfig& config) {
  if (config.int4.enabled()) return open_int4_checkpoint_source(Checkpoint::open(dir), config);
  if (config.fp4.enabled()) return open_fp4_checkpoint_source(Checkpoint::open(dir), config);
  return std::make_unique<CheckpointSource>(Checkpoint::open(dir), config);
}

std::unique_ptr<WeightSource> make_dummy_source(uint64_t seed) { return std::make_unique<DummySource>(seed); }

ModelWeights load_weights(const ModelConfig& c, const WeightSource& source, WeightSink& sink,
                          const LoadProgress& progress, const ModelShard& shard, bool with_mtp) {
  DI_CHECK_ARG(!with_mtp || c.num_nextn_predict_layers > 0,
               "the checkpoint has no MTP layer (num_nextn_predict_layers is 0 in its config.json): MTP speculative "
               "decoding needs one");
  Loader loader(source, sink, c.quantized_modules, progress, c.num_hidden_layers + 2 + (with_mtp ? 1 : 0));
  ModelWeights w;
  const int64_t d = c.hidden_size;
  w.embed = loader.read("model.embed_tokens.weight", {c.vocab_size, d});
  loader.step();
  w.layers.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    w.layers.push_back(load_layer(loader, c, i, shard));
    loader.step();
  }
  w.norm = loader.read("model.norm.weight", {d}, WeightRole::kVector);
  // Tied embeddings: lm_head is the embedding, read and placed a second time.
  const bool tied = c.tie_word_embeddings && !source.contains("lm_head.weight");
  w.lm_head = loader.read(tied ? "model.embed_tokens.weight" : "lm_head.weight", {c.vocab_size, d});
  if (with_mtp) {
    const int64_t n = c.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(n) + ".";
    DI_CHECK_ARG(source.contains(p + "eh_proj.weight"), "the checkpoint has no MTP layer: its config.json declares ",
                 c.num_nextn_predict_layers, " (num_nextn_predict_layers) but ", p, "* is not stored (a checkpoint "
                 "re-saved by transformers drops it); MTP speculative decoding needs DeepSeek's layer");
    MtpWeights mtp;
    mtp.enorm = loader.read(p + "enorm.weight", {d}, WeightRole::kVector);
    mtp.hnorm = loader.read(p + "hnorm.weight", {d}, WeightRole::kVector);
    // In the model dtype unless an FP8 checkpoint stores it FP8 (DeepSeek-V3's stores it in bf16): Fp8AtLoad.
    mtp.eh_proj = loader.read_linear(p + "eh_proj.weight", {d, 2 * d}, Fp8AtLoad::kKeep);
    mtp.block = load_layer(loader, c, n, shard);
    mtp.head_norm = loader.read(p + "shared_head.norm.weight", {d}, WeightRole::kVector);
    w.mtp = std::move(mtp);
    loader.step();
  }
  loader.finish();
  loader.step();
  return w;
}

std::vector<std::pair<DType, int64_t>> weight_bytes_by_dtype(const ModelWeights& weights) {
  std::map<DType, int64_t> bytes;
  const auto add = [&](const Tensor& t) {
    if (t.numel() > 0) bytes[t.dtype()] += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
  };
  // A packed 4-bit weight's words and zero points count as int4 (or fp4) bytes, its scales as float32.
  const auto add_weight = [&](const Weight& w) {
    if (w.is_packed4()) {
      for (const Tensor* t : {&w.values, &w.zeros}) bytes[w.dtype()] += static_cast<int64_t>(t->view().bytes());
    } else {
      add(w.values);
    }
    add(w.scale_inv);
  };
  add(weights.embed);
  add(weights.norm);
  add(weights.lm_head);
  const auto add_layer = [&](const LayerWeights& layer) {
    add(layer.input_norm);
    add(layer.post_attention_norm);
    const MlaWeights& a = layer.attn;
    for (const Weight* w : {&a.q_proj, &a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.o_proj}) add_weight(*w);
    for (const Tensor* t : {&a.q_a_norm, &a.kv_a_norm, &a.kv_b_proj, &a.w_uk_t, &a.w_uv}) add(*t);
    if (layer.mlp) {
      add_weight(layer.mlp->gate_up);
      add_weight(layer.mlp->down);
    }
    if (layer.moe) {
      if (layer.moe->shared_mlp) {
        add_weight(layer.moe->shared_mlp->gate_up);
        add_weight(layer.moe->shared_mlp->down);
      }
      add(layer.moe->gate);
      add(layer.moe->correction_bias);
      add_weight(layer.moe->experts_gate_up);
      add_weight(layer.moe->experts_down);
    }
  };
  for (const LayerWeights& layer : weights.layers) add_layer(layer);
  if (weights.mtp) {
    add(weights.mtp->enorm);
    add(weights.mtp->hnorm);
    add_weight(weights.mtp->eh_proj);
    add_layer(weights.mtp->block);
    add(weights.mtp->head_norm);
  }
  return {bytes.begin(), bytes.end()};
}

ModelWeights load_weights(const ModelConfig& c, const WeightSource& source, const LoadProgress& progress) {
  const std::unique_ptr<WeightSink> sink = make_host_sink();
  return load_weights(c, source, *sink, progress);
}

}  // namespace deepinfer
