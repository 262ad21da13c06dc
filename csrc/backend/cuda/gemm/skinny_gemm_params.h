// Parameters of the skinny GEMM: few tokens (decode) times bf16 weight matrices, up to kSkinnyMaxProblems products of
// the same activations in one launch (q_proj with kv_a_proj, the router with the shared experts' gate_up):
//   acc[t, n] = sum_k x[t, k] * w[n, k]      (fp32 accumulation), per problem, with one of three epilogues:
//   kStore       out[t, n] = acc                             (n < n_out = w rows)
//   kAccumulate  out[t, n] += acc                            (one rounding of the sum: the routed experts' output
//                                                             gaining the shared experts')
//   kSiluMul     out[t, n] = silu(acc[t, n]) * acc[t, n_out + n]   (w = [gate; up], 2 * n_out rows)
// x and w are bf16, row-major with K contiguous; out is bf16 or fp32 with rows out_row_stride elements apart.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

enum class SkinnyEpilogue : int { kStore = 0, kAccumulate = 1, kSiluMul = 2 };

inline constexpr int kSkinnyMaxProblems = 3;

struct SkinnyProblem {
  const uint16_t* w = nullptr;  // [n_out (kSiluMul: 2 * n_out), k_dim] bf16
  void* out = nullptr;          // bf16 or fp32 (out_f32)
  int64_t n_out = 0;            // output columns
  int64_t out_row_stride = 0;   // elements
  SkinnyEpilogue epilogue = SkinnyEpilogue::kStore;
  bool out_f32 = false;
};

struct SkinnyGemmParams {
  const uint16_t* x = nullptr;  // [tokens, k_dim] bf16, rows x_row_stride elements apart
  int64_t tokens = 0;           // 1..kSkinnyMaxTokens
  int64_t k_dim = 0;            // a multiple of 32
  int64_t x_row_stride = 0;
  int num_problems = 0;
  SkinnyProblem problems[kSkinnyMaxProblems];
  int32_t num_sms = 132;  // multiprocessors of the device: when the grid is small, K is split over a cluster
};

}  // namespace deepinfer::cuda
