#include "model/weight_sink.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"

namespace deepinfer {
namespace {

// At most this many bfloat16 values are staged at once (8 MiB).
constexpr int64_t kStagingElements = int64_t{1} << 22;
constexpr int64_t kParallelElements = int64_t{1} << 16;

void check_write(const Tensor& dst, int64_t offset, size_t count) {
  DI_CHECK(offset >= 0 && offset + static_cast<int64_t>(count) <= dst.numel(), "weight write of ", count,
           " values at element ", offset, " is out of range for a tensor of shape ", dst.shape().str());
}

// Elements [offset, offset + count) of `dst`, as a 1-D view.
TensorView flat_range(const Tensor& dst, int64_t offset, int64_t count) {
  return dst.view().reshaped({dst.numel()}).rows(offset, count);
}

// Where a sink's tensors live: host memory, or a backend's device.
class Placement {
 public:
  virtual ~Placement() = default;
  virtual Tensor empty(Shape shape, DType dtype) = 0;
  // Host elements into `dst` (same dtype and count).
  virtual void put(ConstTensorView host, TensorView dst) = 0;
  // The backend whose device holds the tensors, which may make dummy weights there; nullptr for host memory.
  virtual Backend* backend() { return nullptr; }
};

class HostPlacement final : public Placement {
 public:
  Tensor empty(Shape shape, DType dtype) override { return Tensor::empty(shape, dtype); }
  void put(ConstTensorView host, TensorView dst) override {
    DI_CHECK(dst.device == Device::kCpu || dst.numel() == 0, "host sink: the destination is not in host memory");
    if (host.numel() > 0) std::memcpy(dst.data, host.data, host.numel() * dtype_size(host.dtype));
  }
};

class BackendPlacement final : public Placement {
 public:
  explicit BackendPlacement(Backend& backend) : backend_(backend) {}
  Tensor empty(Shape shape, DType dtype) override { return backend_.empty(shape, dtype); }
  void put(ConstTensorView host, TensorView dst) override { backend_.copy_to_device(host, dst); }
  Backend* backend() override { return &backend_; }

 private:
  Backend& backend_;
};

// One FP8 block row of a linear weight, collecting its rows before it is quantized.
struct PendingBlockRow {
  std::vector<float> values;  // [rows, cols]
  int64_t rows = 0;           // rows of the block row (128, or fewer at the matrix's end)
  int64_t written = 0;
};

class Sink final : public WeightSink {
 public:
  // emulate_fp8: linear weights are float32 tensors holding the dequantized FP8 values (format.fp8 must be set).
  Sink(std::unique_ptr<Placement> placement, DType matrix_dtype, WeightFormat format, bool emulate_fp8)
      : placement_(std::move(placement)), matrix_dtype_(matrix_dtype), format_(format), emulate_fp8_(emulate_fp8) {
    DI_CHECK(matrix_dtype == DType::kF32 || matrix_dtype == DType::kBF16,
             "weights can be placed as float32 or bfloat16, not ", dtype_name(matrix_dtype));
  }

  Tensor allocate(Shape shape, WeightRole role) override {
    Tensor t = placement_->empty(shape, role == WeightRole::kVector ? DType::kF32 : matrix_dtype_);
    if (emulate_fp8_) emulated_.erase(t.cview().data);  // memory an emulated FP8 weight freed may come back here
    return t;
  }

  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    check_write(dst, offset, values.size());
    const auto count = static_cast<int64_t>(values.size());
    if (dst.dtype() == DType::kF32) {
      placement_->put(ConstTensorView(values.data(), DType::kF32, {count}, Device::kCpu),
                      flat_range(dst, offset, count));
      return;
    }
    DI_CHECK(dst.dtype() == DType::kBF16, "weight sink: cannot write float32 values into a ",
             dtype_name(dst.dtype()), " tensor");
    staging_.resize(static_cast<size_t>(std::min(count, kStagingElements)));
    for (int64_t begin = 0; begin < count; begin += kStagingElements) {
      const int64_t n = std::min(kStagingElements, count - begin);
      const float* src = values.data() + begin;
      uint16_t* bits = staging_.data();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (int64_t i = 0; i < n; ++i) bits[i] = float_to_bf16(src[i]);
      placement_->put(ConstTensorView(bits, DType::kBF16, {n}, Device::kCpu), flat_range(dst, offset + begin, n));
    }
  }

  Weight allocate_linear(Shape shape) override {
    DI_CHECK(shape.ndim() == 2 || shape.ndim() == 3, "a linear weight is 2-D or 3-D (stacked experts), got ",
             shape.str());
    if (!format_.fp8) return Weight(allocate(shape, WeightRole::kMatrix));
    if (emulate_fp8_) {
      Tensor values = placement_->empty(shape, DType::kF32);
      if (values.numel() > 0) emulated_.insert(values.cview().data);
      return Weight(std::move(values));
    }
    return Weight(placement_->empty(shape, DType::kF8E4M3), placement_->empty(fp8_scale_shape(shape), DType::kF32),
                  format_.fp8_activations);
  }

