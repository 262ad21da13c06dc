// The CUDA backend: validates each op's arguments on the host (shapes, dtypes, device; never reading device memory)
// and queues its kernel, or its cuBLAS call, on the backend's stream.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/cublas_handle.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/mla_cache_write.cuh"
#include "backend/cuda/norm_residual.cuh"
#include "backend/cuda/rms_norm.cuh"
#include "backend/cuda/rope.cuh"

namespace deepinfer {
namespace {

// TEMPORARY: device copies of the host arrays some op arguments still carry as spans (EmbeddingArgs::token_ids,
// RopeArgs::positions and inv_freq, MlaCacheWriteArgs::slot_mapping). Each staged op costs one host-to-device copy
// from pageable memory, which may wait for the stream and cannot be captured in a CUDA graph. It goes away once those
// arguments are device arrays, uploaded once per step with the rest of the batch metadata.
class HostArrayStaging {
 public:
  static constexpr size_t kInitialBytes = size_t{1} << 20;
  static constexpr size_t kAlignment = 16;

  explicit HostArrayStaging(cudaStream_t stream) : stream_(stream), device_(kInitialBytes, stream) {}

  // Copies `first` and `second` to the device in one transfer and returns their device addresses. They stay valid
  // for the work queued on the stream until the next call.
  template <typename A, typename B = std::byte>
  std::pair<const A*, const B*> stage(std::span<const A> first, std::span<const B> second = {}) {
    const size_t second_offset = round_up(first.size_bytes());
    const size_t total = second_offset + second.size_bytes();
    if (total == 0) return {nullptr, nullptr};
    host_.resize(total);
    if (!first.empty()) std::memcpy(host_.data(), first.data(), first.size_bytes());
    if (!second.empty()) std::memcpy(host_.data() + second_offset, second.data(), second.size_bytes());
    if (total > device_.bytes()) {
      // The old buffer is freed in stream order, after the work that still reads it.
      device_ = cuda::DeviceBuffer(std::max(total, 2 * device_.bytes()), stream_);
    }
    // From pageable memory: the call returns once `host_` has been read, so it can be refilled right away.
    CUDA_TRY(cudaMemcpyAsync(device_.data(), host_.data(), total, cudaMemcpyHostToDevice, stream_));
    const auto* base = static_cast<const std::byte*>(device_.data());
    return {first.empty() ? nullptr : reinterpret_cast<const A*>(base),
            second.empty() ? nullptr : reinterpret_cast<const B*>(base + second_offset)};
  }

