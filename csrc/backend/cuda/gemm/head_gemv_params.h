// Parameters of the per-head GEMV (head_linear at decode sizes):
//   out[t, h, n] = sum_k x[t, h, k] * w[h, n, k]      (fp32 accumulation, bf16 out)
// x rows (t, h) start x_head_stride elements apart and out rows out_head_stride apart, so x can be the q_nope columns
// of a query and out the latent columns of the absorbed query (HeadLinearArgs). All tensors are bf16 bit patterns.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

inline constexpr int64_t kHeadGemvMaxTokens = 8;
inline constexpr int64_t kHeadGemvMaxSplits = 256;  // of x_partials (MLA decode's most splits)

struct HeadGemvParams {
  const uint16_t* x = nullptr;  // [tokens, heads, x_head_stride]
  const uint16_t* w = nullptr;  // [heads, n, k]
  uint16_t* out = nullptr;      // [tokens, heads, out_head_stride]
  int64_t tokens = 0;           // 1..kHeadGemvMaxTokens
  int64_t heads = 0;
  int64_t k = 0;
  int64_t n = 0;
  int64_t x_head_stride = 0;    // elements, >= k
  int64_t out_head_stride = 0;  // elements, >= n
  int32_t num_sms = 132;        // multiprocessors of the device: the kernel takes grids that fit one wave
  // 1: x was complete before the previous kernel started and that kernel does not touch out, so the kernel computes
  // before its grid dependency wait (the backend asks its launch ledger); 0: it reads x after the wait.
  int32_t before_wait = 0;
  // 1: the next kernel may launch as soon as this one starts (LaunchLedger::trigger): the trigger
  // comes first, not after the wait.
  int32_t trigger_early = 0;
  // Optional, in place of x (then unused): the split-KV partials MLA decode leaves with defer_combine, fp32
  // [x_splits, tokens * heads, k], then their log-sum-exps [x_splits, tokens * heads]. Row (t, h) of x is their
  // combine, as MLA decode's combine kernel computes it: sum_s w_s part[s] / sum_s w_s with w_s = 2^(lse_s - max
  // lse), splits of lse -inf skipped, rounded to bf16. Takes K 512, 2..kHeadGemvMaxSplits splits, each CTA's rows in
  // one head (N a multiple of 32) and before_wait 0.
  const float* x_partials = nullptr;
  int32_t x_splits = 0;
};

}  // namespace deepinfer::cuda
