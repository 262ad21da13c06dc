// Rotary frequencies of DeepSeek's MLA rope part, with YaRN when the config asks for it.
#pragma once

#include <vector>

#include "model/config.h"

namespace deepinfer {

struct RopeTables {
  std::vector<float> inv_freq;  // [rope_dim / 2]
  float attention_scaling = 1.0f;  // YaRN: mscale(factor, mscale) / mscale(factor, mscale_all_dim), scales cos/sin
};

RopeTables compute_rope_tables(const ModelConfig& config);

}  // namespace deepinfer
