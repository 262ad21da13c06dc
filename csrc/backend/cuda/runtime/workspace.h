// The workspaces a CUDA context keeps across calls, one per use (WorkspaceUse). Each is grown to the largest request
// seen so far and never shrunk (the old buffer is freed in stream order, after the work that still reads it). Requests
// are sized from host values only (batch, heads, context bounds, tokens, experts), so no call waits for the device.
// Growing replaces memory a recorded graph may use: the context's graph generation then moves on (those graphs stop
// holding), and no workspace may grow while a graph is recorded (capture()'s warm-up run has sized them; a graph must
// be replayed only with calls that fit the workspaces it recorded).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace deepinfer::cuda {

enum class WorkspaceUse : uint8_t {
  kMlaDecode,   // MLA decode's split partials (mla/mla_decode_op.cpp)
  kMlaPrefill,  // MLA prefill's gathered latents and decompressed k_nope | v (mla/mla_prefill_op.cpp)
  kMoeRoute,    // moe_route's routing and alignment (the alignment unused)
  kMoeExperts,  // alignment, activations and per-pair outputs of moe_experts and moe (moe/moe_op.cpp)
  kFp8Activations,  // W8A8 prefill: quantized activations, their scales and cuBLASLt's workspace (gemm/fp8_linear.cpp)
  kWeightDequant,   // FP8 and INT4 prefill: a chunk of weight rows widened for the dense GEMM (gemm/dequantized_linear.h)
  kF16Activations,  // FP8 decode GEMMs: the activations rescaled to fp16, per token (gemm/linear_op.cpp)
};
inline constexpr size_t kWorkspaceUses = 7;
static_assert(static_cast<size_t>(WorkspaceUse::kF16Activations) + 1 == kWorkspaceUses, "one workspace per use");

struct WorkspaceRequest {
  size_t bytes = 0;
  // > 1: the address returned is a multiple of it (a power of two), and the buffer holds `alignment` bytes more.
  size_t alignment = 1;
  // What the caller keeps in the buffer between calls (the MoE kernels' zeroed header depends on the expert count and
  // hidden size); WorkspaceGrant::fresh says when it must be set up again.
  uint64_t layout = 0;
};

struct WorkspaceGrant {
  void* data = nullptr;
  // The buffer is new, or held another layout before this call: what the caller keeps in it must be set up again.
  bool fresh = false;
};

class Workspace {
 public:
  // The request's memory. When the buffer is smaller than the request, it is replaced by allocate(bytes), a Tensor of
  // at least `bytes` bytes.
  template <typename Allocate>
  WorkspaceGrant take(const WorkspaceRequest& r, Allocate&& allocate) {
    const size_t bytes = r.bytes + (r.alignment > 1 ? r.alignment : 0);
    bool fresh = false;
    if (bytes > buffer_.view().bytes()) {
      buffer_ = allocate(bytes);
      fresh = true;
    }
    fresh = fresh || layout_ != r.layout;
    layout_ = r.layout;
    auto* data = buffer_.view().data;
    if (r.alignment > 1) {
      const auto base = reinterpret_cast<uintptr_t>(data);
      data = reinterpret_cast<void*>((base + r.alignment - 1) / r.alignment * r.alignment);
    }
    return {.data = data, .fresh = fresh};
  }

 private:
  Tensor buffer_;
  std::optional<uint64_t> layout_;  // none before the first request
};

}  // namespace deepinfer::cuda
