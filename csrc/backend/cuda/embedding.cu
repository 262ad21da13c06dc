// Embedding gather: one block per token copies its table row in the widest unit the row size and alignment allow.
#include "backend/cuda/embedding.cuh"

#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_vec.cuh"
#include "backend/cuda/embedding_params.h"

namespace deepinfer::cuda {
namespace {

template <typename CopyUnit>
struct GatherTraits {
  static_assert(sizeof(CopyUnit) <= 16, "at most 16-byte accesses");
  using Unit = CopyUnit;
  static constexpr int kThreads = 128;
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) embedding_kernel(__grid_constant__ const EmbeddingParams p) {
  const int64_t t = blockIdx.x;
  const int32_t id = p.token_ids[t];
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

}  // namespace

void embedding(const EmbeddingArgs& a, const int32_t* token_ids, cudaStream_t stream) {
  constexpr const char* kOp = "cuda embedding";
  DI_CHECK(a.table.shape.ndim() == 2 && a.out.shape.ndim() == 2 &&
               a.out.shape[0] == static_cast<int64_t>(a.token_ids.size()) && a.out.shape[1] == a.table.shape[1],
           kOp, ": out ", a.out.shape.str(), " for ", a.token_ids.size(), " tokens of table ", a.table.shape.str());
  DI_CHECK(a.table.dtype == a.out.dtype, kOp, ": table is ", dtype_name(a.table.dtype), " but out is ",
           dtype_name(a.out.dtype));
  DI_CHECK(a.table.device == Device::kCuda && a.out.device == Device::kCuda, kOp,
           ": table and out must be in device memory");
  const EmbeddingParams p{.token_ids = token_ids, .table = a.table.data, .out = a.out.data,
                          .num_tokens = a.out.shape[0], .vocab = a.table.shape[0],
                          .row_bytes = a.table.shape[1] * static_cast<int64_t>(dtype_size(a.table.dtype))};
  DI_CHECK(p.num_tokens <= INT_MAX, kOp, ": ", p.num_tokens, " tokens exceed the grid");
  if (p.num_tokens == 0 || p.row_bytes == 0) return;
  DI_CHECK(token_ids != nullptr, kOp, ": no device token ids");
  dispatch_copy_unit(copy_unit_bytes(p.table, p.out, p.row_bytes), [&](auto unit) {
    using Traits = GatherTraits<decltype(unit)>;
    embedding_kernel<Traits><<<static_cast<unsigned>(p.num_tokens), Traits::kThreads, 0, stream>>>(p);
    CUDA_TRY(cudaGetLastError());
  });
}

}  // namespace deepinfer::cuda
