// Parameters of the rotary embedding kernel: rotates, in place, the first rot_dim elements of every (token, head)
// slice. Pair i (i < rot_dim / 2) is (2i, 2i + 1) when interleaved, as DeepSeek stores it, else (i, i + rot_dim / 2);
// its angle is the fp32 product position * inv_freq[i] (as in the reference models), and cos and sin are scaled by
// attention_scaling (YaRN):  x0' = x0 * cos - x1 * sin,  x1' = x1 * cos + x0 * sin.
// Elements are float32 or bfloat16 (the launcher's dtype); the math is fp32.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct RopeParams {
  void* x = nullptr;                   // element (t, h, i) at x[t * token_stride + h * head_stride + i]
  const int32_t* positions = nullptr;  // [num_tokens], device memory
  const float* inv_freq = nullptr;     // [rot_dim / 2], device memory
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t rot_dim = 0;                 // even
  int64_t token_stride = 0;            // elements
  int64_t head_stride = 0;             // elements
  float attention_scaling = 1.0f;
  bool interleaved = true;
};

}  // namespace deepinfer::cuda
