// Rotary position embedding, in place, on the rope slice of each head.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace deepinfer {

struct RopeArgs {
  float* x = nullptr;                 // element (t, h, i) at x[t * token_stride + h * head_stride + i], i < rot_dim
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t rot_dim = 0;
  int64_t token_stride = 0;           // elements
  int64_t head_stride = 0;            // elements
  std::span<const int32_t> positions; // [num_tokens]
  std::span<const float> inv_freq;    // [rot_dim / 2]
  float attention_scaling = 1.0f;     // YaRN scales cos and sin
  bool interleaved = true;            // pairs (2i, 2i+1) as DeepSeek stores them; else halves (i, i + d/2)
  Device device = Device::kCpu;
  void validate() const;
};

}  // namespace deepinfer
