// Row gathers and strided copies on CUDA: the embedding lookup, gather_rows (rows of a table by int32 ids in device
// memory) and copy_strided (a column block of one row-major tensor into a column block of another).
//
// How they run: the gathers are one block per output row copying its source row (embedding.cu), the strided copy a
// grid-stride loop over (row, unit) pairs (copy_strided.cu), both in the widest unit (16, 8, 4, 2 or 1 bytes) the row
// sizes, strides and addresses allow. Ids are never read on the host: an id outside the table gives a zero row
// (ForwardBatch::validate checks them before upload). The entry points validate the arguments and queue the kernel
// on the context's stream.
#pragma once

#include "backend/ops/copy.h"
#include "backend/ops/dense.h"
#include "core/dummy_normal.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

class CudaContext;

void embedding(CudaContext& ctx, const EmbeddingArgs& a);
void gather_rows(CudaContext& ctx, const GatherRowsArgs& a);
void copy_strided(CudaContext& ctx, const CopyStridedArgs& a);
// Dummy weights made in place (dummy_weights.cuh), at load time.
void fill_dummy_normal(CudaContext& ctx, const TensorView& dst, const dummy_normal::StreamRange& range);
void fill_dummy_normal_fp8(CudaContext& ctx, const TensorView& codes, const TensorView& scale_inv,
                           const dummy_normal::StreamRange& range);

}  // namespace deepinfer::cuda
