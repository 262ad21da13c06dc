// Which kernel an FP8 linear layer's launch takes at decode sizes (up to the skinny kernel's 64 tokens): the FP8
// skinny GEMM, which reads the codes once, or the block-scaled cuBLASLt GEMM of the prefill path (gemm/fp8_linear.h).
//
// From 16 tokens on, cuBLASLt is faster on DeepSeek-V3's large projections (benchmarks/results/fp8_h200.md): the
// skinny kernel's mma.sync work and activation loads grow with every 8-token tile, where cuBLASLt's FP8 tensor cores
// keep streaming the codes near the copy bandwidth. Launches of at most kSmallFp8Bytes of
// codes (q_a with kv_a) stay on the skinny kernel up to its 64 tokens: there the GEMM's fixed costs (the activations'
// quantization, one GEMM a product) weigh more than the bytes. W8A16 weights stay too (their prefill path dequantizes
// the whole weight), as does any K the block-scaled GEMM does not take.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

inline constexpr int64_t kSmallFp8Bytes = int64_t{16} << 20;

// The launch's facts: its tokens, the codes of all its products, whether every weight is W8A8, whether the
// block-scaled GEMM takes its K; max_tokens is CudaTuning::fp8_skinny_max_tokens.
struct Fp8DecodeLaunch {
  int64_t tokens = 0;
  int64_t code_bytes = 0;
  bool all_w8a8 = false;
  bool block_scaled_k = false;
};

inline bool fp8_decode_takes_skinny(const Fp8DecodeLaunch& l, int max_tokens) {
  return l.tokens <= max_tokens || l.code_bytes <= kSmallFp8Bytes || !l.all_w8a8 || !l.block_scaled_k;
}

}  // namespace deepinfer::cuda
