// Rotary position embedding, in place, on the rope slice of each head.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace deepinfer {

// Pair i (i < rot_dim / 2) of every (token, head) slice, (2i, 2i + 1) when interleaved or (i, i + rot_dim / 2),
// rotates by the fp32 angle positions[t] * inv_freq[i]; cos and sin are scaled by attention_scaling (YaRN).
struct RopeArgs {
  void* x = nullptr;              // element (t, h, i) at x[t * token_stride + h * head_stride + i], i < rot_dim
  DType dtype = DType::kF32;      // of x's elements: float32 or bfloat16
  Device device = Device::kCpu;   // where x is; positions and inv_freq are there too
  int64_t num_heads = 0;
  int64_t rot_dim = 0;
  int64_t token_stride = 0;       // elements
  int64_t head_stride = 0;        // elements
  ConstTensorView positions;      // [T] int32: one per token
  ConstTensorView inv_freq;       // [rot_dim / 2] float32
  float attention_scaling = 1.0f;
  bool interleaved = true;        // pairs (2i, 2i+1) as DeepSeek stores them; else halves (i, i + d/2)

  int64_t num_tokens() const { return positions.numel(); }
  void validate() const;
};

}  // namespace deepinfer
