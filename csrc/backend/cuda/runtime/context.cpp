#include "backend/cuda/runtime/context.h"

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/step_graph.h"
#include "core/half.h"

namespace deepinfer::cuda {
namespace {

// The deleter of the context's buffers: a stream-ordered free, after the work already queued on the context's stream
// (the buffer's context).
void free_on_stream(void* data, void* stream) {
  // A destructor cannot report a failure; after a fault the context is lost anyway.
  cudaFreeAsync(data, static_cast<cudaStream_t>(stream));
}

void free_pinned(void* data, void*) { cudaFreeHost(data); }

void check_copy(const ConstTensorView& src, const ConstTensorView& dst, Device src_device, Device dst_device,
                const char* op) {
  DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), op, ": ", src.shape.str(), " ",
           dtype_name(src.dtype), " into ", dst.shape.str(), " ", dtype_name(dst.dtype));
  DI_CHECK((src.device == src_device || src.numel() == 0) && (dst.device == dst_device || dst.numel() == 0), op,
           ": from ", device_name(src.device), " to ", device_name(dst.device), " memory");
}

}  // namespace

CudaContext::CudaContext(const CudaTuning& tuning)
    : tuning_(tuning)
#ifdef DEEPINFER_HAVE_CUBLAS
      , cublas_(stream_.get())
#endif
{
  CUDA_TRY(cudaGetDevice(&device_));
  CUDA_TRY(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  int major = 0, minor = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
  compute_capability_ = major * 10 + minor;
}

CudaContext::~CudaContext() { cudaStreamSynchronize(stream_.get()); }

DeviceMemoryInfo CudaContext::memory_info() const {
  const DeviceMemory mem = device_memory(device_);
  return {.free_bytes = mem.free_bytes, .total_bytes = mem.total_bytes};
}

// ---------------------------------------------------------------------------------------------------------------------
// Memory

Tensor CudaContext::empty(Shape shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (recording_) {
    return Tensor(Buffer(arena_.allocate(bytes), bytes, Device::kCuda, &GraphArena::release, &arena_), shape, dtype);
  }
  void* data = nullptr;
  if (bytes > 0) CUDA_TRY(cudaMallocFromPoolAsync(&data, bytes, pool_.get(), stream_.get()));
  return Tensor(Buffer(data, bytes, Device::kCuda, &free_on_stream, stream_.get()), shape, dtype);
}

Tensor CudaContext::staging(Shape shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* data = nullptr;
  if (bytes > 0) CUDA_TRY(cudaHostAlloc(&data, bytes, cudaHostAllocDefault));
  return Tensor(Buffer(data, bytes, Device::kCpu, &free_pinned), shape, dtype);
}

Tensor CudaContext::zeros(Shape shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  const TensorView v = t.view();
  if (v.bytes() > 0) {
    CUDA_TRY(cudaMemsetAsync(v.data, 0, v.bytes(), stream_.get()));
    ledger_.serialized();
  }
  return t;
}

// From pageable host memory the copy returns once the driver has staged the source, so `host` may be reused; from a
// staging tensor (page-locked) it returns at once.
void CudaContext::copy_to_device(ConstTensorView host, TensorView dst) {
  check_copy(host, dst, Device::kCpu, Device::kCuda, "cuda copy_to_device");
  if (dst.bytes() > 0) {
    CUDA_TRY(cudaMemcpyAsync(dst.data, host.data, dst.bytes(), cudaMemcpyHostToDevice, stream_.get()));
    ledger_.serialized();
  }
}

void CudaContext::copy_to_host(ConstTensorView src, TensorView host) {
  check_copy(src, host, Device::kCuda, Device::kCpu, "cuda copy_to_host");
  if (host.bytes() == 0) return;
  CUDA_TRY(cudaMemcpyAsync(host.data, src.data, host.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
  stream_.synchronize();
  ledger_.serialized();
  if (profiler_.enabled()) profiler_.collect();
}

Tensor CudaContext::upload(Tensor host, DType dtype) {
  DI_CHECK(host.device() == Device::kCpu, "cuda upload: the source must be a host tensor");
  if (host.dtype() != dtype) {
    DI_CHECK(host.dtype() == DType::kF32 && dtype == DType::kBF16, "cuda upload: cannot convert ",
             dtype_name(host.dtype()), " to ", dtype_name(dtype));
    Tensor narrowed = Tensor::empty(host.shape(), DType::kBF16);
    const float* src = host.f32();
    auto* bits = narrowed.view().as<uint16_t>();
    for (int64_t i = 0; i < host.numel(); ++i) bits[i] = float_to_bf16(src[i]);
    host = std::move(narrowed);
  }
  Tensor out = empty(host.shape(), dtype);
  copy_to_device(host.cview(), out.view());
  return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// Graphs

// The warm-up run sizes the workspaces and tells how much memory the step takes (the pool's high-water mark); the
// arena reserves that much, then the same work is recorded with its tensors in the arena. The pool reuses a block
// freed below live ones at once, the arena only once those above it go, so the recording can need more than the
// warm-up showed: it then stops, the arena grows to what the recording reached, and the work is recorded again.
std::unique_ptr<StepGraph> CudaContext::capture(const std::function<void()>& work) {
  DI_CHECK(!recording_, "cuda capture: already recording a graph");
  cudaMemPool_t pool = pool_.get();
  uint64_t used_before = 0, zero = 0;
  CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_before));
  CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  work();
  stream_.synchronize();
  ledger_.serialized();
  uint64_t used_high = 0;
  CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  if (arena_.reserve(static_cast<size_t>(used_high > used_before ? used_high - used_before : 0))) {
    ++graph_generation_;
  }
  constexpr int kMaxRecordings = 4;  // the arena at least doubles each time, so one more is the usual case
  for (int recording = 1;; ++recording) {
    try {
      return record(work);
    } catch (const GraphArenaFull& full) {
      if (recording == kMaxRecordings) throw;
      if (arena_.reserve(full.peak())) ++graph_generation_;
    }
  }
}

// Records `work` into a graph whose tensors come from the arena; the stream is out of capture mode afterwards, whether
// the recording succeeded or threw.
std::unique_ptr<StepGraph> CudaContext::record(const std::function<void()>& work) {
  cudaGraph_t graph = nullptr;
  CUDA_TRY(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
  ledger_.serialized();  // the graph's first kernel has no predecessor in it
  recording_ = true;
  try {
    work();
  } catch (...) {
    recording_ = false;
    cudaStreamEndCapture(stream_.get(), &graph);  // ends the invalidated capture; its error is the one thrown
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  recording_ = false;
  CUDA_TRY(cudaStreamEndCapture(stream_.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_TRY(status);
  return std::make_unique<CudaStepGraph>(exec, stream_.get(), graph_generation_, ledger_);
}

// ---------------------------------------------------------------------------------------------------------------------
// Workspaces

WorkspaceGrant CudaContext::workspace(WorkspaceUse use, const WorkspaceRequest& request) {
  return workspaces_[static_cast<size_t>(use)].take(request, [&](size_t bytes) {
    DI_CHECK(!recording_, "cuda backend: a workspace of ", bytes, " bytes had to grow while a graph was recorded");
    ++graph_generation_;
    return empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, DType::kF32);
  });
}

std::string CudaContext::fp8_unsupported_reason() const {
  if (compute_capability_ >= 89) return {};
  return str_cat("GPU ", device_, " has compute capability ", compute_capability_ / 10, ".", compute_capability_ % 10,
                 ", without FP8 tensor cores (8.9 or newer: Ada, Hopper)");
}

}  // namespace deepinfer::cuda
