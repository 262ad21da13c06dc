// Tensors: `Tensor` owns device memory (move-only); `TensorView` borrows it (cheap to copy, passed by value).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {

enum class Device : uint8_t { kCpu, kCuda };

constexpr std::string_view device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

constexpr int kMaxDims = 4;

// A shape of up to kMaxDims dimensions, stored inline.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(ndim_)}; }
  // The same shape with dimension `i` (negative: from the end) set to `n`.
  Shape with_dim(int i, int64_t n) const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "[2, 3, 576]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

// Raw memory of one device with a deleter chosen by the allocator that produced it. The deleter gets the allocator's
// `context` back (the CUDA backend's stream, for a stream-ordered free). An empty buffer still names its device.
class Buffer {
 public:
  using Deleter = void (*)(void* data, void* context);
  Buffer() = default;
  Buffer(void* data, size_t bytes, Device device, Deleter deleter, void* context = nullptr) noexcept;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCpu;
  Deleter deleter_ = nullptr;
  void* context_ = nullptr;
};

// 64-byte aligned host memory. Device memory comes from a backend (Backend::empty).
Buffer allocate_host(size_t bytes);

// A non-owning view: pointer, dtype, shape, device. Views are contiguous, except those made by columns(): they
// select a column range of a wider row-major tensor (the rope half of a [T, 576] latent), and the ops that take
// them are told the real row stride (RmsNormArgs::row_stride, HeadLinearArgs::x_head_stride, ...).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape{0};  // a default view is empty (numel 0), not a scalar
  Device device = Device::kCpu;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  float* f32() const;
  std::span<float> f32_span() const { return {f32(), static_cast<size_t>(numel())}; }
  // A view of rows [begin, begin + count) of dimension 0.
  TensorView rows(int64_t begin, int64_t count) const;
  // The same memory with another shape of equal element count.
  TensorView reshaped(Shape new_shape) const;
  // Elements [begin, begin + count) of the last dimension. The result's innermost rows stay shape[ndim - 1]
  // elements apart (not `count`): pass that as the row stride of the op. Take rows() and reshaped() before this.
  TensorView columns(int64_t begin, int64_t count) const;
};

struct ConstTensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape{0};
  Device device = Device::kCpu;

  ConstTensorView() = default;
  ConstTensorView(const TensorView& v)  // NOLINT: a mutable view converts to a read-only one
      : data(v.data), dtype(v.dtype), shape(v.shape), device(v.device) {}
  ConstTensorView(const void* d, DType t, Shape s, Device dev) : data(d), dtype(t), shape(s), device(dev) {}

  int64_t numel() const { return shape.numel(); }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  const float* f32() const;
  std::span<const float> f32_span() const { return {f32(), static_cast<size_t>(numel())}; }
  ConstTensorView rows(int64_t begin, int64_t count) const;
  ConstTensorView reshaped(Shape new_shape) const;
  ConstTensorView columns(int64_t begin, int64_t count) const;
};

// Owning, move-only tensor. Host tensors come from empty() and zeros(); a backend's tensors from Backend::empty(),
// which wraps its allocator's buffer.
class Tensor {
 public:
  Tensor() = default;
  // `buffer` holds at least shape.numel() elements of `dtype`.
  Tensor(Buffer buffer, Shape shape, DType dtype);
  static Tensor empty(Shape shape, DType dtype);                // host
  static Tensor zeros(Shape shape, DType dtype = DType::kF32);  // host

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_.device(); }
  int64_t numel() const { return shape_.numel(); }
  bool defined() const { return buffer_.data() != nullptr || shape_.numel() == 0; }

  TensorView view() const { return {buffer_.data(), dtype_, shape_, buffer_.device()}; }
  ConstTensorView cview() const { return view(); }
  float* f32() const { return view().f32(); }
  std::span<float> f32_span() const { return view().f32_span(); }

 private:
  Buffer buffer_;
  Shape shape_{0};  // a default-constructed tensor is empty (numel 0), not a scalar
  DType dtype_ = DType::kF32;
};

}  // namespace deepinfer