  void write(Weight& dst, int64_t offset, std::span<const float> values) override {
    DI_CHECK(!dst.is_packed4(), "weight sink: float32 values cannot be written into a packed 4-bit weight ",
             dst.shape().str(), " (its rows come from the source in 4 bits)");
    // By the weight, not the sink's format: an FP8 sink's loader keeps some linear layers plain (weight_sink.h).
    if (!is_fp8_weight(dst)) {
      write(dst.values, offset, values);
      return;
    }
    check_write(dst.values, offset, values.size());
    const int64_t rows = dst.shape()[dst.shape().ndim() - 2], cols = dst.shape()[dst.shape().ndim() - 1];
    const auto count = static_cast<int64_t>(values.size());
    DI_CHECK(cols > 0 && offset % cols == 0 && count % cols == 0, "FP8 weight ", dst.shape().str(),
             ": writes must be whole rows, got ", count, " values at element ", offset);
    for (int64_t i = 0; i < count / cols;) {
      const int64_t row = offset / cols + i, matrix = row / rows, r = row % rows, block_row = r / kFp8Block;
      const std::pair<const void*, int64_t> key{dst.values.view().data, matrix * fp8_blocks(rows) + block_row};
      // Whole block rows arriving together (the loader's chunks are block-row aligned) are quantized from `values`
      // directly, in one piece; rows of a block row written in parts wait in a pending slab.
      if (r % kFp8Block == 0 && !pending_.contains(key)) {
        const int64_t available = std::min(count / cols - i, rows - r);
        const int64_t whole = available == rows - r ? available : available / kFp8Block * kFp8Block;
        if (whole > 0) {
          quantize_rows(dst, matrix, r, values.subspan(static_cast<size_t>(i * cols), static_cast<size_t>(whole * cols)),
                        whole);
          i += whole;
          continue;
        }
      }
      PendingBlockRow& pending = pending_[key];
      if (pending.values.empty()) {
        pending.rows = std::min(kFp8Block, rows - block_row * kFp8Block);
        pending.values.resize(static_cast<size_t>(pending.rows * cols));
      }
      std::copy_n(values.data() + i * cols, cols, pending.values.data() + (r % kFp8Block) * cols);
      if (++pending.written == pending.rows) {
        const PendingBlockRow done = std::move(pending);
        pending_.erase(key);
        quantize_rows(dst, matrix, block_row * kFp8Block, done.values, done.rows);
      }
      ++i;
    }
  }

  bool fill_normal(Tensor& dst, int64_t offset, int64_t count, const dummy_normal::StreamRange& range) override {
    Backend* const backend = placement_->backend();
    if (backend == nullptr || count == 0) return false;
    check_write(dst, offset, static_cast<size_t>(count));
    return backend->fill_dummy_normal(flat_range(dst, offset, count), range);
  }

  bool fill_normal(Weight& dst, int64_t offset, int64_t count, const dummy_normal::StreamRange& range) override {
    if (dst.is_packed4() || emulate_fp8_) return false;
    if (!is_fp8_weight(dst)) return fill_normal(dst.values, offset, count, range);
    Backend* const backend = placement_->backend();
    if (backend == nullptr || count == 0 || format_.scale_format != Fp8ScaleFormat::kFloat) return false;
    // Whole 128-row blocks of one matrix only (rows arriving in parts wait in pending_ and are quantized on the host).
    const Shape& shape = dst.shape();
    const int64_t rows = shape[shape.ndim() - 2], cols = shape[shape.ndim() - 1];
    if (cols == 0 || range.row_length != cols || offset % cols != 0 || count % cols != 0) return false;
    const int64_t n = count / cols, matrix = offset / cols / rows, row = offset / cols % rows;
    if (row % kFp8Block != 0 || row + n > rows || (n % kFp8Block != 0 && row + n != rows)) return false;
    check_write(dst.values, offset, static_cast<size_t>(count));
    const int64_t block_cols = fp8_blocks(cols), first_block_row = matrix * fp8_blocks(rows) + row / kFp8Block;
    const TensorView codes = flat_range(dst.values, offset, count).reshaped({n, cols});
    const TensorView scales = flat_range(dst.scale_inv, first_block_row * block_cols, fp8_blocks(n) * block_cols)
                                  .reshaped({fp8_blocks(n), block_cols});
    return backend->fill_dummy_normal_fp8(codes, scales, range);
  }

