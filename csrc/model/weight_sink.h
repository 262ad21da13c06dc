// Where loaded weights go. The loader reads a checkpoint piece by piece (a tensor, a chunk of rows, one expert)
// and hands each piece to a sink right away, so the host never holds a whole model in float32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/tensor.h"

namespace deepinfer {

class Backend;

// What a weight is to the ops: a matrix (stored in the sink's matrix dtype) or a norm weight / bias (float32).
enum class WeightRole : uint8_t { kMatrix, kVector };

// Host float32 tensors (the CPU backend, tests) or a backend's device (the CUDA backend narrows to bfloat16).
class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // An uninitialized destination for a weight of `shape`: matrices in the sink's matrix dtype, vectors float32.
  virtual Tensor allocate(Shape shape, WeightRole role) = 0;
  // Writes `values` (float32, host) into elements [offset, offset + values.size()) of `dst` (row-major, counted
  // over the whole tensor), narrowing to dst's dtype. Returns once `values` may be changed or freed.
  virtual void write(Tensor& dst, int64_t offset, std::span<const float> values) = 0;
};

// Host float32 tensors, written with memcpy: what load_weights returned before sinks existed.
std::unique_ptr<WeightSink> make_host_sink();

// Tensors of `backend` (Backend::empty): matrices in backend.activation_dtype() (float32 or bfloat16), vectors in
// float32. A write to a bfloat16 tensor narrows on the host (round to nearest even) through a bounded staging
// buffer, a chunk at a time, then copies each chunk with backend.copy_to_device. `backend` must outlive the sink.
std::unique_ptr<WeightSink> make_backend_sink(Backend& backend);

}  // namespace deepinfer