 private:
  static size_t round_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  cudaStream_t stream_;
  cuda::DeviceBuffer device_;
  std::vector<std::byte> host_;
};

void check_gemm_operands(const ConstTensorView& x, const ConstTensorView& w, const ConstTensorView& out,
                         const char* op) {
  DI_CHECK(x.dtype == w.dtype && out.dtype == x.dtype && (x.dtype == DType::kBF16 || x.dtype == DType::kF32), op,
           ": x, w and out must all be bfloat16 (or all float32), got ", dtype_name(x.dtype), ", ",
           dtype_name(w.dtype), " and ", dtype_name(out.dtype));
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

class CudaBackend final : public Backend {
 public:
  // The device must already be current (make_cuda_backend makes it so).
  CudaBackend()
      : staging_(stream_.get())
#ifdef DEEPINFER_HAVE_CUBLAS
        ,
        cublas_(stream_.get())
#endif
  {
  }

  Device device() const override { return Device::kCuda; }
  std::string_view name() const override { return "cuda"; }

  bool supports(OpKind op) const override {
    switch (op) {
      case OpKind::kLinear:
      case OpKind::kHeadLinear:
#ifdef DEEPINFER_HAVE_CUBLAS
        return true;
#else
        return false;
#endif
      case OpKind::kEmbedding:
      case OpKind::kRmsNorm:
      case OpKind::kAddRmsNorm:
      case OpKind::kSiluMul:
      case OpKind::kAdd:
      case OpKind::kRope:
      case OpKind::kMlaCacheWrite:
        return true;
      // TODO(mla_decode): wire cuda::mla_decode (mla_decode.cuh) once it is finished. It takes q as one
      // [T, H, 576] tensor (q_latent | q_pe) and device page tables / context lengths, while MlaDecodeArgs holds
      // q_latent and q_pe apart and its AttentionMetadata as host spans; the args need device metadata first, and
      // the backend a persistent split workspace of mla_decode_workspace_bytes().
      case OpKind::kMlaDecode:
      // TODO: MLA prefill (causal attention over prefix + new tokens, q/k 192, v 128), MoE routing and the grouped
      // expert GEMMs.
      case OpKind::kMlaPrefill:
      case OpKind::kMoeRoute:
      case OpKind::kMoeExperts:
        return false;
    }
    return false;
  }

  void linear(const LinearArgs& a) override {
    constexpr const char* kOp = "cuda linear";
    a.validate();
    check_gemm_operands(a.x, a.w, a.out, kOp);
#ifdef DEEPINFER_HAVE_CUBLAS
    const int64_t m = a.x.shape[0], n = a.w.shape[0], k = a.x.shape[1];
    if (m == 0 || n == 0) return;
    if (k == 0) {
      CUDA_TRY(cudaMemsetAsync(a.out.data, 0, a.out.bytes(), stream_.get()));
      return;
    }
    // Row-major out[M, N] = x[M, K] · w[N, K]^T is, column-major, out^T[N, M] = w^T · x^T: cuBLAS sees w as a
    // column-major K x N matrix (ld K) to transpose, x as K x M (ld K), and out as N x M (ld N).
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = cuda_type(a.x.dtype);
    CUDA_TRY(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(m, kOp, "M"),
                          gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), a.x.data, type,
                          static_cast<int>(k), &beta, a.out.data, type, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
#else
    DI_CHECK(false, kOp, ": this build has no cuBLAS");
#endif
  }

  void head_linear(const HeadLinearArgs& a) override {
    constexpr const char* kOp = "cuda head_linear";
    a.validate();
    check_gemm_operands(a.x, a.w, a.out, kOp);
#ifdef DEEPINFER_HAVE_CUBLAS
    const int64_t tokens = a.x.shape[0], heads = a.x.shape[1], k = a.x.shape[2], n = a.w.shape[1];
    if (tokens == 0 || heads == 0 || n == 0) return;
    if (k == 0) {
      CUDA_TRY(cudaMemsetAsync(a.out.data, 0, a.out.bytes(), stream_.get()));
      return;
    }
    // Head h: out[:, h, :] = x[:, h, :] · w[h]^T. Column-major per head: out_h^T[N, T] = w_h^T · x_h^T, where x_h is
    // K x T with ld H*K starting at h*K, w_h is K x N (ld K) at h*N*K, and out_h is N x T with ld H*N at h*N.
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = cuda_type(a.x.dtype);
    CUDA_TRY(cublasGemmStridedBatchedEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, gemm_int(n, kOp, "N"), gemm_int(tokens, kOp, "T"),
        gemm_int(k, kOp, "K"), &alpha, a.w.data, type, static_cast<int>(k), n * k, a.x.data, type,
        gemm_int(heads * k, kOp, "H*K"), k, &beta, a.out.data, type, gemm_int(heads * n, kOp, "H*N"), n,
        gemm_int(heads, kOp, "H"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#else
    DI_CHECK(false, kOp, ": this build has no cuBLAS");
#endif
  }

  void embedding(const EmbeddingArgs& a) override {
    a.validate();  // shapes, and every token id in range (the ids are still on the host)
    cuda::embedding(a, staging_.stage(a.token_ids).first, stream_.get());
  }

  void rms_norm(const RmsNormArgs& a) override {
    if (a.x.dtype == DType::kF32) {
      cuda::rms_norm_f32(a, stream_.get());
    } else {
      cuda::rms_norm(a, stream_.get());
    }
  }

  void add_rms_norm(const AddRmsNormArgs& a) override { cuda::add_rms_norm(a, stream_.get()); }
  void silu_mul(const SiluMulArgs& a) override { cuda::silu_mul(a, stream_.get()); }
  void add(const AddArgs& a) override { cuda::add(a, stream_.get()); }

  // RopeArgs::x is a float pointer, so this path rotates float32 tensors; bfloat16 tensors go through cuda::rope
  // (rope.cuh) until RopeArgs carries a dtype.
  void rope(const RopeArgs& a) override {
    a.validate();
    DI_CHECK(a.device == Device::kCuda, "cuda rope: x must be in device memory");
    if (a.num_tokens == 0 || a.num_heads == 0 || a.rot_dim == 0) return;
    const auto [positions, inv_freq] = staging_.stage(a.positions, a.inv_freq);
    cuda::rope({.x = a.x, .positions = positions, .inv_freq = inv_freq, .num_tokens = a.num_tokens,
                .num_heads = a.num_heads, .rot_dim = a.rot_dim, .token_stride = a.token_stride,
                .head_stride = a.head_stride, .attention_scaling = a.attention_scaling,
                .interleaved = a.interleaved},
               DType::kF32, stream_.get());
  }

  void mla_cache_write(const MlaCacheWriteArgs& a) override {
    a.validate();  // shapes, and every slot in range (the slots are still on the host)
    cuda::mla_cache_write(a, staging_.stage(a.slot_mapping).first, stream_.get());
  }

  void mla_decode(const MlaDecodeArgs&) override { unsupported(OpKind::kMlaDecode); }
  void mla_prefill(const MlaPrefillArgs&) override { unsupported(OpKind::kMlaPrefill); }
  void moe_route(const MoeRouteArgs&) override { unsupported(OpKind::kMoeRoute); }
  void moe_experts(const MoeExpertsArgs&) override { unsupported(OpKind::kMoeExperts); }

 private:
  [[noreturn]] static void unsupported(OpKind op) {
    throw Error(str_cat("the cuda backend does not implement ", op_name(op), " yet"));
  }

  // Declared first, destroyed last: the buffers below free themselves in its order.
  cuda::CudaStream stream_;
  HostArrayStaging staging_;
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