  bool fp8_linear() const override { return format_.fp8; }
  bool takes_fp8() const override { return format_.fp8 && !emulate_fp8_; }
  // Emulated FP8 weights are float32 like plain ones, so the sink remembers which tensors it allocated as FP8.
  bool is_fp8_weight(const Weight& w) const override {
    return emulate_fp8_ ? w.numel() > 0 && emulated_.contains(w.values.cview().data) : w.is_fp8();
  }

  void write_fp8(Weight& dst, int64_t matrix, int64_t first_row, const Fp8Rows& piece) override {
    DI_CHECK(takes_fp8() && dst.is_fp8(), "weight sink: stored FP8 codes go only into an FP8 weight");
    const Shape& shape = dst.shape();
    const int64_t rows = shape[shape.ndim() - 2], cols = shape[shape.ndim() - 1];
    const int64_t matrices = shape.ndim() == 3 ? shape[0] : 1, block_cols = fp8_blocks(cols);
    DI_CHECK(matrix >= 0 && matrix < matrices && first_row % kFp8Block == 0 && first_row + piece.rows <= rows &&
                 static_cast<int64_t>(piece.codes.size()) == piece.rows * cols &&
                 static_cast<int64_t>(piece.scale_inv.size()) == fp8_blocks(piece.rows) * block_cols,
             "FP8 weight ", shape.str(), ": ", piece.rows, " stored rows (", piece.codes.size(), " codes, ",
             piece.scale_inv.size(), " scales) at row ", first_row, " of matrix ", matrix, " do not fit");
    const int64_t code_at = (matrix * rows + first_row) * cols;
    placement_->put(ConstTensorView(piece.codes.data(), DType::kF8E4M3, {piece.rows * cols}, Device::kCpu),
                    flat_range(dst.values, code_at, piece.rows * cols));
    const int64_t scale_at = (matrix * fp8_blocks(rows) + first_row / kFp8Block) * block_cols;
    const int64_t scales = static_cast<int64_t>(piece.scale_inv.size());
    placement_->put(ConstTensorView(piece.scale_inv.data(), DType::kF32, {scales}, Device::kCpu),
                    flat_range(dst.scale_inv, scale_at, scales));
  }

  bool takes_int4() const override { return format_.int4; }

  Weight allocate_int4(Shape shape, const Int4Form& form) override {
    DI_CHECK(takes_int4(), "weight sink: this sink keeps no INT4 weight");
    const int nd = shape.ndim();
    DI_CHECK(nd == 2 || nd == 3, "an INT4 weight is 2-D or 3-D (stacked experts), got ", shape.str());
    const int64_t k = shape[nd - 1];
    DI_CHECK(k % 8 == 0 && form.group_size > 0 && k % form.group_size == 0 && form.group_size % 8 == 0,
             "INT4 weight ", shape.str(), " with groups of ", form.group_size, ": K must be a multiple of 8 and of a ",
             "group size that is itself a multiple of 8");
    const int64_t groups = k / form.group_size;
    if (form.e2m1) {
      DI_CHECK(form.symmetric, "FP4 weight ", shape.str(), ": e2m1 codes have no zero points");
      return Weight::fp4_packed(placement_->empty(shape.with_dim(-1, k / 8), DType::kI32),
                                placement_->empty(shape.with_dim(-1, groups), DType::kF32));
    }
    return Weight::int4_packed(
        placement_->empty(shape.with_dim(-1, k / 8), DType::kI32),
        placement_->empty(shape.with_dim(-1, groups), DType::kF32),
        form.symmetric ? Tensor() : placement_->empty(shape.with_dim(-1, int4_zero_words(groups)), DType::kI32));
  }

  void write_int4(Weight& dst, int64_t matrix, int64_t first_row, const Int4Rows& piece) override {
    DI_CHECK(takes_int4() && dst.is_packed4() && piece.e2m1 == dst.is_fp4(), "weight sink: ",
             piece.e2m1 ? "FP4" : "INT4", " rows go only into an ", piece.e2m1 ? "FP4" : "INT4", " weight, not into ",
             dst.is_packed4() ? (dst.is_fp4() ? "an FP4" : "an INT4") : "an unpacked", " one");
    const Shape shape = dst.shape();
    const int nd = shape.ndim();
    const int64_t rows = shape[nd - 2], cols = shape[nd - 1], matrices = nd == 3 ? shape[0] : 1;
    const int64_t groups = dst.scale_inv.shape()[nd - 1];
    DI_CHECK(matrix >= 0 && matrix < matrices && first_row >= 0 && first_row + piece.rows <= rows &&
                 piece.cols == cols && piece.groups() == groups && piece.symmetric() == !dst.has_zeros(),
             "INT4 weight ", shape.str(), " (", groups, " groups a row, ", dst.has_zeros() ? "zero points" :
             "symmetric", "): ", piece.rows, " rows of ", piece.cols, " (", piece.groups(), " groups, ",
             piece.symmetric() ? "symmetric" : "zero points", ") at row ", first_row, " of matrix ", matrix,
             " do not fit");
    const int64_t row = matrix * rows + first_row;
    words_.resize(static_cast<size_t>(piece.rows * cols / 8));
    pack_int4_codes(piece, words_);
    put_words(words_, dst.values, row * cols / 8);
    placement_->put(ConstTensorView(piece.scales.data(), DType::kF32, {piece.rows * groups}, Device::kCpu),
                    flat_range(dst.scale_inv, row * groups, piece.rows * groups));
    if (piece.symmetric()) return;
    const int64_t zero_words = int4_zero_words(groups);
    words_.resize(static_cast<size_t>(piece.rows * zero_words));
    pack_int4_zeros(piece, words_);
    put_words(words_, dst.zeros, row * zero_words);
  }

