// The CUDA backend's tuning record: every switch that changes how its ops run, in this one list. The context reads it
// from the environment once, when it is built (make_cuda_backend(device)), or takes it from the caller
// (make_cuda_backend(device, tuning): tests and benchmarks set fields directly). Only kill switches and measurement
// knobs live here; an A/B experiment's switch lives only until the experiment is decided, then the winner becomes the
// code and the switch goes.
#pragma once

#include "backend/cuda/mla/mla_prefill_params.h"

namespace deepinfer::cuda {

struct CudaTuning {
  // Kernels launch as programmatic dependents of the work before them (launch.h): each launch overlaps its
  // predecessor's tail. DEEPINFER_DISABLE_PDL=1 launches them plainly, to measure what PDL gains or to rule it out.
  bool pdl = true;
  // Decode-sized bf16 GEMMs (linear, linear_silu_mul, multi_linear) go to the skinny GEMM where its rule allows
  // (gemm/linear_op.cpp). DEEPINFER_DISABLE_SKINNY_GEMM=1 sends every GEMM to cuBLAS, so one build can compare them.
  bool skinny_gemm = true;
  // The MLA prefill attention kernel (mla/mla_prefill.cuh): DEEPINFER_MLA_PREFILL=wgmma (Hopper warpgroup MMA, the
  // default; also unset or empty) or mma (the older mma.sync kernel).
  MlaPrefillKernel mla_prefill_kernel = MlaPrefillKernel::kWgmma;
  // A measurement knob: n > 0 gives MLA decode n splits wherever its heuristic would choose (at most one a 64-token
  // tile), for the split benchmarks. DEEPINFER_MLA_DECODE_SPLITS=n, n in [1, 256]; 0 (unset or empty): the heuristic.
  int mla_decode_splits = 0;
  // The most tokens an FP8 linear layer sends to the FP8 skinny GEMM (W8A16, weights streamed through mma.sync) when
  // its weights are W8A8 and large; past it they go to the block-scaled cuBLASLt GEMM (gemm/fp8_decode_route.h has
  // the rule and why). DEEPINFER_FP8_SKINNY_MAX_TOKENS=n, n in [0, 64]; unset or empty: the default.
  int fp8_skinny_max_tokens = 8;
  // GPU time per op (runtime/op_profiler.h): DEEPINFER_PROFILE_OPS=1 brackets every op with CUDA events and prints the
  // totals per op to stderr when the backend is destroyed.
  bool profile_ops = false;

  // The record the environment asks for (the variables above; anything unset keeps its default). Throws
  // deepinfer::Error, naming the variable, on a value it cannot read.
  static CudaTuning from_env();
};

}  // namespace deepinfer::cuda
