// WeightSources of 4-bit weights for the CPU backend, which computes with their dequantized values in float32: a
// checkpoint that stores linear layers in 4 bits (compressed-tensors or AWQ, model/int4.h), and round-to-nearest INT4
// of any other source's linear layers (quantization="int4" on a bf16/fp32 checkpoint). Both answer for the plain
// names the loader asks for ("...q_b_proj.weight", [N, K]) and return float32 rows, so the loader, the sharded
// source and kv_b_proj's absorbed halves see ordinary weights holding the 4-bit values.
#pragma once

#include <memory>
#include <string_view>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/int4.h"
#include "model/weights.h"

namespace deepinfer {

// Indexes and checks every 4-bit tensor of `checkpoint` (config.int4 says the layout and group size) before a weight
// is read: dtypes, a packed shape against weight_shape (compressed-tensors), the scales and zero points against the
// group size, a group size that does not divide K. Throws naming the tensor. Tensors stored in 4 bits are read as
// X.weight; the others (embeddings, norms, the router, lm_head, the ignored layers) as stored.
std::unique_ptr<WeightSource> open_int4_checkpoint_source(Checkpoint checkpoint, const ModelConfig& config);

// `inner` with every linear weight (is_int4_linear) rounded to INT4 as it is read (round_int4 along each row, so any
// row range rounds as the whole tensor does).
std::unique_ptr<WeightSource> make_int4_rounding_source(std::unique_ptr<WeightSource> inner, Int4Rounding rounding);

// The weights INT4 applies to, by name: every attention and MLP projection (q_proj, q_a_proj, q_b_proj,
// kv_a_proj_with_mqa, kv_b_proj, o_proj, gate/up/down_proj of dense MLPs, routed and shared experts, the MTP layer's
// eh_proj: "*_proj.weight", "*_proj_with_mqa.weight") and transformers 5's fused experts. Not the router (mlp.gate), embeddings, lm_head, norms.
bool is_int4_linear(std::string_view name);

// Refuses, from the config alone, a group size that does not divide the input size K of every linear layer the model
// has; throws naming the layer and K.
void check_int4_rounding(const ModelConfig& config, const Int4Rounding& rounding);

}  // namespace deepinfer
