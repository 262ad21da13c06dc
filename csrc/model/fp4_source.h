// The WeightSource of a checkpoint that stores linear layers as 4-bit floats (NVFP4 or MXFP4, model/fp4.h), for the
// CPU backend, which computes with their dequantized values in float32. It answers for the plain names the loader
// asks for ("...q_b_proj.weight", [N, K]) with float32 rows, as the INT4 source does (model/int4_source.h).
#pragma once

#include <memory>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace deepinfer {

// Indexes and checks every FP4 tensor of `checkpoint` (config.fp4 says the layout) before a weight is read: the
// packed codes' dtype and shape, the group scales' dtype and shape, the tensor scale. Throws naming the tensor.
// Tensors not stored in FP4 (embeddings, norms, the router, lm_head, the excluded layers) are read as stored.
std::unique_ptr<WeightSource> open_fp4_checkpoint_source(Checkpoint checkpoint, const ModelConfig& config);

// `inner` (random weights, load_format="dummy") with every linear weight (is_int4_linear) rounded to the FP4 format
// `fp4` names (round_fp4: NVFP4's or MXFP4's scales, its group size) as it is read: a benchmark of an FP4 checkpoint's
// shape runs the FP4 kernels. It answers int4_form like a stored FP4 checkpoint. The linear layers `modules` says
// the checkpoint quantized are rounded (its targets, less its exclusion list); the router, embeddings, lm_head, norms
// and the excluded layers keep their values.
std::unique_ptr<WeightSource> make_fp4_rounding_source(std::unique_ptr<WeightSource> inner, const Fp4Config& fp4,
                                                       const QuantizedModules& modules = {});

}  // namespace deepinfer
