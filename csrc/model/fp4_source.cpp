#include "model/fp4_source.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "model/fp4.h"
#include "model/int4.h"
#include "model/int4_source.h"
#include "model/packed_source.h"

namespace deepinfer {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_u8(const TensorInfo& t) { return t.dtype_tag == "U8"; }

// Where one FP4 weight's tensors are, and what its scales are.
struct Fp4Entry {
  std::string codes, scales;
  float tensor_scale = 1.0f;  // NVFP4's per-tensor factor, already inverted where the layout stores a divisor
  int64_t rows = 0, cols = 0;
};

class Fp4CheckpointSource final : public PackedWeightSource {
 public:
  Fp4CheckpointSource(Checkpoint checkpoint, const ModelConfig& config)
      : PackedWeightSource(std::move(checkpoint)), format_(config.fp4.format), group_size_(config.fp4.group_size) {
    DI_CHECK(config.fp4.enabled(), "internal: an FP4 source for a checkpoint without FP4 weights");
    const bool modelopt = format_ == Fp4Format::kNvfp4ModelOpt;
    // ModelOpt keeps the name X.weight for the packed codes (an FP4 layer is one whose X.weight is U8);
    // compressed-tensors stores them as X.weight_packed.
    const std::string_view suffix = modelopt ? ".weight" : ".weight_packed";
    for (const std::string& name : checkpoint_.names()) {
      if (!ends_with(name, suffix) || (modelopt && !is_u8(checkpoint_.get(name)))) continue;
      const std::string module = name.substr(0, name.size() - suffix.size());
      Fp4Entry e = index(module, name);
      add_packed(module + ".weight", name, e.rows, e.cols);
      entries_.emplace(module + ".weight", std::move(e));
    }
    DI_CHECK_ARG(has_packed(), "checkpoint ", checkpoint_.dir(), ": its quantization config says ", format_name(),
                 " weights, but no tensor is stored in that layout (", modelopt ? "U8 *.weight" : "*.weight_packed",
                 ")");
  }

 private:
  const char* format_name() const {
    switch (format_) {
      case Fp4Format::kNvfp4CompressedTensors: return "compressed-tensors NVFP4";
      case Fp4Format::kMxfp4CompressedTensors: return "compressed-tensors MXFP4";
      case Fp4Format::kNvfp4ModelOpt: return "ModelOpt NVFP4";
      case Fp4Format::kNone: break;
    }
    return "no FP4";
  }

  // A device that keeps 4-bit weights packed (core/weight.h) gets the codes as stored and the scales decoded.
  std::optional<Int4Form> int4_form(const std::string& name) const override {
    if (!entries_.contains(name)) return std::nullopt;
    return Int4Form{.group_size = group_size_, .symmetric = true, .e2m1 = true};
  }

