// What every CUDA op runs with: the CudaContext a CudaBackend owns and hands to each op's entry point
// (`void op(CudaContext& ctx, const OpArgs& a)`, declared in each family's *_ops.h).
//
// It holds the stream every op is queued on, the stream-ordered memory pool (empty(), zeros(), upload()), the graph
// arena and the capture of step graphs (capture()), the op profiler (timed()), the cuBLAS handle, the device's SM
// count, the workspaces ops keep across calls (workspace()), the tuning record (tuning(); launch() carries its
// PDL switch to the kernel launchers), and the launch ledger (ledger(): which ops may still run as the next kernel
// starts, so an op knows what its kernels may read before their wait and when they may let the next op start).
// Every entry point tells the ledger what it queued.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/runtime/cublas_handle.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/runtime/graph_arena.h"
#include "backend/cuda/runtime/launch_ledger.h"
#include "backend/cuda/runtime/launch_stream.h"
#include "backend/cuda/runtime/memory_pool.h"
#include "backend/cuda/runtime/op_profiler.h"
#include "backend/cuda/runtime/tuning.h"
#include "backend/cuda/runtime/workspace.h"

namespace deepinfer::cuda {

class CudaContext {
 public:
  // On the current device.
  explicit CudaContext(const CudaTuning& tuning);
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
  ~CudaContext();  // waits for the work queued on the stream

  const CudaTuning& tuning() const { return tuning_; }
  cudaStream_t stream() const { return stream_.get(); }
  // Where the kernel launchers queue their kernels: the stream, with the tuning's PDL switch.
  LaunchStream launch() const { return {.handle = stream_.get(), .pdl = tuning_.pdl}; }
  int num_sms() const { return num_sms_; }
  // "" on a GPU with FP8 tensor cores (compute capability 8.9 or newer), else why FP8 weights cannot run here.
  std::string fp8_unsupported_reason() const;
  LaunchLedger& ledger() { return ledger_; }
  const LaunchLedger& ledger() const { return ledger_; }
#ifdef DEEPINFER_HAVE_CUBLAS
  cublasHandle_t cublas() const { return cublas_.get(); }
#endif

  // The device's free and total bytes now (Backend::memory_info), for sizing the latent cache.
  DeviceMemoryInfo memory_info() const;

  // Memory: Backend's calls (backend.h says what each does). While a graph is recorded, empty() takes its tensors from
  // the graph arena (see capture()).
  Tensor empty(Shape shape, DType dtype);
  Tensor zeros(Shape shape, DType dtype);
  Tensor staging(Shape shape, DType dtype);
  void copy_to_device(ConstTensorView host, TensorView dst);
  void copy_to_host(ConstTensorView src, TensorView host);
  Tensor upload(Tensor host, DType dtype);

  // Backend::capture: a warm-up run of `work`, then its recording into a graph whose tensors come from the arena.
  std::unique_ptr<StepGraph> capture(const std::function<void()>& work);

  // Brackets an op for the profiler, never while a graph is recorded. A label built from the op's shapes comes as a
  // callable, run only when profiling.
  OpProfiler::Scope timed(const char* label) { return profiler_.scope(!recording_, label); }
  template <std::invocable Label>
  OpProfiler::Scope timed(const Label& label) {
    const bool on = profiler_.enabled() && !recording_;
    return profiler_.scope(on, on ? label() : std::string());
  }

  // The workspace of `use` (workspace.h), grown to the request first when it is smaller; throws deepinfer::Error when
  // it would have to grow while a graph is recorded.
  WorkspaceGrant workspace(WorkspaceUse use, const WorkspaceRequest& request);

 private:
  std::unique_ptr<StepGraph> record(const std::function<void()>& work);

  // Declared first, destroyed last: everything below frees its memory in its order.
  const CudaTuning tuning_;
  CudaStream stream_;
  MemoryPool pool_;
  GraphArena arena_{stream_.get()};
  OpProfiler profiler_{stream_.get(), tuning_.profile_ops};
  bool recording_ = false;
  uint64_t graph_generation_ = 0;
  LaunchLedger ledger_;
  int device_ = 0;
  int num_sms_ = 0;
  int compute_capability_ = 0;  // major * 10 + minor
  std::array<Workspace, kWorkspaceUses> workspaces_;
#ifdef DEEPINFER_HAVE_CUBLAS
  CublasHandle cublas_;
#endif
};

}  // namespace deepinfer::cuda
