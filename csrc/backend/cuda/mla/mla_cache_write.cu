// Latent-cache write: one block per token copies its latent row into its cache slot in the widest unit the row size
// and alignment allow (a 576-value bf16 row moves as 72 16-byte accesses); into an FP8 cache, the block quantizes
// the row instead (latent_fp8_row.cuh: a 576-value row becomes 656 bytes).
#include "backend/cuda/mla/mla_cache_write.cuh"

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/mla/latent_fp8_row.cuh"
#include "backend/cuda/mla/latent_fp8_rows.h"
#include "backend/cuda/mla/mla_cache_write_params.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda {
namespace {

template <typename Unit>
using ScatterTraits = CopyUnitTraits<Unit, 128>;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) mla_cache_write_kernel(
    __grid_constant__ const MlaCacheWriteParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_slots) return;
  copy_row<typename Traits::Unit>(static_cast<const char*>(p.latent) + t * p.row_bytes,
                                  static_cast<char*>(p.cache) + slot * p.row_bytes, p.row_bytes);
}

// One block of kFp8Threads per token: a warp's pass covers 32 values of one group, and DeepSeek's 512 c_kv values
// are four passes of the block (one value a thread each).
constexpr int kFp8Threads = 128;

template <typename T>
__global__ void __launch_bounds__(kFp8Threads) mla_cache_write_fp8_kernel(
    __grid_constant__ const MlaCacheWriteFp8Params p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_slots) return;  // the whole block: no barrier is left waiting
  store_latent_fp8_row<kFp8Threads>(static_cast<const T*>(p.latent) + t * (p.row.rank + p.row.rope_dim), p.row,
                                    p.cache + slot * p.row.row_bytes);
}

void mla_cache_write_fp8(const MlaCacheWriteArgs& a, LaunchStream stream) {
  constexpr const char* kOp = "cuda mla_cache_write";
  DI_CHECK(a.latent.shape.ndim() == 2 && a.slot_mapping.shape.ndim() == 1 &&
               a.slot_mapping.shape[0] == a.latent.shape[0],
           kOp, ": latent ", a.latent.shape.str(), " slots ", a.slot_mapping.shape.str());
  const LatentFp8Layout layout =
      checked_fp8_latent_layout(a.cache, a.kv_lora_rank, a.latent.shape[1] - a.kv_lora_rank, kOp);
  DI_CHECK(a.slot_mapping.dtype == DType::kI32, kOp, ": the slots are ", dtype_name(a.slot_mapping.dtype),
           " (must be int32)");
  DI_CHECK(a.latent.device == Device::kCuda && a.cache.device == Device::kCuda &&
               a.slot_mapping.device == Device::kCuda,
           kOp, ": latent, cache and slot_mapping must be in device memory");
  const MlaCacheWriteFp8Params p{.latent = a.latent.data, .cache = a.cache.as<uint8_t>(),
                                 .slot_mapping = a.slot_mapping.as<int32_t>(), .num_tokens = a.latent.shape[0],
                                 .num_slots = a.cache.shape[0] * a.cache.shape[1], .row = fp8_row_params(layout)};
  DI_CHECK(p.num_tokens <= INT_MAX, kOp, ": ", p.num_tokens, " tokens exceed the grid");
  if (p.num_tokens == 0) return;
  dispatch_activation(a.latent.dtype, kOp, [&](auto element) {
    launch_pdl(mla_cache_write_fp8_kernel<decltype(element)>,
               {.grid = dim3(static_cast<unsigned>(p.num_tokens)), .block = dim3(kFp8Threads)}, stream, p);
  });
}

}  // namespace

void mla_cache_write(const MlaCacheWriteArgs& a, LaunchStream stream) {
  constexpr const char* kOp = "cuda mla_cache_write";
  if (is_fp8_latent_cache(a.cache)) {
    mla_cache_write_fp8(a, stream);
    return;
  }
  DI_CHECK(a.cache.shape.ndim() == 3 && a.latent.shape.ndim() == 2 && a.latent.shape[1] == a.cache.shape[2] &&
               a.slot_mapping.shape.ndim() == 1 && a.slot_mapping.shape[0] == a.latent.shape[0],
           kOp, ": latent ", a.latent.shape.str(), " cache ", a.cache.shape.str(), " slots ",
           a.slot_mapping.shape.str());
  DI_CHECK(a.latent.dtype == a.cache.dtype && a.slot_mapping.dtype == DType::kI32, kOp, ": latent is ",
           dtype_name(a.latent.dtype), ", the cache ", dtype_name(a.cache.dtype), ", the slots ",
           dtype_name(a.slot_mapping.dtype), " (must be int32)");
  DI_CHECK(a.latent.device == Device::kCuda && a.cache.device == Device::kCuda &&
               a.slot_mapping.device == Device::kCuda,
           kOp, ": latent, cache and slot_mapping must be in device memory");
  const MlaCacheWriteParams p{.latent = a.latent.data, .cache = a.cache.data,
                              .slot_mapping = a.slot_mapping.as<int32_t>(), .num_tokens = a.latent.shape[0],
                              .num_slots = a.cache.shape[0] * a.cache.shape[1],
                              .row_bytes = a.cache.shape[2] * static_cast<int64_t>(dtype_size(a.cache.dtype))};
  DI_CHECK(p.num_tokens <= INT_MAX, kOp, ": ", p.num_tokens, " tokens exceed the grid");
  if (p.num_tokens == 0 || p.row_bytes == 0) return;
  dispatch_copy_unit(copy_unit_bytes(p.latent, p.cache, p.row_bytes), [&](auto unit) {
    using Traits = ScatterTraits<decltype(unit)>;
    launch_pdl(mla_cache_write_kernel<Traits>,
               {.grid = dim3(static_cast<unsigned>(p.num_tokens)), .block = dim3(Traits::kThreads)}, stream, p);
  });
}

}  // namespace deepinfer::cuda
