// Checks of an FP8 latent cache on the host, and the row offsets its kernels take.
#include "backend/cuda/mla/latent_fp8_rows.h"

#include "backend/backend.h"
#include "backend/cuda/mla/latent_fp8_math.h"
#include "core/error.h"

namespace deepinfer::cuda {

static_assert(kLatentFp8Group == LatentFp8Layout::kGroup, "the kernels' group is the layout's");

LatentFp8Layout checked_fp8_latent_layout(const ConstTensorView& cache, int64_t rank, int64_t rope_dim,
                                          const char* op) {
  DI_CHECK(is_fp8_latent_cache(cache) && cache.shape.ndim() == 3, op, ": an FP8 latent cache is ",
           dtype_name(DType::kF8E4M3), " [num_pages, page_size, row_bytes], got ", dtype_name(cache.dtype), " ",
           cache.shape.str());
  DI_CHECK(rank > 0 && rope_dim >= 0, op, ": an FP8 latent cache needs kv_lora_rank > 0 and rope >= 0, got rank ",
           rank, ", rope ", rope_dim);
  // Built from the rank and the rope width, not recovered from the row size: the padding makes that ambiguous.
  const LatentFp8Layout layout{.rank = rank, .rope_dim = rope_dim};
  DI_CHECK(layout.row_bytes() == cache.shape[2], op, ": FP8 latent rows of kv_lora_rank ", rank, " and ", rope_dim,
           " rope values take ", layout.row_bytes(), " bytes (", rank, " codes, ", layout.num_groups(),
           " float32 scales, the bf16 rope values, padded to 16), but the cache rows have ", cache.shape[2]);
  if (layout.num_groups() > kLatentFp8MaxGroups) {
    throw UnsupportedOp(str_cat(op, ": FP8 latent rows of kv_lora_rank ", rank, " have ", layout.num_groups(),
                                " scale groups; the kernels take at most ", kLatentFp8MaxGroups, " (rank ",
                                kLatentFp8MaxGroups * kLatentFp8Group, ")"));
  }
  return layout;
}

LatentFp8RowParams fp8_row_params(const LatentFp8Layout& layout) {
  return {.rank = layout.rank,
          .rope_dim = layout.rope_dim,
          .scales_offset = layout.scales_offset(),
          .rope_offset = layout.rope_offset(),
          .row_bytes = layout.row_bytes()};
}

}  // namespace deepinfer::cuda
