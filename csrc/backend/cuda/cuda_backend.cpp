// The CUDA backend: validates each op's arguments on the host (shapes, dtypes, devices; never reading device memory)
// and queues its kernel, or its cuBLAS call, on the backend's stream. Index arrays (token ids, positions, slots,
// attention metadata) arrive as device tensors: no op copies anything from the host.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <climits>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "backend/cuda/memory/copy_strided.cuh"
#include "backend/cuda/runtime/cublas_handle.h"
#include "backend/cuda/gemm/skinny_gemm.cuh"
#include "core/env_flag.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/cuda_stream.h"
#include "backend/cuda/elementwise/elementwise.cuh"
#include "backend/cuda/memory/embedding.cuh"
#include "backend/cuda/runtime/graph_arena.h"
#include "backend/cuda/gemm/head_gemv.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/launch_ledger.h"
#include "backend/cuda/mla/mla_cache_write.cuh"
#include "backend/cuda/mla/mla_decode.cuh"
#include "backend/cuda/mla/mla_prepare.cuh"
#include "backend/cuda/mla/mla_prefill.cuh"
#include "backend/cuda/moe/moe.cuh"
#include "backend/cuda/norm/norm_residual.cuh"
#include "backend/cuda/runtime/op_profiler.h"
#include "backend/cuda/norm/rms_norm.cuh"
#include "backend/cuda/rope/rope.cuh"
#include "backend/cuda/sample/sample.cuh"
#include "core/half.h"

namespace deepinfer {
namespace {

// What the MLA decode kernel takes (mla_decode_params.h): DeepSeek's 512-wide latent plus 64 rope values per row,
// bfloat16, heads in multiples of 16.
constexpr int64_t kDecodeRank = 512;
constexpr int64_t kDecodeRowDim = 576;
constexpr int64_t kDecodeHeadMultiple = 16;

// A memory pool of the current device for stream-ordered allocations. Its release threshold is unlimited, so memory
// freed into it stays cached for the next allocation instead of going back to the driver at each synchronization:
// once the first steps have run, the model's per-step tensors cost no device allocation.
class MemoryPool {
 public:
  MemoryPool() {
    int device = 0;
    CUDA_TRY(cudaGetDevice(&device));
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    CUDA_TRY(cudaMemPoolCreate(&pool_, &props));
    uint64_t threshold = UINT64_MAX;
    const cudaError_t status = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (status != cudaSuccess) {
      cudaMemPoolDestroy(pool_);
      CUDA_TRY(status);
    }
  }
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;
  // Allocations still outstanding keep the pool's memory until they are freed.
  ~MemoryPool() { cudaMemPoolDestroy(pool_); }

  cudaMemPool_t get() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

// The deleter of the backend's buffers: a stream-ordered free, after the work already queued on the backend's
// stream (the buffer's context).
void free_on_stream(void* data, void* stream) {
  // A destructor cannot report a failure; after a fault the context is lost anyway.
  cudaFreeAsync(data, static_cast<cudaStream_t>(stream));
}

void free_pinned(void* data, void*) { cudaFreeHost(data); }

// A recorded step. It holds while the backend's graph generation is the one it was recorded in: the generation
// moves on whenever memory a graph may have recorded (a workspace, the graph arena) is replaced.
class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(cudaGraphExec_t exec, cudaStream_t stream, const uint64_t& generation, cuda::LaunchLedger& ledger)
      : exec_(exec), stream_(stream), generation_(generation), recorded_in_(generation), ledger_(ledger) {}
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }

