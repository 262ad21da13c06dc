// Parameters of the skinny GEMM: few tokens (decode) times a bf16 weight matrix, per head,
//   acc[t, h, n] = sum_k x[t, h, k] * w[h, n, k]      (fp32 accumulation)
// with one of three epilogues:
//   kStore       out[t, h, n] = acc                           (n < n_out = w rows)
//   kAccumulate  out[t, h, n] += acc                          (one rounding of the sum; a residual or the routed
//                                                              experts' output gaining the shared experts)
//   kSiluMul     out[t, n] = silu(acc[t, n]) * acc[t, n_out + n]   (w = [gate; up], 2 * n_out rows, one head)
// x and w are bf16; out is bf16 or fp32. Addresses are element offsets:
//   x(t, h, k)   = x + t * x_row_stride + h * x_head_stride + k
//   w(h, n, k)   = w + h * w_head_stride + n * k_dim + k
//   out(t, h, n) = out + t * out_row_stride + h * out_head_stride + n
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

enum class SkinnyEpilogue : int { kStore = 0, kAccumulate = 1, kSiluMul = 2 };

struct SkinnyGemmParams {
  const uint16_t* x = nullptr;  // bf16
  const uint16_t* w = nullptr;  // bf16
  void* out = nullptr;          // bf16 or fp32 (out_f32)
  bool out_f32 = false;
  SkinnyEpilogue epilogue = SkinnyEpilogue::kStore;
  int64_t tokens = 0;           // 1..kSkinnyMaxTokens
  int64_t heads = 1;            // grid.y; the backend sends only one-head products (cuBLAS's batched GEMM was faster)
  int64_t n_out = 0;            // output columns per head (kSiluMul: half of w's rows)
  int64_t k_dim = 0;            // a multiple of 32
  int64_t x_row_stride = 0;
  int64_t x_head_stride = 0;
  int64_t w_head_stride = 0;
  int64_t out_row_stride = 0;
  int64_t out_head_stride = 0;
};

}  // namespace deepinfer::cuda