  void finish() override {
    DI_CHECK(pending_.empty(), "weight sink: ", pending_.size(), " FP8 block rows were written only in part");
  }

 private:
  // Quantizes `num_rows` rows of matrix `matrix` from `first_row` on (whole block rows: first_row on a block edge,
  // num_rows a multiple of 128 unless they end the matrix) and places them: codes and scales, or (emulating) their
  // dequantized values.
  void quantize_rows(Weight& dst, int64_t matrix, int64_t first_row, std::span<const float> values, int64_t num_rows) {
    const Shape& shape = dst.shape();
    const int64_t rows = shape[shape.ndim() - 2], cols = shape[shape.ndim() - 1];
    codes_.resize(values.size());
    scales_.resize(static_cast<size_t>(fp8_blocks(num_rows) * fp8_blocks(cols)));
    quantize_fp8_block_rows(values, num_rows, cols, format_.scale_format, codes_, scales_);
    if (emulate_fp8_) {
      dequantized_.resize(values.size());
      dequantize_fp8_blocks(codes_, num_rows, cols, scales_, {kFp8Block, kFp8Block}, dequantized_);
      write(dst.values, (matrix * rows + first_row) * cols, dequantized_);
      return;
    }
    write_fp8(dst, matrix, first_row, {.codes = codes_, .scale_inv = scales_, .rows = num_rows});
  }

  void put_words(std::span<const int32_t> words, Tensor& dst, int64_t offset) {
    const auto n = static_cast<int64_t>(words.size());
    placement_->put(ConstTensorView(words.data(), DType::kI32, {n}, Device::kCpu), flat_range(dst, offset, n));
  }

  std::unique_ptr<Placement> placement_;
  DType matrix_dtype_;
  WeightFormat format_;
  bool emulate_fp8_;
  std::vector<uint16_t> staging_;  // bfloat16 bits of the chunk being copied
  std::map<std::pair<const void*, int64_t>, PendingBlockRow> pending_;  // (weight, block row over its matrices)
  // Emulating: the memory of each FP8 weight allocate_linear made (and allocate has not given out since). Like
  // pending_'s keys, valid while the weights live (a load), which is when the sink writes them.
  std::set<const void*> emulated_;
  std::vector<uint8_t> codes_;
  std::vector<float> scales_, dequantized_;
  std::vector<int32_t> words_;  // an INT4 piece's packed codes or zero points on their way
};

}  // namespace

void WeightSink::write_fp8(Weight&, int64_t, int64_t, const Fp8Rows&) {
  throw Error("this weight sink does not take stored FP8 weights (takes_fp8() is false)");
}

Weight WeightSink::allocate_int4(Shape, const Int4Form&) {
  throw Error("this weight sink keeps no INT4 weight (takes_int4() is false)");
}

void WeightSink::write_int4(Weight&, int64_t, int64_t, const Int4Rows&) {
  throw Error("this weight sink keeps no INT4 weight (takes_int4() is false)");
}

std::unique_ptr<WeightSink> make_host_sink(WeightFormat format) {
  return std::make_unique<Sink>(std::make_unique<HostPlacement>(), DType::kF32, format, false);
}

std::unique_ptr<WeightSink> make_fp8_emulating_host_sink(Fp8ScaleFormat scale_format) {
  return std::make_unique<Sink>(std::make_unique<HostPlacement>(), DType::kF32,
                                WeightFormat{.fp8 = true, .fp8_activations = false, .scale_format = scale_format}, true);
}

std::unique_ptr<WeightSink> make_backend_sink(Backend& backend, WeightFormat format) {
  return std::make_unique<Sink>(std::make_unique<BackendPlacement>(backend), backend.activation_dtype(), format,
                                false);
}

}  // namespace deepinfer
