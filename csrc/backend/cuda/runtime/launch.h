// Kernel launches of the CUDA backend. Every kernel of the project launches through launch_pdl as a programmatic
// dependent (PDL, sm_90) of the work before it on the stream: its CTAs may be scheduled, and run the code before their
// griddep_wait(), while that work drains, which hides most of a dependent launch's latency (a decode step is a chain
// of many small kernels). The kernels keep the rule written next to griddep_wait in ptx.cuh (wait before the first
// global memory access), so the overlap never lets one see memory its predecessor has not finished with.
//
// Work between our kernels that is not one of them (cuBLAS GEMMs, memsets, copies) is fine on either side: a kernel
// that never executes griddepcontrol.launch_dependents counts as triggering when it completes, so ours launched after
// it waits as without PDL; a kernel launched without the attribute after ours waits for ours to complete; a copy or
// memset waits for all work before it.
//
// What this means for kernel design, measured on an H200: a kernel that issues its constant loads (weights) before
// its griddep_wait() overlaps whatever runs before it, so a small kernel in front of such a kernel costs little, and
// folding it in (the RMSNorm into the skinny GEMM's prologue) gained nothing at batch 1 and lost at batch 8, because
// the folded work then ran after the wait in every CTA. What pays is moving work before the wait, and replacing
// kernels that cannot take part (cuBLAS's): the absorbed decode's per-head products run on head_gemv.cu for that.
//
// The launches are valid during stream capture: the dependency is recorded as a programmatic edge of the graph
// (CUDA 12.3 and later). DEEPINFER_DISABLE_PDL=1 in the environment (read once) launches without the attribute, to
// measure what PDL gains or to rule it out; griddepcontrol then does nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "backend/cuda/runtime/cuda_check.h"

namespace deepinfer::cuda {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem_bytes = 0;      // dynamic shared memory per CTA
  unsigned cluster_ctas = 1;  // CTAs per thread-block cluster along x (grid.x is a multiple); 1: no clusters
};

// Whether launch_pdl adds the programmatic-stream-serialization attribute: unless DEEPINFER_DISABLE_PDL is on
// (core/env_flag.h), read at the first call.
bool pdl_enabled();

// Whether the backend may have a kernel trigger its successor's launch at its start (LaunchLedger::trigger): unless
// DEEPINFER_DISABLE_EARLY_TRIGGER is on (read at the first call).
bool early_trigger_enabled();

// Queues kernel<<<shape>>>(params) on `stream` as a programmatic dependent of the work before it; throws
// deepinfer::Error when the launch is refused. The kernel keeps ptx.cuh's rule: griddep_wait() before touching memory.
template <typename Params>
void launch_pdl(void (*kernel)(Params), const LaunchShape& shape, cudaStream_t stream,
                const std::type_identity_t<Params>& params) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (shape.cluster_ctas > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = shape.cluster_ctas;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (pdl_enabled()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem_bytes;
  config.stream = stream;
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  CUDA_TRY(cudaLaunchKernelEx(&config, kernel, params));
}

}  // namespace deepinfer::cuda
