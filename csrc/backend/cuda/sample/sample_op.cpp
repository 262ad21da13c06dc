#include "backend/cuda/sample/sample_ops.h"

#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/op_checks.h"
#include "backend/cuda/sample/sample.cuh"

namespace deepinfer::cuda {

void sample(CudaContext& ctx, const SampleArgs& a) {
  const auto timing = ctx.timed("sample");
  constexpr const char* kOp = "cuda sample";
  a.validate();  // shapes and dtypes; the rows are device memory, checked on the host before their upload
  check_on_device(a.logits, kOp, "logits");
  check_on_device(a.rows, kOp, "rows");
  check_on_device(a.out, kOp, "out");
  sample(a, ctx.launch());
  ctx.ledger().launched(Trigger::kAfterWait, OpAccesses::any());
}

}  // namespace deepinfer::cuda
