// Row gathers (embedding lookup, gather_rows): one block per output row copies its source row in the widest unit the
// row size and alignment allow.
#include "backend/cuda/memory/embedding.cuh"

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/elementwise/elementwise_vec.cuh"
#include "backend/cuda/memory/embedding_params.h"
#include "backend/cuda/runtime/launch.h"
#include "backend/cuda/runtime/ptx.cuh"

namespace deepinfer::cuda {
namespace {

template <typename Unit>
using GatherTraits = CopyUnitTraits<Unit, 128>;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) embedding_kernel(__grid_constant__ const EmbeddingParams p) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(p.token_ids[t]) - p.first_row;
  auto* dst = static_cast<char*>(p.out) + t * p.row_bytes;
  if (id < 0 || id >= p.vocab) {
    auto* d = reinterpret_cast<typename Traits::Unit*>(dst);
    for (int64_t u = threadIdx.x; u < p.row_bytes / static_cast<int64_t>(sizeof(typename Traits::Unit));
         u += blockDim.x) {
      d[u] = typename Traits::Unit{};
    }
    return;
  }
  copy_row<typename Traits::Unit>(static_cast<const char*>(p.table) + id * p.row_bytes, dst, p.row_bytes);
}

// Checks the views (device, dtypes, shapes; throws deepinfer::Error) and queues the gather.
void gather(const ConstTensorView& table, const ConstTensorView& ids, const TensorView& out, const char* op,
            LaunchStream stream, int64_t first_row = 0) {
  DI_CHECK(table.shape.ndim() == 2 && out.shape.ndim() == 2 && ids.shape.ndim() == 1 &&
               out.shape[0] == ids.shape[0] && out.shape[1] == table.shape[1],
           op, ": out ", out.shape.str(), " for ", ids.shape.str(), " ids of ", table.shape.str());
  DI_CHECK(table.dtype == out.dtype && ids.dtype == DType::kI32, op, ": table is ", dtype_name(table.dtype),
           ", out ", dtype_name(out.dtype), ", ids ", dtype_name(ids.dtype), " (must be int32)");
  DI_CHECK(table.device == Device::kCuda && out.device == Device::kCuda && ids.device == Device::kCuda, op,
           ": table, ids and out must be in device memory");
  const EmbeddingParams p{.token_ids = ids.as<int32_t>(), .table = table.data, .out = out.data,
                          .num_tokens = out.shape[0], .vocab = table.shape[0],
                          .row_bytes = table.shape[1] * static_cast<int64_t>(dtype_size(table.dtype)),
                          .first_row = first_row};
  DI_CHECK(p.num_tokens <= INT_MAX, op, ": ", p.num_tokens, " rows exceed the grid");
  if (p.num_tokens == 0 || p.row_bytes == 0) return;
  dispatch_copy_unit(copy_unit_bytes(p.table, p.out, p.row_bytes), [&](auto unit) {
    using Traits = GatherTraits<decltype(unit)>;
    launch_pdl(embedding_kernel<Traits>,
               {.grid = dim3(static_cast<unsigned>(p.num_tokens)), .block = dim3(Traits::kThreads)}, stream, p);
  });
}

}  // namespace

void embedding(const EmbeddingArgs& a, LaunchStream stream) {
  gather(a.table, a.token_ids, a.out, "cuda embedding", stream, a.first_row);
}

void gather_rows(const GatherRowsArgs& a, LaunchStream stream) {
  gather(a.src, a.indices, a.out, "cuda gather_rows", stream);
}

}  // namespace deepinfer::cuda