  void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                      Int4Rows& out) const override {
    const auto it = entries_.find(name);
    DI_CHECK(it != entries_.end(), "tensor ", name, " is not stored in FP4");
    const Fp4Entry& e = it->second;
    DI_CHECK(shape.size() == 2 && shape[0] == e.rows && shape[1] == e.cols, "tensor ", name, " is read as ",
             shape_str(shape), " but is stored as FP4 [", e.rows, ", ", e.cols, "]");
    DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= e.rows, "rows [", first_row, ", ",
             first_row + num_rows, ") out of range for FP4 weight ", name, " of ", e.rows, " rows");
    out.resize(num_rows, e.cols, group_size_, /*is_symmetric=*/true);
    out.e2m1 = true;
    const auto* codes =
        reinterpret_cast<const uint8_t*>(checkpoint_.get(e.codes).bytes.data()) + first_row * e.cols / 2;
    for (int64_t i = 0; i < num_rows * e.cols / 2; ++i) {
      out.q[static_cast<size_t>(2 * i)] = codes[i] & 0xfu;  // element k even: the low nibble
      out.q[static_cast<size_t>(2 * i + 1)] = codes[i] >> 4;
    }
    const int64_t groups = e.cols / group_size_;
    decode_scales(e, first_row * groups, num_rows * groups, out.scales);
  }

  void read_packed_rows(const std::string& name, int64_t first_row, int64_t num_rows,
                        std::span<float> out) const override {
    // The rows' codes and scales only: the loader reads a large weight a piece at a time.
    const Fp4Entry& e = entries_.at(name);
    DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= e.rows, "rows [", first_row, ", ",
             first_row + num_rows, ") out of range for FP4 weight ", name, " of ", e.rows, " rows");
    if (num_rows == 0) return;
    const int64_t groups = e.cols / group_size_;
    std::vector<float> scales(static_cast<size_t>(num_rows * groups));
    decode_scales(e, first_row * groups, num_rows * groups, scales);
    const auto codes = checkpoint_.get(e.codes).bytes.subspan(static_cast<size_t>(first_row * e.cols / 2),
                                                              static_cast<size_t>(num_rows * e.cols / 2));
    const PackedFp4 w{.rows = num_rows, .cols = e.cols, .group_size = group_size_, .codes = codes, .scales = scales};
    dequantize_fp4_rows(w, 0, num_rows, out);
  }

  // The one float32 value of a per-tensor scale (shape [], [1] or, for a fused projection, all equal).
  float tensor_scale(const std::string& name, const std::string& of) const {
    const TensorInfo& t = require(name, of);
    DI_CHECK_ARG(t.supported && t.dtype == DType::kF32 && t.numel() >= 1, "tensor ", name, " is ", t.dtype_tag, " ",
                 shape_str(t.shape), "; the per-tensor scale of ", of, " is one F32 value");
    std::vector<float> values(static_cast<size_t>(t.numel()));
    checkpoint_.read_f32(name, t.shape, values);
    DI_CHECK_ARG(std::all_of(values.begin(), values.end(), [&](float v) { return v == values[0]; }), "tensor ", name,
                 " holds ", values.size(), " different per-tensor scales; one is supported");
    DI_CHECK_ARG(std::isfinite(values[0]) && values[0] > 0.0f, "tensor ", name, " is ", values[0],
                 "; a per-tensor scale must be finite and > 0");
    return values[0];
  }

  Fp4Entry index(const std::string& module, const std::string& codes_name) const {
    Fp4Entry e{.codes = codes_name, .scales = module + ".weight_scale"};
    const TensorInfo& codes = checkpoint_.get(codes_name);
    DI_CHECK_ARG(is_u8(codes) && codes.shape.size() == 2 && codes.shape[0] > 0 && codes.shape[1] > 0, "tensor ",
                 codes_name, " is ", codes.dtype_tag, " ", shape_str(codes.shape), "; FP4 weights are U8 [N, K / 2], ",
                 "two e2m1 values a byte");
    e.rows = codes.shape[0];
    e.cols = 2 * codes.shape[1];
    if (format_ == Fp4Format::kNvfp4CompressedTensors) {
      const TensorInfo& shape_t = require(module + ".weight_shape", codes_name);
      check_weight_shape(shape_t, e);
    }
    DI_CHECK_ARG(e.cols % group_size_ == 0, "FP4 weight ", codes_name, " [", e.rows, ", ", e.cols, "]: K = ", e.cols,
                 " is not a multiple of the group size ", group_size_);
    const std::vector<int64_t> scale_shape{e.rows, e.cols / group_size_};
    const TensorInfo& scales = require(e.scales, codes_name);
    const bool mx = format_ == Fp4Format::kMxfp4CompressedTensors;
    const bool scale_dtype_ok = mx ? (is_u8(scales) || scales.dtype_tag == "F8_E8M0")
                                   : (scales.supported && scales.dtype == DType::kF8E4M3);
    DI_CHECK_ARG(scale_dtype_ok, "tensor ", e.scales, " is ", scales.dtype_tag, "; ",
                 mx ? "MXFP4 group scales are E8M0 exponents (U8 or F8_E8M0)" : "NVFP4 group scales are F8_E4M3");
    DI_CHECK_ARG(std::equal(scales.shape.begin(), scales.shape.end(), scale_shape.begin(), scale_shape.end()),
                 "tensor ", e.scales, " has shape ", shape_str(scales.shape), ", expected ", shape_str(scale_shape),
                 " (one scale per ", group_size_, " inputs of each row of ", codes_name, ")");
    if (format_ == Fp4Format::kNvfp4CompressedTensors) {
      e.tensor_scale = 1.0f / tensor_scale(module + ".weight_global_scale", codes_name);  // stored as a divisor
    } else if (format_ == Fp4Format::kNvfp4ModelOpt) {
      e.tensor_scale = tensor_scale(module + ".weight_scale_2", codes_name);
    }
    return e;
  }

  // compressed-tensors records the unpacked shape {N, K}: it must be what the packed codes hold.
  static void check_weight_shape(const TensorInfo& shape_t, const Fp4Entry& e) {
    const auto [rows, cols] = read_weight_shape(shape_t);
    DI_CHECK_ARG(rows == e.rows && cols == e.cols, "tensor ", shape_t.name, " says [", rows, ", ", cols, "], but ",
                 e.codes, " holds [", e.rows, ", ", e.cols, "] (two values a byte along K)");
  }

  // Scales [first, first + out.size()) of `e` in row-major order, as float32 (NVFP4's tensor factor applied).
  void decode_scales(const Fp4Entry& e, int64_t first, int64_t count, std::span<float> out) const {
    const TensorInfo& t = checkpoint_.get(e.scales);
    DI_CHECK(first >= 0 && first + count <= t.numel() && static_cast<int64_t>(out.size()) == count, "scales [", first,
             ", ", first + count, ") of ", e.scales, " (", t.numel(), " values)");
    const auto* bytes = reinterpret_cast<const uint8_t*>(t.bytes.data()) + first;
    const bool mx = format_ == Fp4Format::kMxfp4CompressedTensors;
    for (int64_t i = 0; i < count; ++i) {
      out[static_cast<size_t>(i)] = mx ? e8m0_to_float(bytes[i]) : e4m3_to_float(bytes[i]) * e.tensor_scale;
    }
  }

  Fp4Format format_;
  int64_t group_size_;
  std::map<std::string, Fp4Entry, std::less<>> entries_;  // by the plain name the loader asks for (X.weight)
};

