// The CPU ops compute in float32: a bf16/fp32 weight is read where it lies, an FP8 one is dequantized first.
#pragma once

#include <vector>

#include "core/weight.h"

namespace deepinfer::cpu {

// The float32 values of `w` (2-D): w's own memory when it is float32, otherwise `scratch` filled with the
// dequantized weight (valid until scratch changes).
const float* weight_values(const WeightView& w, std::vector<float>& scratch);

}  // namespace deepinfer::cpu