  bool replay() override {
    if (generation_ != recorded_in_) return false;
    CUDA_TRY(cudaGraphLaunch(exec_, stream_));
    ledger_.unknown_work();
    return true;
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const uint64_t& generation_;  // the backend's, which outlives its graphs
  uint64_t recorded_in_;
  cuda::LaunchLedger& ledger_;  // the backend's, which outlives its graphs
};

void check_on_device(const ConstTensorView& t, const char* op, const char* name) {
  DI_CHECK(t.device == Device::kCuda || t.numel() == 0, op, ": ", name, " must be in device memory");
}

void check_gemm_operands(const ConstTensorView& x, const ConstTensorView& w, const ConstTensorView& out,
                         const char* op) {
  // out may be float32 from bfloat16 inputs: router and vocabulary logits keep full precision.
  DI_CHECK(x.dtype == w.dtype && (out.dtype == x.dtype || out.dtype == DType::kF32) &&
               (x.dtype == DType::kBF16 || x.dtype == DType::kF32),
           op, ": x and w must both be bfloat16 (or both float32) and out the same or float32, got ",
           dtype_name(x.dtype), ", ", dtype_name(w.dtype), " and ", dtype_name(out.dtype));
  DI_CHECK(x.device == Device::kCuda && w.device == Device::kCuda && out.device == Device::kCuda, op,
           ": x, w and out must be in device memory");
}

#ifdef DEEPINFER_HAVE_CUBLAS
int gemm_int(int64_t v, const char* op, const char* what) {
  DI_CHECK(v <= INT_MAX, op, ": ", what, " ", v, " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }
#endif

// DEEPINFER_DISABLE_SKINNY_GEMM=1 sends every GEMM to cuBLAS, so one build can compare the two.
bool skinny_gemm_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_SKINNY_GEMM"); }
// DEEPINFER_DISABLE_HEAD_GEMV=1 sends head_linear at decode sizes to cuBLAS too.
bool head_gemv_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_HEAD_GEMV"); }
// DEEPINFER_DISABLE_FUSED_ROUTER=1 computes the MoE router logits with linear before the route kernel.
bool fused_router_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_FUSED_ROUTER"); }
// DEEPINFER_DISABLE_MLA_DECODE_PREWAIT=1 overrides the launch ledger's fresh_rows for MLA decode: every cache read
// waits for the previous kernel.
bool mla_decode_prewait_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_MLA_DECODE_PREWAIT"); }
// DEEPINFER_DISABLE_OP_OVERLAP=1 overrides the launch ledger's before_wait for head_linear: it waits for the op
// before.
bool op_overlap_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_OP_OVERLAP"); }
// DEEPINFER_DISABLE_MLA_FUSED_COMBINE=1 keeps MLA decode's split combine a kernel of its own when the op projects
// with W_UV (MlaDecodeArgs::w_uv), rather than folded into the projection's head_gemv.
bool mla_fused_combine_enabled_from_env() { return !env_flag("DEEPINFER_DISABLE_MLA_FUSED_COMBINE"); }

class CudaBackend final : public Backend {
 public:
  // The device must already be current (make_cuda_backend makes it so).
  CudaBackend()
#ifdef DEEPINFER_HAVE_CUBLAS
      : cublas_(stream_.get())
#endif
  {
    int device = 0;
    CUDA_TRY(cudaGetDevice(&device));
    CUDA_TRY(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  ~CudaBackend() override { cudaStreamSynchronize(stream_.get()); }

  Device device() const override { return Device::kCuda; }
  std::string_view name() const override { return "cuda"; }

  bool supports(OpKind op) const override {
    switch (op) {
      case OpKind::kLinear:
      case OpKind::kLinearSiluMul:
      case OpKind::kMultiLinear:
      case OpKind::kHeadLinear:
      case OpKind::kMlaPrefill:  // bfloat16, DeepSeek's dims (rank 512, rope 64, nope 128, v 128); cuBLAS decompresses
#ifdef DEEPINFER_HAVE_CUBLAS
        return true;
#else
        return false;
#endif
      case OpKind::kEmbedding:
      case OpKind::kGatherRows:
      case OpKind::kCopyStrided:
      case OpKind::kRmsNorm:
      case OpKind::kAddRmsNorm:
      case OpKind::kSiluMul:
      case OpKind::kAdd:
      case OpKind::kRope:
      case OpKind::kMlaCacheWrite:
      case OpKind::kMlaPrepare:
      case OpKind::kMlaDecode:  // bfloat16, DeepSeek's 512 + 64 latent, heads in multiples of 16
      case OpKind::kMoeRoute:   // up to 256 routed experts, 264 with the shared ones, 10 pairs a token
      case OpKind::kMoeExperts: // bfloat16, hidden and intermediate sizes in multiples of 32
      case OpKind::kMoe:        // both of the above
      case OpKind::kSample:
        return true;
    }
    return false;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Memory

  DType activation_dtype() const override { return DType::kBF16; }

  // While a graph is recorded, tensors come from the graph arena (see capture()).
  Tensor empty(Shape shape, DType dtype) override {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    if (recording_) {
      return Tensor(Buffer(arena_.allocate(bytes), bytes, Device::kCuda, &cuda::GraphArena::release, &arena_), shape,
                    dtype);
    }
    void* data = nullptr;
    if (bytes > 0) CUDA_TRY(cudaMallocFromPoolAsync(&data, bytes, pool_.get(), stream_.get()));
    return Tensor(Buffer(data, bytes, Device::kCuda, &free_on_stream, stream_.get()), shape, dtype);
  }

  Tensor staging(Shape shape, DType dtype) override {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    void* data = nullptr;
    if (bytes > 0) CUDA_TRY(cudaHostAlloc(&data, bytes, cudaHostAllocDefault));
    return Tensor(Buffer(data, bytes, Device::kCpu, &free_pinned), shape, dtype);
  }

  // The warm-up run sizes the workspaces and tells how much memory the step takes (the pool's high-water mark); the
  // arena reserves that much, then the same work is recorded with its tensors in the arena. The pool reuses a block
  // freed below live ones at once, the arena only once those above it go, so the recording can need more than the
  // warm-up showed: it then stops, the arena grows to what the recording reached, and the work is recorded again.
  std::unique_ptr<StepGraph> capture(const std::function<void()>& work) override {
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
      } catch (const cuda::GraphArenaFull& full) {
        if (recording == kMaxRecordings) throw;
        if (arena_.reserve(full.peak())) ++graph_generation_;
      }
    }
  }

  Tensor zeros(Shape shape, DType dtype) override {
    Tensor t = empty(shape, dtype);
    const TensorView v = t.view();
    if (v.bytes() > 0) {
      CUDA_TRY(cudaMemsetAsync(v.data, 0, v.bytes(), stream_.get()));
      ledger_.serialized();
    }
    return t;
  }

  // From pageable host memory the copy returns once the driver has staged the source, so `host` may be reused; from
  // a staging tensor (page-locked) it returns at once.
  void copy_to_device(ConstTensorView host, TensorView dst) override {
    check_copy(host, dst, Device::kCpu, Device::kCuda, "cuda copy_to_device");
    if (dst.bytes() > 0) {
      CUDA_TRY(cudaMemcpyAsync(dst.data, host.data, dst.bytes(), cudaMemcpyHostToDevice, stream_.get()));
      ledger_.serialized();
    }
  }

  void copy_to_host(ConstTensorView src, TensorView host) override {
    check_copy(src, host, Device::kCuda, Device::kCpu, "cuda copy_to_host");
    if (host.bytes() == 0) return;
    CUDA_TRY(cudaMemcpyAsync(host.data, src.data, host.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
    stream_.synchronize();
    ledger_.serialized();
    if (profiler_.enabled()) profiler_.collect();
  }

  Tensor upload(Tensor host, DType dtype) override {
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

  // ---------------------------------------------------------------------------------------------------------------
  // Ops

  void linear(const LinearArgs& a) override {
    const auto timing =
        timed([&] { return str_cat("linear [", a.w.shape[0], " x ", a.w.shape[1], "] M=", a.x.shape[0]); });
    constexpr const char* kOp = "cuda linear";
    a.validate();
    check_gemm_operands(a.x, a.w, a.out, kOp);
    const int64_t m = a.x.shape[0], n = a.w.shape[0], k = a.x.shape[1];
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (!a.accumulate) {
        CUDA_TRY(cudaMemsetAsync(a.out.data, 0, a.out.bytes(), stream_.get()));
        ledger_.serialized();
      }
      return;
    }
    const cuda::SkinnyGemmParams skinny = skinny_params(
        a.x, {{a.w, a.out, a.accumulate ? cuda::SkinnyEpilogue::kAccumulate : cuda::SkinnyEpilogue::kStore}});
    if (use_skinny(a.x.dtype, skinny)) {
      cuda::skinny_gemm(skinny, stream_.get());
      ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
      return;
    }
#ifdef DEEPINFER_HAVE_CUBLAS
    // Row-major out[M, N] = x[M, K] · w[N, K]^T is, column-major, out^T[N, M] = w^T · x^T: cuBLAS sees w as a
    // column-major K x N matrix (ld K) to transpose, x as K x M (ld K), and out as N x M (ld N).
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    const cudaDataType_t type = cuda_type(a.x.dtype);
    CUDA_TRY(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(m, kOp, "M"),
                          gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), a.x.data, type,
                          static_cast<int>(k), &beta, a.out.data, cuda_type(a.out.dtype), static_cast<int>(n),
                          CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    ledger_.library_work(cuda::accesses_of(a));
#else
    throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
  }

  void linear_silu_mul(const LinearSiluMulArgs& a) override {
    a.validate();
    check_gemm_operands(a.x, a.w, a.out, "cuda linear_silu_mul");
    const cuda::SkinnyGemmParams skinny = skinny_params(a.x, {{a.w, a.out, cuda::SkinnyEpilogue::kSiluMul}});
    if (a.out.numel() == 0 || !use_skinny(a.x.dtype, skinny)) {
      Backend::linear_silu_mul(a);  // cuBLAS, then the silu_mul kernel
      return;
    }
    const auto timing =
        timed([&] { return str_cat("linear_silu_mul [", a.w.shape[0], " x ", a.w.shape[1], "] M=", a.x.shape[0]); });
    cuda::skinny_gemm(skinny, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void multi_linear(const MultiLinearArgs& a) override {
    a.validate();
    static_assert(cuda::kSkinnyMaxProblems >= kMultiLinearMaxTargets, "one launch takes every target");
    std::array<SkinnyTarget, kMultiLinearMaxTargets> targets{};  // no allocation per step
    for (size_t i = 0; i < a.targets.size(); ++i) {
      const LinearTarget& t = a.targets[i];
      check_gemm_operands(a.x, t.w, t.out, "cuda multi_linear");
      targets[i] = {t.w, t.out, t.silu_mul ? cuda::SkinnyEpilogue::kSiluMul : cuda::SkinnyEpilogue::kStore};
    }
    const cuda::SkinnyGemmParams skinny =
        skinny_params(a.x, std::span<const SkinnyTarget>(targets.data(), a.targets.size()));
    if (a.x.shape[0] == 0 || !use_skinny(a.x.dtype, skinny)) {
      Backend::multi_linear(a);  // one op per target, each with its own choice of kernel
      return;
    }
    const auto timing = timed([&] {
      std::string label = str_cat("multi_linear M=", a.x.shape[0]);
      for (const LinearTarget& t : a.targets) label += str_cat(" [", t.w.shape[0], " x ", t.w.shape[1], "]");
      return label;
    });
    cuda::skinny_gemm(skinny, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void head_linear(const HeadLinearArgs& a) override {
    const auto timing = timed([&] { return str_cat("head_linear ", a.w.shape.str(), " T=", a.x.shape[0]); });
    constexpr const char* kOp = "cuda head_linear";
    a.validate();
    check_gemm_operands(a.x, a.w, a.out, kOp);
    const int64_t tokens = a.x.shape[0], heads = a.x.shape[1], k = a.x.shape[2], n = a.w.shape[1];
    const int64_t x_stride = a.x_head_stride == 0 ? k : a.x_head_stride;
    const int64_t out_stride = a.out_head_stride == 0 ? n : a.out_head_stride;
    if (tokens == 0 || heads == 0 || n == 0) return;
    if (head_gemv_enabled_ && a.x.dtype == DType::kBF16 && a.w.dtype == DType::kBF16 && a.out.dtype == DType::kBF16) {
      const cuda::Trigger trigger = ledger_.trigger(OpKind::kHeadLinear);
      const cuda::HeadGemvParams gemv{.x = static_cast<const uint16_t*>(a.x.data),
                                      .w = static_cast<const uint16_t*>(a.w.data),
                                      .out = static_cast<uint16_t*>(a.out.data), .tokens = tokens, .heads = heads,
                                      .k = k, .n = n, .x_head_stride = x_stride, .out_head_stride = out_stride,
                                      .num_sms = num_sms_,
                                      .before_wait = op_overlap_enabled_ && ledger_.head_linear_before_wait(a) ? 1 : 0,
                                      .trigger_early = trigger == cuda::Trigger::kAtStart ? 1 : 0};
      if (cuda::head_gemv_fits(gemv)) {  // decode sizes: weights loaded while the previous kernel drains
        cuda::head_gemv(gemv, stream_.get());
        ledger_.launched(trigger, cuda::accesses_of(a));
        return;
      }
    }
#ifdef DEEPINFER_HAVE_CUBLAS
    if (k == 0) {  // every (token, head) row of out is N zeros, rows out_stride apart
      const size_t elem = dtype_size(a.out.dtype);
      CUDA_TRY(cudaMemset2DAsync(a.out.data, static_cast<size_t>(out_stride) * elem, 0, static_cast<size_t>(n) * elem,
                                 static_cast<size_t>(tokens * heads), stream_.get()));
      ledger_.serialized();
      return;
    }
    // Head h: out[:, h, :] = x[:, h, :] · w[h]^T. Column-major per head: out_h^T[N, T] = w_h^T · x_h^T, where x_h is
    // K x T with ld H*x_stride starting at h*x_stride, w_h is K x N (ld K) at h*N*K, and out_h is N x T with ld
    // H*out_stride at h*out_stride.
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = cuda_type(a.x.dtype);
    CUDA_TRY(cublasGemmStridedBatchedEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(tokens, kOp, "T"),
        gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), n * k, a.x.data, type,
        gemm_int(heads * x_stride, kOp, "H * x head stride"), x_stride, &beta, a.out.data, cuda_type(a.out.dtype),
        gemm_int(heads * out_stride, kOp, "H * out head stride"), out_stride, gemm_int(heads, kOp, "H"),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    ledger_.library_work(cuda::accesses_of(a));
#else
    throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
  }

  void embedding(const EmbeddingArgs& a) override {
    const auto timing = timed("embedding");
    a.validate();  // shapes and dtypes; the ids are device memory, checked on the host before their upload
    cuda::embedding(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void gather_rows(const GatherRowsArgs& a) override {
    const auto timing = timed("gather_rows");
    a.validate();
    cuda::gather_rows(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::accesses_of(a));
  }

  void copy_strided(const CopyStridedArgs& a) override {
    const auto timing = timed("copy_strided");
    a.validate();
    cuda::copy_strided(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void rms_norm(const RmsNormArgs& a) override {
    const auto timing = timed("rms_norm");
    a.validate();
    if (a.x.dtype == DType::kF32) {
      cuda::rms_norm_f32(a, stream_.get());
    } else {
      cuda::rms_norm(a, stream_.get());
    }
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void add_rms_norm(const AddRmsNormArgs& a) override {
    const auto timing = timed("add_rms_norm");
    a.validate();
    const cuda::Trigger trigger = ledger_.trigger(OpKind::kAddRmsNorm);
    cuda::add_rms_norm(a, trigger == cuda::Trigger::kAtStart, stream_.get());
    ledger_.launched(trigger, cuda::OpAccesses::any());
  }

  void silu_mul(const SiluMulArgs& a) override {
    const auto timing = timed("silu_mul");
    a.validate();
    cuda::silu_mul(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void add(const AddArgs& a) override {
    const auto timing = timed("add");
    a.validate();
    cuda::add(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::accesses_of(a));
  }

  void rope(const RopeArgs& a) override {
    const auto timing = timed("rope");
    a.validate();
    DI_CHECK(a.device == Device::kCuda, "cuda rope: x, positions and inv_freq must be in device memory");
    if (a.num_tokens() == 0 || a.num_heads == 0 || a.rot_dim == 0) return;
    cuda::rope({.x = a.x, .positions = a.positions.as<int32_t>(), .inv_freq = a.inv_freq.as<float>(),
                .num_tokens = a.num_tokens(), .num_heads = a.num_heads, .rot_dim = a.rot_dim,
                .token_stride = a.token_stride, .head_stride = a.head_stride,
                .attention_scaling = a.attention_scaling, .interleaved = a.interleaved},
               a.dtype, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void mla_cache_write(const MlaCacheWriteArgs& a) override {
    const auto timing = timed("mla_cache_write");
    a.validate();  // shapes and dtypes; the slots are device memory, checked on the host before their upload
    cuda::mla_cache_write(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::accesses_of(a));
  }

  // One kernel for the norm, both ropes, the cache write and the decode query's rope columns (mla_prepare.cu).
  void mla_prepare(const MlaPrepareArgs& a) override {
    const auto timing = timed("mla_prepare");
    cuda::mla_prepare(a, stream_.get());  // validates: shapes, dtypes, devices; the slots are device memory
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::accesses_of(a));
  }

  void mla_decode(const MlaDecodeArgs& a) override {
    const auto timing = timed("mla_decode");
    constexpr const char* kOp = "cuda mla_decode";
    a.validate();  // shapes and dtypes; the metadata is device memory, checked on the host before its upload
    check_on_device(a.q, kOp, "q");
    check_on_device(a.cache, kOp, "cache");
    check_on_device(a.out_latent, kOp, "out_latent");
    check_on_device(a.meta.context_lens, kOp, "context_lens");
    check_on_device(a.meta.page_table, kOp, "page_table");
    if (a.projects()) {
      check_on_device(a.w_uv, kOp, "w_uv");
      check_on_device(a.out, kOp, "out");
    }
    const int64_t seqs = a.meta.num_seqs, heads = a.q.shape[1];
    if (seqs == 0 || heads == 0) return;
    if (a.q.dtype != DType::kBF16 || a.kv_lora_rank != kDecodeRank || a.q.shape[2] != kDecodeRowDim ||
        heads % kDecodeHeadMultiple != 0) {
      throw UnsupportedOp(str_cat(kOp, ": the kernel takes bfloat16 rows of ", kDecodeRank, " + ",
                                  kDecodeRowDim - kDecodeRank, " values and heads in multiples of ",
                                  kDecodeHeadMultiple, "; got ", dtype_name(a.q.dtype), " rows of ", a.kv_lora_rank,
                                  " + ", a.q.shape[2] - a.kv_lora_rank, " values and ", heads, " heads"));
    }
    DI_CHECK(a.cache.shape[1] <= INT32_MAX && heads <= INT32_MAX, kOp, ": page size ", a.cache.shape[1], ", ",
             heads, " heads");
    cuda::MlaDecodeParams p{.q = a.q.as<uint16_t>(),
                            .cache = a.cache.as<uint16_t>(),
                            .page_table = a.meta.page_table.as<int32_t>(),
                            .context_lens = a.meta.context_lens.as<int32_t>(),
                            .out = a.out_latent.as<uint16_t>(),
                            .workspace = nullptr,
                            .batch = a.meta.num_seqs,
                            .num_heads = static_cast<int32_t>(heads),
                            .page_size = static_cast<int32_t>(a.cache.shape[1]),
                            .max_pages_per_seq = a.meta.max_pages_per_seq,
                            .max_context_len = a.meta.max_context_len,
                            .num_sms = num_sms_,
                            .fresh_rows = mla_decode_prewait_enabled_ ? ledger_.mla_decode_fresh_rows(a) : -1,
                            .trigger_early = ledger_.trigger(OpKind::kMlaDecode) == cuda::Trigger::kAtStart ? 1 : 0,
                            .softmax_scale = a.softmax_scale};
    // The split count, chosen once: the workspace, the decode kernels and W_UV's fold below all take this one.
    p.num_splits = cuda::mla_decode_num_splits(p);
    // The split partials live in one workspace the backend owns, grown to the largest decode seen so far and never
    // shrunk (the old one is freed in stream order, after the work that still reads it). It is sized from host
    // values only (batch, heads, max_context_len), so no step waits for the device. A CUDA graph captured later must
    // be replayed only with decodes that fit the workspace it captured.
    const size_t bytes = cuda::mla_decode_workspace_bytes(p);
    if (bytes > workspace_.view().bytes()) {
      workspace_ = workspace(bytes);
    }
    p.workspace = bytes > 0 ? workspace_.view().data : nullptr;
    // The attention kernels trigger after their wait: once the op after this one starts, every op before it has
    // completed, whatever the combine or W_UV's kernel trigger. The op is recorded before the projection's
    // head_linear, which records itself.
    const auto record = [&] { ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any()); };
    if (!a.projects()) {
      cuda::mla_decode(p, stream_.get());
      record();
      return;
    }
    // The projection: for one sequence with split partials, W_UV's head_gemv combines them as it reads its x (one
    // dependent launch fewer: the combine kernel's); else the combine kernel, then head_linear on out_latent. v2-lite
    // on an H200 (engine_bench, context 1k): batch 1 2.210-2.238 ms/step folded against 2.235-2.246 not; batch 2, 4
    // and 8 were 1-2% slower folded (3.047-3.089 / 4.432-4.481 / 6.216-6.244 against 3.025-3.052 / 4.343-4.395 /
    // 6.088-6.126): with more rows, the 64 CTAs of W_UV read the partials with less parallelism than the combine's
    // grid of a CTA per row and column block.
    const HeadLinearArgs projection = a.projection();
    const bool projection_early = ledger_.trigger(OpKind::kHeadLinear) == cuda::Trigger::kAtStart;
    const cuda::HeadGemvParams gemv{.x = nullptr,
                                    .w = projection.w.as<uint16_t>(),
                                    .out = projection.out.as<uint16_t>(),
                                    .tokens = seqs,
                                    .heads = heads,
                                    .k = kDecodeRank,
                                    .n = projection.w.shape[1],
                                    .x_head_stride = kDecodeRank,
                                    .out_head_stride = projection.w.shape[1],
                                    .num_sms = num_sms_,
                                    .before_wait = 0,
                                    .trigger_early = projection_early ? 1 : 0,
                                    .x_partials = static_cast<const float*>(p.workspace),
                                    .x_splits = p.num_splits};
    const bool fold_combine = mla_fused_combine_enabled_ && head_gemv_enabled_ && seqs == 1 && p.workspace != nullptr &&
                              a.w_uv.dtype == DType::kBF16 && a.out.dtype == DType::kBF16 &&
                              cuda::head_gemv_fits(gemv);
    p.defer_combine = fold_combine ? 1 : 0;
    cuda::mla_decode(p, stream_.get());
    record();
    if (fold_combine) {
      cuda::head_gemv(gemv, stream_.get());  // part of this op's entry: it starts after the attention's trigger
    } else {
      head_linear(projection);
    }
  }

  // Decompressing prefill: gather each prefill sequence's latent rows (the sequences' contexts back to back),
  // decompress them with one cuBLAS GEMM (kv = c_kv · kv_b^T: per head 128 k_nope then 128 v columns), then the causal
  // flash-attention kernel reads q, the kv rows and the latents' k_pe.
  void mla_prefill(const MlaPrefillArgs& a) override {
    const auto timing = timed("mla_prefill");
    constexpr const char* kOp = "cuda mla_prefill";
    a.validate();  // shapes and dtypes; the metadata is device memory, checked on the host before its upload
    check_on_device(a.q, kOp, "q");
    check_on_device(a.cache, kOp, "cache");
    check_on_device(a.kv_b, kOp, "kv_b");
    check_on_device(a.out, kOp, "out");
    check_on_device(a.meta.query_start, kOp, "query_start");
    check_on_device(a.meta.context_lens, kOp, "context_lens");
    check_on_device(a.meta.page_table, kOp, "page_table");
    const int64_t tokens = a.q.shape[0], heads = a.q.shape[1];
    const int64_t seqs = a.meta.num_seqs, max_ctx = a.meta.max_context_len;
    if (tokens == 0 || heads == 0 || seqs == 0 || max_ctx == 0) return;
    if (a.q.dtype != DType::kBF16 || a.kv_b.dtype != DType::kBF16 || a.kv_lora_rank != cuda::kMlaPrefillRank ||
        a.cache.shape[2] != cuda::kMlaPrefillRank + cuda::kMlaPrefillRope ||
        a.qk_nope_head_dim != cuda::kMlaPrefillNope || a.v_head_dim != cuda::kMlaPrefillV) {
      throw UnsupportedOp(str_cat(kOp, ": the kernels take bfloat16 q, cache and kv_b at DeepSeek's dims (rank ",
                                  cuda::kMlaPrefillRank, ", rope ", cuda::kMlaPrefillRope, ", nope ",
                                  cuda::kMlaPrefillNope, ", v ", cuda::kMlaPrefillV, "); got ",
                                  dtype_name(a.q.dtype), " q, ", dtype_name(a.kv_b.dtype), " kv_b, rank ",
                                  a.kv_lora_rank, ", rope ", a.cache.shape[2] - a.kv_lora_rank, ", nope ",
                                  a.qk_nope_head_dim, ", v ", a.v_head_dim));
    }
#ifdef DEEPINFER_HAVE_CUBLAS
    const int64_t row_dim = a.cache.shape[2], kv_width = heads * (a.qk_nope_head_dim + a.v_head_dim);
    // The workspace holds every sequence's context back to back; without the host-side sum, its bound.
    const int64_t rows = a.meta.total_context_len > 0 ? a.meta.total_context_len : seqs * max_ctx;
    DI_CHECK(rows <= INT32_MAX && kv_width <= INT32_MAX && heads <= INT32_MAX && a.cache.shape[1] <= INT32_MAX,
             kOp, ": ", seqs, " sequences x longest context ", max_ctx, ", ", heads, " heads, page size ",
             a.cache.shape[1]);
    // Workspace: latents [rows, 576], then kv [rows, H * 256], bf16, 256-byte aligned parts. Owned by the backend,
    // grown to the largest prefill seen so far and never shrunk (the old buffer is freed in stream order); sized from
    // host values only, so no call waits for the device.
    const auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    const size_t latent_bytes = align(static_cast<size_t>(rows * row_dim) * sizeof(uint16_t));
    const size_t kv_bytes = align(static_cast<size_t>(rows * kv_width) * sizeof(uint16_t));
    const size_t bytes = latent_bytes + kv_bytes + 256;
    if (bytes > prefill_workspace_.view().bytes()) {
      prefill_workspace_ = workspace(bytes);
    }
    auto* base = reinterpret_cast<uint8_t*>(align(reinterpret_cast<uintptr_t>(prefill_workspace_.view().data)));
    auto* latents = reinterpret_cast<uint16_t*>(base);
    auto* kv = reinterpret_cast<uint16_t*>(base + latent_bytes);

    cuda::mla_prefill_gather({.cache = a.cache.as<uint16_t>(),
                              .page_table = a.meta.page_table.as<int32_t>(),
                              .context_lens = a.meta.context_lens.as<int32_t>(),
                              .query_start = a.meta.query_start.as<int32_t>(),
                              .latents = latents,
                              .num_seqs = a.meta.num_seqs,
                              .page_size = static_cast<int32_t>(a.cache.shape[1]),
                              .max_pages_per_seq = a.meta.max_pages_per_seq,
                              .max_context_len = a.meta.max_context_len},
                             stream_.get());
    // Row-major kv[rows, N] = latents[rows, :512] (row stride 576) · kv_b[N, 512]^T; column-major as in linear().
    const float alpha = 1.0f, beta = 0.0f;
    CUDA_TRY(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kv_width), static_cast<int>(rows),
                          static_cast<int>(a.kv_lora_rank), &alpha, a.kv_b.data, CUDA_R_16BF,
                          static_cast<int>(a.kv_lora_rank), latents, CUDA_R_16BF, static_cast<int>(row_dim), &beta, kv,
                          CUDA_R_16BF, static_cast<int>(kv_width), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    cuda::mla_prefill_attention({.q = a.q.as<uint16_t>(),
                                 .latents = latents,
                                 .kv = kv,
                                 .context_lens = a.meta.context_lens.as<int32_t>(),
                                 .query_start = a.meta.query_start.as<int32_t>(),
                                 .out = a.out.as<uint16_t>(),
                                 .num_seqs = a.meta.num_seqs,
                                 .num_heads = static_cast<int32_t>(heads),
                                 .max_context_len = a.meta.max_context_len,
                                 .max_queries = static_cast<int32_t>(std::min<int64_t>(tokens, max_ctx)),
                                 .softmax_scale = a.softmax_scale,
                                 .kernel = prefill_kernel_},
                                stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
#else
    throw UnsupportedOp(str_cat(kOp, ": this build has no cuBLAS"));
#endif
  }
  // Routing runs the fused route + alignment kernels (moe_route_align): the alignment it also leaves in its workspace
  // is unused here, since moe_experts takes the ids as an input and aligns them itself (the moe op below does not).
  // The kernels count the shared experts in num_experts and top_k (moe_params.h).
  void moe_route(const MoeRouteArgs& a) override {
    const auto timing = timed("moe_route");
    a.validate();  // shapes and dtypes only
    cuda::MoeParams p = route_params(a, "cuda moe_route");
    if (p.num_tokens == 0 || p.top_k == 0) return;
    p.workspace = moe_route_ws_.prepare(*this, p);
    cuda::moe_route_align(p, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  // The experts take the given ids (the "given ids" mode of the fused kernels: with no router logits, the first
  // kernel only aligns the (token, slot) pairs by expert), then the grouped SwiGLU GEMMs and the weighted combine.
  void moe_experts(const MoeExpertsArgs& a) override {
    const auto timing = timed("moe_experts");
    a.validate();  // shapes and dtypes; the ids are device memory, checked on the host before their upload
    cuda::MoeParams p;
    set_experts_params(a, "cuda moe_experts", p);
    if (p.num_tokens == 0) return;
    p.workspace = moe_experts_ws_.prepare(*this, p);
    cuda::moe_forward(p, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  // Routing and experts with one alignment: the route kernel groups the pairs by expert as it routes, and the expert
  // kernels read that grouping (moe_forward with router logits), one kernel fewer than moe_route + moe_experts. With
  // the router given, the route kernel also computes the logits at decode sizes (one kernel fewer again); otherwise
  // linear computes them first.
  void moe(const MoeArgs& a) override {
    const auto timing = timed("moe");
    constexpr const char* kOp = "cuda moe";
    a.validate();
    check_on_device(a.router, kOp, "router");
    const int64_t tokens = a.x.shape[0];
    if (tokens == 0) return;
    const bool fuse_router = a.router.data != nullptr && fused_router_enabled_ && a.x.dtype == DType::kBF16 &&
                             cuda::moe_fused_router_supported(tokens, a.x.shape[1]);
    if (a.router.data != nullptr && !fuse_router) linear({.x = a.x, .w = a.router, .out = a.router_logits});
    cuda::MoeParams p = route_params(a.route, kOp);
    set_experts_params(a.experts(), kOp, p);
    if (fuse_router) {
      p.router_weight = static_cast<const uint16_t*>(a.router.data);
      p.router_logits_out = a.router_logits.as<float>();
    }
    p.workspace = moe_experts_ws_.prepare(*this, p);
    cuda::moe_forward(p, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

  void sample(const SampleArgs& a) override {
    const auto timing = timed("sample");
    constexpr const char* kOp = "cuda sample";
    a.validate();  // shapes and dtypes; the rows are device memory, checked on the host before their upload
    check_on_device(a.logits, kOp, "logits");
    check_on_device(a.rows, kOp, "rows");
    check_on_device(a.out, kOp, "out");
    cuda::sample(a, stream_.get());
    ledger_.launched(cuda::Trigger::kAfterWait, cuda::OpAccesses::any());
  }

 private:
  // One product of a skinny GEMM launch: weights, output, epilogue.
  struct SkinnyTarget {
    ConstTensorView w;
    TensorView out;
    cuda::SkinnyEpilogue epilogue;
  };

  cuda::SkinnyGemmParams skinny_params(const ConstTensorView& x, std::span<const SkinnyTarget> targets) const {
    cuda::SkinnyGemmParams p{.x = static_cast<const uint16_t*>(x.data), .tokens = x.shape[0], .k_dim = x.shape[1],
                             .x_row_stride = x.shape[1], .num_problems = static_cast<int>(targets.size()),
                             .num_sms = num_sms_};
    for (size_t i = 0; i < targets.size() && i < std::size(p.problems); ++i) {
      const SkinnyTarget& t = targets[i];
      p.problems[i] = {.w = static_cast<const uint16_t*>(t.w.data), .out = t.out.data, .n_out = t.out.shape[1],
                       .out_row_stride = t.out.shape[1], .epilogue = t.epilogue,
                       .out_f32 = t.out.dtype == DType::kF32};
    }
    return p;
  }
  cuda::SkinnyGemmParams skinny_params(const ConstTensorView& x, std::initializer_list<SkinnyTarget> targets) const {
    return skinny_params(x, std::span<const SkinnyTarget>(targets.begin(), targets.size()));
  }

  // Decode-sized bf16 GEMMs go to the skinny kernel where it did not lose to cuBLAS on an H200 (benchmarks/results/
  // skinny_gemm_h200.md, graph-replayed, weights cold in L2): up to 8 tokens with weights up to 48 MB (V2-Lite's
  // kv_a 5.6 vs 6.1 us, shared down += 6.2 vs 7.3), the gated MLP projection at any size (it also saves the silu_mul
  // kernel), and above all several products of one x in one launch (q_proj + kv_a_proj 7.5 vs 12.3 us). cuBLAS keeps
  // 9 tokens and more and the large matrices (both stream them at 94-98% of copy bandwidth); the per-head products
  // are head_linear's (head_gemv.cu or cuBLAS).
  bool use_skinny(DType dtype, const cuda::SkinnyGemmParams& p) const {
    constexpr int64_t kMaxWeightBytes = int64_t{48} << 20;
    if (!skinny_enabled_ || dtype != DType::kBF16 || !cuda::skinny_gemm_fits(p)) return false;
    for (int i = 0; i < p.num_problems; ++i) {
      const cuda::SkinnyProblem& q = p.problems[i];
      const bool silu_mul = q.epilogue == cuda::SkinnyEpilogue::kSiluMul;
      if (!silu_mul && q.n_out * p.k_dim * 2 > kMaxWeightBytes) return false;
    }
    return true;
  }

  // Records `work` into a graph whose tensors come from the arena; the stream is out of capture mode afterwards,
  // whether the recording succeeded or threw.
  std::unique_ptr<StepGraph> record(const std::function<void()>& work) {
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

  // Brackets an op for the profiler, never while a graph is recorded. A label built from the op's shapes comes as a
  // callable, run only when profiling.
  cuda::OpProfiler::Scope timed(const char* label) { return profiler_.scope(!recording_, label); }
  template <std::invocable Label>
  cuda::OpProfiler::Scope timed(const Label& label) {
    const bool on = profiler_.enabled() && !recording_;
    return profiler_.scope(on, on ? label() : std::string());
  }

  // A workspace the backend keeps across calls (grown, never shrunk). Graphs may have recorded the one it replaces,
  // so they stop holding; and none may grow while a graph is recorded (the warm-up run has sized them).
  Tensor workspace(size_t bytes) {
    DI_CHECK(!recording_, "cuda backend: a workspace of ", bytes, " bytes had to grow while a graph was recorded");
    ++graph_generation_;
    return empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, DType::kF32);
  }

  // The fused MoE kernels' workspace: owned by the backend, grown to the largest call seen so far and never shrunk
  // (the old buffer is freed in stream order, after the work that still reads it). It is sized from host values only
  // (tokens, experts, top_k, hidden, intermediate), so no call waits for the device. A CUDA graph captured later must
  // use a workspace pre-sized for the largest batch it replays (run one eager call of that size before capturing):
  // growing it inside a capture would allocate. Its zeroed header (completion counter and count accumulators) is
  // re-zeroed whenever the buffer is new or the header's layout (experts, hidden) changes; every call leaves it zero.
  struct MoeWorkspace {
    Tensor buffer;
    int32_t experts = -1;
    int32_t hidden = -1;

    void* prepare(CudaBackend& be, const cuda::MoeParams& p) {
      constexpr size_t kAlign = 256;  // the kernels want a 256-byte aligned workspace
      const size_t bytes = cuda::moe_workspace_bytes(p) + kAlign;
      bool fresh = false;
      if (bytes > buffer.view().bytes()) {
        buffer = be.workspace(bytes);
        fresh = true;
      }
      const auto base = reinterpret_cast<uintptr_t>(buffer.view().data);
      void* aligned = reinterpret_cast<void*>((base + kAlign - 1) / kAlign * kAlign);
      if (fresh || experts != p.num_experts || hidden != p.hidden) {
        cuda::MoeParams init = p;
        init.workspace = aligned;
        cuda::moe_workspace_init(init, be.stream_.get());
        experts = p.num_experts;
        hidden = p.hidden;
      }
      return aligned;
    }
  };

  // The routing half of the fused MoE kernels' parameters (routed + shared experts and pairs), after the checks.
  cuda::MoeParams route_params(const MoeRouteArgs& a, const char* op) const {
    check_on_device(a.logits, op, "logits");
    check_on_device(a.correction_bias, op, "correction_bias");
    check_on_device(a.topk_ids, op, "topk_ids");
    check_on_device(a.topk_weights, op, "topk_weights");
    const int64_t tokens = a.logits.shape[0], routed = a.logits.shape[1], shared = a.num_shared_experts;
    const int64_t experts = routed + shared, top_k = a.topk_ids.shape[1];  // routed + shared experts and pairs
    if (tokens > 0 && top_k > 0) {  // nothing to route: no limit applies (the call does nothing)
      if (routed > cuda::kMoeMaxRoutedExperts) {
        throw UnsupportedOp(str_cat(op, ": the kernels route among at most ", cuda::kMoeMaxRoutedExperts,
                                    " experts; got ", routed));
      }
      check_moe_sizes(experts, top_k, op);
    }
    DI_CHECK(tokens <= (int64_t{1} << 24), op, ": ", tokens, " tokens");
    return {.router_logits = a.logits.as<float>(),
            .correction_bias = a.correction_bias.numel() > 0 ? a.correction_bias.as<float>() : nullptr,
            .topk_ids = a.topk_ids.as<int32_t>(),
            .topk_weights = a.topk_weights.as<float>(),
            .num_tokens = static_cast<int32_t>(tokens),
            .num_experts = static_cast<int32_t>(experts),
            .top_k = static_cast<int32_t>(top_k),
            .num_shared_experts = static_cast<int32_t>(shared),
            .n_group = static_cast<int32_t>(a.n_group),
            .topk_group = static_cast<int32_t>(a.topk_group),
            .routed_scaling_factor = a.routed_scaling_factor,
            .scoring = a.scoring == ExpertScoring::kSoftmax ? cuda::MoeScoring::kSoftmax : cuda::MoeScoring::kSigmoid,
            .method = a.method == TopkMethod::kGreedy               ? cuda::MoeTopkMethod::kGreedy
                      : a.method == TopkMethod::kGroupLimitedGreedy ? cuda::MoeTopkMethod::kGroupLimitedGreedy
                                                                    : cuda::MoeTopkMethod::kNoauxTc,
            .normalize = a.norm_topk_prob ? cuda::MoeNormalize::kYes : cuda::MoeNormalize::kNo,
            .num_sms = num_sms_};
  }

  // The experts half: operands, sizes, and the ids and weights (read, never written, when given as inputs).
  void set_experts_params(const MoeExpertsArgs& a, const char* op, cuda::MoeParams& p) const {
    check_on_device(a.x, op, "x");
    check_on_device(a.w_gate_up, op, "w_gate_up");
    check_on_device(a.w_down, op, "w_down");
    check_on_device(a.topk_ids, op, "topk_ids");
    check_on_device(a.topk_weights, op, "topk_weights");
    check_on_device(a.out, op, "out");
    const int64_t tokens = a.x.shape[0], hidden = a.x.shape[1], experts = a.w_gate_up.shape[0];
    const int64_t inter = a.w_down.shape[2], top_k = a.topk_ids.shape[1];
    p.num_tokens = static_cast<int32_t>(tokens);
    p.num_sms = num_sms_;
    if (tokens == 0) return;
    if (a.x.dtype != DType::kBF16 || a.w_gate_up.dtype != DType::kBF16 || a.w_down.dtype != DType::kBF16 ||
        hidden % 32 != 0 || inter % 32 != 0 || hidden == 0 || inter == 0 || top_k == 0) {
      throw UnsupportedOp(str_cat(op, ": the kernels take bfloat16 x and weights with hidden and intermediate sizes "
                                  "in positive multiples of 32; got ", dtype_name(a.x.dtype), " x, ",
                                  dtype_name(a.w_gate_up.dtype), " weights, hidden ", hidden, ", intermediate ",
                                  inter, ", top_k ", top_k));
    }
    check_moe_sizes(experts, top_k, op);
    DI_CHECK(tokens <= (int64_t{1} << 24) && hidden <= INT32_MAX && inter <= INT32_MAX, op, ": ", tokens,
             " tokens, hidden ", hidden, ", intermediate ", inter);
    p.topk_ids = const_cast<int32_t*>(a.topk_ids.as<int32_t>());  // given ids: the kernels only read them
    p.topk_weights = const_cast<float*>(a.topk_weights.as<float>());
    p.x = a.x.as<uint16_t>();
    p.w_gate_up = a.w_gate_up.as<uint16_t>();
    p.w_down = a.w_down.as<uint16_t>();
    p.add = nullptr;
    p.out = a.out.as<uint16_t>();
    p.hidden = static_cast<int32_t>(hidden);
    p.inter = static_cast<int32_t>(inter);
    p.num_experts = static_cast<int32_t>(experts);
    p.top_k = static_cast<int32_t>(top_k);
  }

  // Experts and pairs a token, routed and shared together.
  static void check_moe_sizes(int64_t experts, int64_t top_k, const char* op) {
    constexpr int64_t kMaxExperts = cuda::kMoeMaxExperts, kMaxTopK = cuda::kMoeMaxPairs;
    if (experts < 1 || experts > kMaxExperts || top_k < 1 || top_k > kMaxTopK) {
      throw UnsupportedOp(str_cat(op, ": the kernels take 1 to ", kMaxExperts, " experts and 1 to ", kMaxTopK,
                                  " pairs a token (routed and shared); got ", experts, " experts, ", top_k, " pairs"));
    }
  }

  static void check_copy(const ConstTensorView& src, const ConstTensorView& dst, Device src_device,
                         Device dst_device, const char* op) {
    DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), op, ": ", src.shape.str(), " ",
             dtype_name(src.dtype), " into ", dst.shape.str(), " ", dtype_name(dst.dtype));
    DI_CHECK((src.device == src_device || src.numel() == 0) && (dst.device == dst_device || dst.numel() == 0), op,
             ": from ", device_name(src.device), " to ", device_name(dst.device), " memory");
  }

  // Declared first, destroyed last: everything below frees its memory in its order.
  cuda::CudaStream stream_;
  MemoryPool pool_;
  cuda::GraphArena arena_{stream_.get()};
  cuda::OpProfiler profiler_{stream_.get()};
  bool recording_ = false;
  uint64_t graph_generation_ = 0;
  // The ops that may still run on the stream and what they touch: decides the kernels' pre-wait reads and triggers.
  cuda::LaunchLedger ledger_{cuda::early_trigger_enabled()};
  int num_sms_ = 0;
  const bool skinny_enabled_ = skinny_gemm_enabled_from_env();
  const bool head_gemv_enabled_ = head_gemv_enabled_from_env();  // head_linear at decode sizes on head_gemv.cu
  const bool fused_router_enabled_ = fused_router_enabled_from_env();  // moe's router logits in the route kernel
  const bool mla_decode_prewait_enabled_ = mla_decode_prewait_enabled_from_env();  // honours the ledger's fresh_rows
  const bool op_overlap_enabled_ = op_overlap_enabled_from_env();  // honours the ledger's before_wait
  const bool mla_fused_combine_enabled_ = mla_fused_combine_enabled_from_env();  // split combine inside W_UV
  const cuda::MlaPrefillKernel prefill_kernel_ = cuda::mla_prefill_kernel_from_env();  // DEEPINFER_MLA_PREFILL
  Tensor workspace_;  // MLA decode split partials (see mla_decode)
  Tensor prefill_workspace_;  // MLA prefill gathered latents and decompressed k_nope | v (see mla_prefill)
  MoeWorkspace moe_route_ws_;    // routing (its alignment output is unused)
  MoeWorkspace moe_experts_ws_;  // alignment, activations and per-pair outputs of the experts (and moe's routing)
#ifdef DEEPINFER_HAVE_CUBLAS
  cuda::CublasHandle cublas_;
#endif
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  int count = 0;
  CUDA_TRY(cudaGetDeviceCount(&count));
  DI_CHECK(device_index >= 0 && device_index < count, "cuda backend: device ", device_index, " of ", count);
  CUDA_TRY(cudaSetDevice(device_index));
  return std::make_unique<CudaBackend>();
}

}  // namespace deepinfer