// Random weights rounded to FP4 as they are read (make_fp4_rounding_source).
class Fp4RoundingSource final : public WeightSource {
 public:
  Fp4RoundingSource(std::unique_ptr<WeightSource> inner, const Fp4Config& fp4, QuantizedModules modules)
      : inner_(std::move(inner)),
        modules_(std::move(modules)),
        group_size_(fp4.group_size),
        scaling_(fp4.format == Fp4Format::kMxfp4CompressedTensors ? Fp4Scaling::kMxfp4 : Fp4Scaling::kNvfp4) {
    DI_CHECK(fp4.enabled() && group_size_ > 0, "internal: FP4 rounding without an FP4 format");
  }

  bool contains(const std::string& name) const override { return inner_->contains(name); }
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const override {
    return inner_->stored_shape(name);
  }
  std::optional<Int4Form> int4_form(const std::string& name) const override {
    if (!rounds(name)) return std::nullopt;
    return Int4Form{.group_size = group_size_, .symmetric = true, .e2m1 = true};
  }
  void read_int4_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                      Int4Rows& out) const override {
    DI_CHECK(shape.size() == 2 && shape[1] % group_size_ == 0, "tensor ", name, " of shape ", shape_str(shape),
             ": FP4 rounding reads 2-D weights whose K is a multiple of ", group_size_);
    std::vector<float> values(static_cast<size_t>(num_rows * shape[1]));
    inner_->read_rows(name, shape, first_row, num_rows, values);
    out.resize(num_rows, shape[1], group_size_, /*is_symmetric=*/true);
    out.e2m1 = true;
    round_fp4(values, shape[1], group_size_, scaling_, out.q, out.scales);
  }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    if (!rounds(name) || shape.size() != 2) return inner_->read_rows(name, shape, first_row, num_rows, out);
    Int4Rows rows;
    read_int4_rows(name, shape, first_row, num_rows, rows);
    rows.dequantize(out);
  }

 private:
  // The 2-D linear weights of the checkpoint's FP4 layers, where their K takes whole groups.
  bool rounds(const std::string& name) const {
    if (!is_int4_linear(name) || !ends_with(name, ".weight") || !modules_.quantizes(module_of(name))) return false;
    const std::optional<std::vector<int64_t>> shape = inner_->stored_shape(name);
    return !shape || (shape->size() == 2 && (*shape)[1] % group_size_ == 0);
  }

  std::unique_ptr<WeightSource> inner_;
  QuantizedModules modules_;
  int64_t group_size_;
  Fp4Scaling scaling_;
};

}  // namespace

std::unique_ptr<WeightSource> make_fp4_rounding_source(std::unique_ptr<WeightSource> inner, const Fp4Config& fp4,
                                                       const QuantizedModules& modules) {
  return std::make_unique<Fp4RoundingSource>(std::move(inner), fp4, modules);
}

std::unique_ptr<WeightSource> open_fp4_checkpoint_source(Checkpoint checkpoint, const ModelConfig& config) {
  return std::make_unique<Fp4CheckpointSource>(std::move(checkpoint), config);
}

}  // namespace deepinfer
