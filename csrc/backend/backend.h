// The op interface of one device. The model calls these and never branches on the device; the CPU backend is
// the reference every other backend is tested against.
#pragma once

#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend/ops/copy.h"
#include "backend/ops/dense.h"
#include "backend/ops/mla.h"
#include "backend/ops/moe.h"
#include "backend/ops/rope.h"
#include "backend/ops/sample.h"
#include "core/dummy_normal.h"
#include "core/error.h"

namespace deepinfer {

enum class OpKind : uint8_t {
  kLinear, kLinearSiluMul, kMultiLinear, kHeadLinear, kEmbedding, kGatherRows, kCopyStrided, kRmsNorm, kAddRmsNorm,
  kSiluMul, kAdd, kRope, kMlaCacheWrite, kMlaPrepare, kMlaDecode, kMlaPrefill, kMoeRoute, kMoeExperts, kMoe,
  kSample,  // stays last (tests count on it)
};
std::string_view op_name(OpKind op);

// Thrown by a backend for an op it does not implement, or for arguments outside what its kernels take (a dtype, a
// head size). The op tests report such a case as skipped.
class UnsupportedOp : public Error {
 public:
  using Error::Error;
};

// Work recorded once and replayed as one launch (a CUDA graph); see Backend::capture.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Queues the recorded work again, after the work already queued. Returns false, queuing nothing, when the graph no
  // longer holds because the backend re-planned memory it uses (a workspace grew): capture it again then.
  [[nodiscard]] virtual bool replay() = 0;
};

// A device's memory as the device reports it: what this process and every other holds counts as used.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;
  // Whether the op is implemented at all (for the model's shapes and activation dtype).
  virtual bool supports(OpKind op) const = 0;

  // Memory. The model allocates through these, so its tensors live where the ops run. Every tensor these return
  // must be destroyed before the backend.
  virtual DType activation_dtype() const = 0;  // what the model computes in: float32 on the CPU, bfloat16 on CUDA
  virtual Tensor empty(Shape shape, DType dtype) = 0;  // uninitialized; no per-call device allocation cost
  virtual Tensor zeros(Shape shape, DType dtype) = 0;
  // Host -> this device, queued after the work before it. Returns once `host` may be changed or freed.
  virtual void copy_to_device(ConstTensorView host, TensorView dst) = 0;
  // This device -> host, after the work queued before it has finished: a synchronizing call.
  virtual void copy_to_host(ConstTensorView src, TensorView host) = 0;
  // A host tensor as a tensor of this device with elements of `dtype`: float32 may narrow to bfloat16, any other
  // dtype must match. Takes `host` so that the CPU can hand it back as it is, with no copy (weights at load time,
  // the step's index arrays).
  virtual Tensor upload(Tensor host, DType dtype) = 0;
  // Host memory that copy_to_device reads asynchronously (page-locked on a GPU), for the step's uploads: its contents
  // must stay unchanged until the next copy_to_host, which waits for everything queued before it.
  virtual Tensor staging(Shape shape, DType dtype) { return Tensor::empty(shape, dtype); }
  // The device's memory now, which the engine sizes the latent cache by; std::nullopt where the backend's memory is
  // the host's (the CPU), whose cache the engine sizes by a budget of its own.
  virtual std::optional<DeviceMemoryInfo> memory_info() const { return std::nullopt; }
  // Dummy weights (load_format="dummy") made on this device instead of copied to it: dst[j] =
  // dummy_normal::value_at(range, j) (core/dummy_normal.h), in dst's dtype (float32, or bfloat16 rounded to nearest
  // even), queued like copy_to_device. Returns false, doing nothing, where the backend has no such kernel (the CPU:
  // the loader writes the values it makes on the host).
  virtual bool fill_dummy_normal(TensorView dst, const dummy_normal::StreamRange& range) {
    static_cast<void>(dst), static_cast<void>(range);
    return false;
  }
  // The same for whole 128-row blocks of an FP8 weight, codes e4m3 [rows, cols] (range.row_length == cols): the
  // values quantized as quantize_fp8_block_rows does with Fp8ScaleFormat::kFloat (core/fp8.h), scale_inv float32
  // [ceil(rows / 128), ceil(cols / 128)].
  virtual bool fill_dummy_normal_fp8(TensorView codes, TensorView scale_inv, const dummy_normal::StreamRange& range) {
    static_cast<void>(codes), static_cast<void>(scale_inv), static_cast<void>(range);
    return false;
  }
  // Why this device cannot compute with FP8 weights (a GPU without FP8 tensor cores), or "" when it can. The CPU
  // can: it is the reference and dequantizes.
  virtual std::string fp8_unsupported_reason() const { return {}; }

  // Graphs. capture() runs `work` (ops queued on this backend) once as usual, which sizes every workspace it needs,
  // then records it for replay. The tensors `work` allocates while recorded come from memory the backend keeps for
  // its graphs: those still alive after capture() stay valid, rewritten by each replay of their graph, as long as the
  // graph holds; they may share memory with other graphs' temporaries, so read them before replaying another graph.
  // `work` must not synchronize with the host. Returns nullptr when this backend has no graphs (the CPU).
  virtual std::unique_ptr<StepGraph> capture(const std::function<void()>& work) {
    static_cast<void>(work);
    return nullptr;
  }

  // Ops. Arguments are views on this device (ops/*.h say what each computes); outputs are allocated by the caller.
  virtual void linear(const LinearArgs& a) = 0;
  // Composed ops: a backend with a fused kernel overrides them; the default runs the ops they stand for
  // (dense_composed.cpp, mla_prepare_composed.cpp, moe_composed.cpp), which is the reference the fused kernels are
  // tested against.
  virtual void linear_silu_mul(const LinearSiluMulArgs& a);
  virtual void multi_linear(const MultiLinearArgs& a);
  virtual void head_linear(const HeadLinearArgs& a) = 0;
  virtual void embedding(const EmbeddingArgs& a) = 0;
  virtual void gather_rows(const GatherRowsArgs& a) = 0;
  virtual void copy_strided(const CopyStridedArgs& a) = 0;
  virtual void rms_norm(const RmsNormArgs& a) = 0;
  virtual void add_rms_norm(const AddRmsNormArgs& a) = 0;
  virtual void silu_mul(const SiluMulArgs& a) = 0;
  virtual void add(const AddArgs& a) = 0;
  virtual void rope(const RopeArgs& a) = 0;
  virtual void mla_cache_write(const MlaCacheWriteArgs& a) = 0;
  // Composed op (see linear_silu_mul): the composition MlaPrepareArgs defines.
  virtual void mla_prepare(const MlaPrepareArgs& a);
  virtual void mla_decode(const MlaDecodeArgs& a) = 0;
  virtual void mla_prefill(const MlaPrefillArgs& a) = 0;
  virtual void moe_route(const MoeRouteArgs& a) = 0;
  virtual void moe_experts(const MoeExpertsArgs& a) = 0;
  // Composed op (see linear_silu_mul): moe_route, then moe_experts (moe_composed.cpp).
  virtual void moe(const MoeArgs& a);
  virtual void sample(const SampleArgs& a) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace deepinfer
