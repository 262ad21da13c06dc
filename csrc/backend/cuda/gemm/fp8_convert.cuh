// The conversions the FP8 GEMMs run around their products: for prefill (fp8_linear.cpp) block-scaled weight rows
// widened to the activations' dtype (W8A16, and W8A8 where cuBLASLt has no block-scaled kernel) and activations
// quantized per token per 128 channels (W8A8, DeepSeek's inference recipe); for decode (fp8_skinny_gemm.cuh) bf16
// activations rescaled into fp16, the type whose MMA takes e4m3 codes widened by one instruction.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/runtime/launch_stream.h"

namespace deepinfer::cuda {

// out[r - first_row][c] = e4m3(codes[r][c]) * scale_inv[r / 128][c / 128] for r in [first_row, first_row + rows),
// out bf16 (out_f32 false) or fp32, row-major [rows, k]. codes: [>= first_row + rows, k], scale_inv:
// [ceil(total rows / 128), ceil(k / 128)]; with k a multiple of 16, codes and out 16-byte aligned (16 codes a
// thread; other k: one element a thread).
void dequantize_fp8_rows(const uint8_t* codes, const float* scale_inv, int64_t first_row, int64_t rows, int64_t k,
                         void* out, bool out_f32, LaunchStream stream);

// Per token t and 128-channel block b of x ([tokens, k], bf16 unless x_f32; k a positive multiple of 128):
//   scale[b * tokens + t] = amax / 448 (1 for an all-zero block), codes[t][c] = e4m3(x[t][c] / scale)
// (nearest, saturating). The scales are token-contiguous: the layout cuBLASLt's VEC128_32F scale mode reads for the
// [k, tokens] column-major operand.
void quantize_fp8_activations(const void* x, bool x_f32, int64_t tokens, int64_t k, uint8_t* codes, float* scale,
                              LaunchStream stream);

// Per token t of x ([tokens, k] bf16, rows row_stride elements apart; k a positive multiple of 8, x and out 16-byte
// aligned): out[t][c] = fp16(x[t][c] * 2^e_t) and unscale[t] = 2^-e_t, with e_t the power of two that puts the token's
// largest magnitude in [2^14, 2^15) (e_t = 0 for an all-zero or non-finite row). A power of two changes no bf16
// mantissa and fp16 holds bf16's 8 significant bits over 2^29 below that maximum, so out * unscale is x exactly for
// every value a product can notice. out is [tokens, k], contiguous.
void rescale_activations_to_f16(const uint16_t* x, int64_t tokens, int64_t k, int64_t row_stride, uint16_t* out,
                                float* unscale, LaunchStream stream);

}  // namespace deepinfer::cuda
