// Where the parts of one FP8 latent cache row lie (the layout of backend/ops/latent_fp8.h), as the kernels that write
// or read such rows take it. The launcher copies the offsets from LatentFp8Layout (latent_fp8_rows.h), so the
// kernels never restate the layout's arithmetic.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct LatentFp8RowParams {
  int64_t rank = 0;           // kv_lora_rank: e4m3 codes at bytes [0, rank)
  int64_t rope_dim = 0;       // bf16 k_pe values at rope_offset
  int64_t scales_offset = 0;  // ceil(rank / 128) float32 scales (not 4-byte aligned when rank is not)
  int64_t rope_offset = 0;
  int64_t row_bytes = 0;      // bytes from rope_offset + 2 * rope_dim to row_bytes are zero padding
};

}  // namespace deepinfer::cuda
