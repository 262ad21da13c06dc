#include "model/packed_source.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {

bool PackedWeightSource::contains(const std::string& name) const {
  return checkpoint_.contains(name) || packed_.contains(name);
}

std::optional<std::vector<int64_t>> PackedWeightSource::stored_shape(const std::string& name) const {
  if (const auto it = packed_.find(name); it != packed_.end()) return std::vector{it->second.rows, it->second.cols};
  return checkpoint_.get(name).shape;
}

void PackedWeightSource::read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row,
                                   int64_t num_rows, std::span<float> out) const {
  const auto it = packed_.find(name);
  if (it == packed_.end()) {
    checkpoint_.read_rows_f32(name, shape, first_row, num_rows, out);
    return;
  }
  const std::vector<int64_t> stored{it->second.rows, it->second.cols};
  DI_CHECK(std::equal(stored.begin(), stored.end(), shape.begin(), shape.end()), "tensor ", name,
           " (stored packed as ", it->second.tensor, ") has shape ", shape_str(stored), ", expected ",
           shape_str(shape));
  read_packed_rows(name, first_row, num_rows, out);
}

void PackedWeightSource::add_packed(const std::string& logical, const std::string& packed, int64_t rows,
                                    int64_t cols) {
  DI_CHECK_ARG(!checkpoint_.contains(logical) || logical == packed, "checkpoint ", checkpoint_.dir(),
               " stores both ", logical, " and its packed form ", packed);
  packed_.insert_or_assign(logical, Packed{.tensor = packed, .rows = rows, .cols = cols});
}

const TensorInfo& PackedWeightSource::require(const std::string& name, const std::string& of) const {
  DI_CHECK_ARG(checkpoint_.contains(name), "packed weight ", of, " has no ", name, " in checkpoint ",
               checkpoint_.dir());
  return checkpoint_.get(name);
}

std::array<int64_t, 2> read_weight_shape(const TensorInfo& t) {
  DI_CHECK_ARG(t.supported && (t.dtype == DType::kI64 || t.dtype == DType::kI32) && t.numel() == 2, "tensor ",
               t.name, " (", t.dtype_tag, " ", shape_str(t.shape),
               ") is not the 2 integers {N, K} of a linear weight's shape");
  std::array<int64_t, 2> dims{};
  for (size_t i = 0; i < 2; ++i) {
    if (t.dtype == DType::kI64) {
      std::memcpy(&dims[i], t.bytes.data() + 8 * i, 8);
    } else {
      int32_t d;
      std::memcpy(&d, t.bytes.data() + 4 * i, 4);
      dims[i] = d;
    }
  }
  return dims;
}

}  // namespace deepinfer
