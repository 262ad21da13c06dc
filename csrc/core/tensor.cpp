#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace deepinfer {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  DI_CHECK(dims.size() <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions, got ", dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    DI_CHECK(dims[i] >= 0, "negative dimension ", dims[i]);
    dims_[i] = dims[i];
  }
  ndim_ = static_cast<int>(dims.size());
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (ndim_ != other.ndim_) return false;
  for (int i = 0; i < ndim_; ++i) {
    if (dims_[static_cast<size_t>(i)] != other.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string out = "[";
  for (int i = 0; i < ndim_; ++i) out += str_cat(i ? ", " : "", dims_[static_cast<size_t>(i)]);
  return out + "]";
}

Buffer::Buffer(void* data, size_t bytes, Device device, Deleter deleter, void* context) noexcept
    : data_(data), bytes_(bytes), device_(device), deleter_(deleter), context_(context) {}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(other.data_),
      bytes_(other.bytes_),
      device_(other.device_),
      deleter_(other.deleter_),
      context_(other.context_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    deleter_ = other.deleter_;
    context_ = other.context_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() noexcept {
  if (data_ != nullptr && deleter_ != nullptr) deleter_(data_, context_);
  data_ = nullptr;
  bytes_ = 0;
}

Buffer allocate_host(size_t bytes) {
  if (bytes == 0) return {};
  constexpr size_t kAlign = 64;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  DI_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
  return Buffer(p, bytes, Device::kCpu, [](void* q, void*) { std::free(q); });
}

float* TensorView::f32() const {
  DI_CHECK(dtype == DType::kF32, "expected a float32 tensor, got ", dtype_name(dtype));
  return static_cast<float*>(data);
}

static int64_t row_elems(const Shape& s) { return s.ndim() == 0 ? 1 : s.numel() / std::max<int64_t>(s[0], 1); }

Shape Shape::with_dim(int i, int64_t n) const {
  const int dim = i < 0 ? ndim_ + i : i;
  DI_CHECK(dim >= 0 && dim < ndim_, "dimension ", i, " out of range for shape ", str());
  Shape s = *this;
  s.dims_[static_cast<size_t>(dim)] = n;
  return s;
}

static Shape with_rows(const Shape& s, int64_t count) { return s.with_dim(0, count); }

// The bytes an element of `dtype` takes; packed 4-bit values (only a weight's logical view holds them) have none.
static int64_t element_bytes(DType dtype) {
  DI_CHECK(dtype != DType::kU4 && dtype != DType::kE2M1, "a packed 4-bit weight's view is not sliced as a tensor ",
           "(core/weight.h)");
  return static_cast<int64_t>(dtype_size(dtype));
}

TensorView TensorView::rows(int64_t begin, int64_t count) const {
  DI_CHECK(shape.ndim() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0], "rows [", begin, ", ",
           begin + count, ") out of range for shape ", shape.str());
  auto* base = static_cast<std::byte*>(data) + begin * row_elems(shape) * element_bytes(dtype);
  return {base, dtype, with_rows(shape, count), device};
}

TensorView TensorView::reshaped(Shape new_shape) const {
  DI_CHECK(new_shape.numel() == shape.numel(), "cannot reshape ", shape.str(), " to ", new_shape.str());
  return {data, dtype, new_shape, device};
}

// Columns [begin, begin + count) of the last dimension: the same rows, `begin` elements further in.
static Shape with_last(const Shape& s, int64_t begin, int64_t count) {
  DI_CHECK(s.ndim() >= 1 && begin >= 0 && count >= 0 && begin + count <= s[s.ndim() - 1], "columns [", begin, ", ",
           begin + count, ") out of range for shape ", s.str());
  return s.with_dim(-1, count);
}

TensorView TensorView::columns(int64_t begin, int64_t count) const {
  const Shape s = with_last(shape, begin, count);
  return {static_cast<std::byte*>(data) + begin * element_bytes(dtype), dtype, s, device};
}

const float* ConstTensorView::f32() const {
  DI_CHECK(dtype == DType::kF32, "expected a float32 tensor, got ", dtype_name(dtype));
  return static_cast<const float*>(data);
}

ConstTensorView ConstTensorView::rows(int64_t begin, int64_t count) const {
  DI_CHECK(shape.ndim() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0], "rows [", begin, ", ",
           begin + count, ") out of range for shape ", shape.str());
  auto* base =
      static_cast<const std::byte*>(data) + begin * row_elems(shape) * element_bytes(dtype);
  return {base, dtype, with_rows(shape, count), device};
}

ConstTensorView ConstTensorView::reshaped(Shape new_shape) const {
  DI_CHECK(new_shape.numel() == shape.numel(), "cannot reshape ", shape.str(), " to ", new_shape.str());
  return {data, dtype, new_shape, device};
}

ConstTensorView ConstTensorView::columns(int64_t begin, int64_t count) const {
  const Shape s = with_last(shape, begin, count);
  return {static_cast<const std::byte*>(data) + begin * element_bytes(dtype), dtype, s, device};
}

Tensor::Tensor(Buffer buffer, Shape shape, DType dtype) : buffer_(std::move(buffer)), shape_(shape), dtype_(dtype) {
  DI_CHECK(dtype != DType::kU4 && dtype != DType::kE2M1, "no tensor holds 4-bit elements: a packed 4-bit weight ",
           "stores int32 words (core/weight.h)");
  DI_CHECK(buffer_.bytes() >= static_cast<size_t>(shape.numel()) * dtype_size(dtype), "a buffer of ",
           buffer_.bytes(), " bytes cannot hold ", shape.str(), " ", dtype_name(dtype));
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  return Tensor(allocate_host(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), shape, dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.numel() > 0) std::memset(t.view().data, 0, t.view().bytes());
  return t;
}

}  // namespace deepinfer
