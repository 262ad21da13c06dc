#include "model/weight_sink.h"

#include <algorithm>
#include <cstring>
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

class HostSink final : public WeightSink {
 public:
  Tensor allocate(Shape shape, WeightRole) override { return Tensor::empty(shape, DType::kF32); }

  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    check_write(dst, offset, values.size());
    DI_CHECK(dst.device() == Device::kCpu || dst.numel() == 0, "host sink: the destination is not in host memory");
    if (!values.empty()) std::memcpy(dst.f32() + offset, values.data(), values.size_bytes());
  }
};

class BackendSink final : public WeightSink {
 public:
  explicit BackendSink(Backend& backend) : backend_(backend) {
    const DType matrix = backend_.activation_dtype();
    DI_CHECK(matrix == DType::kF32 || matrix == DType::kBF16, "weights can be placed as float32 or bfloat16, but ",
             backend_.name(), " computes in ", dtype_name(matrix));
  }

  Tensor allocate(Shape shape, WeightRole role) override {
    return backend_.empty(shape, role == WeightRole::kMatrix ? backend_.activation_dtype() : DType::kF32);
  }

  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    check_write(dst, offset, values.size());
    const auto count = static_cast<int64_t>(values.size());
    if (dst.dtype() == DType::kF32) {
      backend_.copy_to_device(ConstTensorView(values.data(), DType::kF32, {count}, Device::kCpu),
                              flat_range(dst, offset, count));
      return;
    }
    DI_CHECK(dst.dtype() == DType::kBF16, "backend sink: cannot write float32 values into a ",
             dtype_name(dst.dtype()), " tensor");
    staging_.resize(static_cast<size_t>(std::min(count, kStagingElements)));
    for (int64_t begin = 0; begin < count; begin += kStagingElements) {
      const int64_t n = std::min(kStagingElements, count - begin);
      const float* src = values.data() + begin;
      uint16_t* bits = staging_.data();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (int64_t i = 0; i < n; ++i) bits[i] = float_to_bf16(src[i]);
      backend_.copy_to_device(ConstTensorView(bits, DType::kBF16, {n}, Device::kCpu),
                              flat_range(dst, offset + begin, n));
    }
  }

 private:
  Backend& backend_;
  std::vector<uint16_t> staging_;  // bfloat16 bits of the chunk being copied
};

}  // namespace

std::unique_ptr<WeightSink> make_host_sink() { return std::make_unique<HostSink>(); }

std::unique_ptr<WeightSink> make_backend_sink(Backend& backend) { return std::make_unique<BackendSink>(backend); }

}  // namespace deepinfer
