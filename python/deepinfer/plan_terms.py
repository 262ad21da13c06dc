"""The terms of a memory plan (deepinfer.plan), each the figure of what the engine allocates for it.

* weights: the tensors csrc/model/weights.cpp places for one rank, split as csrc/model/model_shard.h says, in the
  dtypes of the weight sink (csrc/model/weight_sink.h): matrices in the compute dtype (bfloat16 on CUDA, float32 on
  the CPU), norm weights float32, linear layers FP8 codes plus a float32 scale per 128 x 128 block when the weights
  are FP8 (on the CPU they are float32 tensors holding the FP8 values), but for those the checkpoint leaves
  unquantized and the MTP layer's eh_proj, which stay matrices. kv_b_proj is resident twice: as stored, for
  prefill, and as its per-head W_UK / W_UV halves, for the absorbed decode.
* the latent cache's bytes a token: csrc/engine/latent_cache.h and backend/ops/latent_fp8.h.
* the working memory of the largest step, which the engine measures (it runs that step once and reads the device's
  used memory): estimated here from the CUDA backend's workspaces and the step's live activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepinfer.model_dims import ModelDims, linear_module

__all__ = ["Layout", "resident_weight_bytes", "parameter_count", "cache_bytes_per_token", "step_working_bytes",
           "GIB", "MIB"]

GIB = 1 << 30
MIB = 1 << 20
FP8_BLOCK = 128          # core/weight.h kFp8Block
FP4_GROUP = {"nvfp4": 16, "modelopt-nvfp4": 16, "mxfp4": 32}  # FP4 weights: the inputs a float32 scale covers
INT4_GROUP = 128         # INT4 weights (core/weight.h): 4-bit codes, a float32 scale (and a 4-bit zero point) a group
CUBLAS_WORKSPACE = 32 * MIB          # runtime/cublas_handle.h kDefaultWorkspaceBytes
FP8_LT_WORKSPACE = 32 * MIB          # gemm/fp8_linear.cpp kLtWorkspaceBytes
FP8_DEQUANT_CHUNK = 64 * MIB         # gemm/fp8_linear.cpp kDequantChunkBytes

F32, BF16, FP8, INT4, FP4 = "float32", "bfloat16", "float8_e4m3fn", "int4", "fp4_e2m1"


@dataclass(frozen=True)
class Layout:
    """How the ranks split the model (csrc/model/model_shard.h)."""

    ranks: int = 1
    expert_parallel: bool = False
    dp_attention: bool = False

    @property
    def splits_attention(self) -> bool:
        """Heads, dense channels and vocabulary split across the ranks (tensor parallelism)."""
        return self.ranks > 1 and not self.dp_attention

    def validate(self, d: ModelDims) -> None:
        """ModelShard::validate's checks, in its words: a split the model does not divide into."""
        n = self.ranks
        if n == 1:
            return
        if self.dp_attention:
            if d.n_routed_experts == 0 or d.n_routed_experts % n != 0:
                raise ValueError(f"data-parallel attention over {n} ranks: the ranks do not divide n_routed_experts "
                                 f"({d.n_routed_experts})")
            return
        checks = [(d.num_attention_heads, "num_attention_heads"), (d.vocab_size, "vocab_size"),
                  (d.intermediate_size, "intermediate_size")]
        if d.n_routed_experts:
            checks.append((d.n_shared_experts * d.moe_intermediate_size,
                           "the shared experts' width (n_shared_experts * moe_intermediate_size)"))
            checks.append((d.n_routed_experts, "n_routed_experts") if self.expert_parallel
                          else (d.moe_intermediate_size, "moe_intermediate_size"))
        for value, what in checks:
            if value % n != 0:
                raise ValueError(f"tensor_parallel_size {n} does not divide {what} ({value})")
        if self.expert_parallel and n > d.n_routed_experts:
            raise ValueError(f"expert parallelism over {n} ranks needs at least as many routed experts; the model "
                             f"has {d.n_routed_experts}")


class _Tally:
    """Bytes by dtype of the tensors one rank places, with the weight sink's dtype rules."""

    def __init__(self, device: str, linear_format: str, fp4_group: int = 16, int4_group: int = INT4_GROUP,
                 int4_symmetric: bool = False) -> None:
        self.fp4_group = fp4_group
        self.int4_group, self.int4_symmetric = int4_group, int4_symmetric
        self.matrix_dtype = BF16 if device == "cuda" else F32
        # The CPU backend computes in float32: FP8 weights are float32 tensors there, holding the FP8 values.
        self.linear_format = linear_format if device == "cuda" else "plain"
        self.bytes: dict[str, int] = {}

    def _add(self, dtype: str, nbytes: float) -> None:
        if nbytes:
            self.bytes[dtype] = self.bytes.get(dtype, 0) + int(nbytes)

    def matrix(self, *dims: int) -> None:
        self._add(self.matrix_dtype, math.prod(dims) * (2 if self.matrix_dtype == BF16 else 4))

    def vector(self, n: int) -> None:
        self._add(F32, 4 * n)

    def linear(self, rows: int, cols: int, matrices: int = 1, quantized: bool = True) -> None:
        """A linear layer's [rows, cols] weight (`matrices` of them stacked, the experts); `quantized` False: one the
        checkpoint keeps in its dtype (or that FP8 at load leaves so, eh_proj), which the loader keeps so too: a
        matrix in the compute dtype (weights.cpp Loader::fp8_weight)."""
        n = matrices * rows * cols
        if not quantized and self.linear_format in ("fp8", "int4", "fp4"):
            self.matrix(n)
        elif self.linear_format == "fp8":
            self._add(FP8, n)
            self._add(F32, 4 * matrices * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK))
        elif self.linear_format == "int4":
            groups = 1 if self.int4_group == -1 else math.ceil(cols / self.int4_group)
            zero_words = 0 if self.int4_symmetric else matrices * rows * math.ceil(groups / 8)
            self._add(INT4, n // 2 + 4 * zero_words)  # the codes, and the zero points' int32 words
            self._add(F32, 4 * matrices * rows * groups)
        elif self.linear_format == "fp4":  # e2m1 codes in INT4's words, a float32 scale a group, no zero points
            self._add(FP4, n // 2)
            self._add(F32, 4 * matrices * rows * math.ceil(cols / self.fp4_group))
        else:
            self.matrix(n)


def resident_weight_bytes(d: ModelDims, layout: Layout, linear_format: str, device: str,
                          mtp_layers: int = 0, int4_group: int = INT4_GROUP,
                          int4_symmetric: bool = False) -> dict[str, int]:
    """Bytes by dtype of the weights one rank holds (rank 0; under expert parallelism every rank holds as many):
    what Engine.weight_bytes reports. `linear_format` is "fp8", "int4", "fp4" or "plain" (the compute
    dtype); `device` "cuda" or "cpu". `mtp_layers` (0 or 1): the MTP layer loaded for speculative decoding, stored
    after the main layers (its embedding and head are the model's). INT4 weights scale groups of `int4_group`
    inputs (-1: a whole row), with zero points unless `int4_symmetric`. The linear modules the checkpoint leaves
    unquantized (d.unquantized_linears) are counted in the compute dtype."""
    t = _Tally(device, linear_format, FP4_GROUP.get(d.fp4_checkpoint, 16), int4_group, int4_symmetric)
    dim, vocab = d.hidden_size, d.vocab_size // (layout.ranks if layout.splits_attention else 1)
    t.matrix(vocab, dim)  # the embedding
    t.matrix(vocab, dim)  # lm_head (a tied one is a second copy of the embedding)
    t.vector(dim)         # the final norm
    for layer in range(d.num_hidden_layers):
        _decoder_layer(t, d, layout, layer)
    for layer in range(d.num_hidden_layers, d.num_hidden_layers + mtp_layers):
        t.vector(dim)               # enorm
        t.vector(dim)               # hnorm
        # FP8 keeps eh_proj in the compute dtype: DeepSeek's FP8 release stores it in bf16 (with no list saying so),
        # and quantization at load follows that release. (An FP8 checkpoint that stores it in FP8 loads it so.)
        t.linear(dim, 2 * dim, quantized=_quantized(d, layer, "eh_proj") and t.linear_format != "fp8")
        _decoder_layer(t, d, layout, layer)
        t.vector(dim)               # shared_head.norm
    return t.bytes


def _quantized(d: ModelDims, layer: int, suffix: str) -> bool:
    """Whether the checkpoint stores the layer's linear module quantized (model_dims.LAYER_LINEARS)."""
    return linear_module(layer, suffix) not in d.unquantized_linears


def _decoder_layer(t: _Tally, d: ModelDims, layout: Layout, layer: int) -> None:
    def q(suffix: str) -> bool:
        return _quantized(d, layer, suffix)

    n = layout.ranks if layout.splits_attention else 1
    ep = layout.expert_parallel and layout.ranks > 1
    heads, inter = d.num_attention_heads // n, d.intermediate_size // n
    moe_inter = d.moe_intermediate_size // (1 if ep else n)
    dim, rank = d.hidden_size, d.kv_lora_rank
    t.vector(dim)
    t.vector(dim)
    if d.q_lora_rank:
        t.linear(d.q_lora_rank, dim, quantized=q("self_attn.q_a_proj"))                    # replicated
        t.vector(d.q_lora_rank)
        t.linear(heads * d.qk_head_dim, d.q_lora_rank, quantized=q("self_attn.q_b_proj"))  # by heads
    else:
        t.linear(heads * d.qk_head_dim, dim, quantized=q("self_attn.q_proj"))
    t.linear(d.latent_dim, dim, quantized=q("self_attn.kv_a_proj_with_mqa"))              # replicated
    t.vector(rank)
    t.matrix(heads * (d.qk_nope_head_dim + d.v_head_dim), rank)  # kv_b_proj, kept in the compute dtype
    t.matrix(heads, rank, d.qk_nope_head_dim)                    # its W_UK half, per head, transposed
    t.matrix(heads, d.v_head_dim, rank)                          # its W_UV half
    t.linear(dim, heads * d.v_head_dim, quantized=q("self_attn.o_proj"))                  # by heads
    if not d.is_moe_layer(layer):
        t.linear(2 * inter, dim, quantized=q("mlp.gate_proj"))
        t.linear(dim, inter, quantized=q("mlp.down_proj"))
        return
    experts = d.n_routed_experts
    t.matrix(experts, dim)  # the router
    if d.version == 3:
        t.vector(experts)   # its correction bias
    # Without EP the shared experts are stacked after the routed ones; under EP each rank stacks its whole routed
    # experts and holds its channels of the shared ones (all of them under data-parallel attention) apart.
    stacked = experts // layout.ranks if ep else experts + d.n_shared_experts
    t.linear(2 * moe_inter, dim, stacked, quantized=q("mlp.experts.0.gate_proj"))
    t.linear(dim, moe_inter, stacked, quantized=q("mlp.experts.0.down_proj"))
    if ep and d.n_shared_experts:
        shared = d.n_shared_experts * d.moe_intermediate_size // n
        t.linear(2 * shared, dim, quantized=q("mlp.shared_experts.gate_proj"))
        t.linear(dim, shared, quantized=q("mlp.shared_experts.down_proj"))


def parameter_count(d: ModelDims) -> int:
    """The main model's parameters as a checkpoint stores them (MTP layers, which are not loaded, aside)."""
    dim, heads = d.hidden_size, d.num_attention_heads
    attn = 2 * dim + d.latent_dim * dim + d.kv_lora_rank + heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank
    attn += dim * heads * d.v_head_dim
    attn += (d.q_lora_rank * dim + d.q_lora_rank + heads * d.qk_head_dim * d.q_lora_rank if d.q_lora_rank
             else heads * d.qk_head_dim * dim)
    dense = 3 * dim * d.intermediate_size
    moe = (d.n_routed_experts * dim + (d.n_routed_experts if d.version == 3 else 0)
           + (d.n_routed_experts + d.n_shared_experts) * 3 * dim * d.moe_intermediate_size)
    moe_layers = d.num_moe_layers
    total = d.num_hidden_layers * attn + moe_layers * moe + (d.num_hidden_layers - moe_layers) * dense
    return total + d.vocab_size * dim * (1 if d.tie_word_embeddings else 2) + dim


def cache_row_bytes(d: ModelDims, fp8: bool, device: str) -> int:
    """One token's row of one layer: LatentCacheShape::row_elements x its dtype's size."""
    if fp8:  # backend/ops/latent_fp8.h: e4m3 c_kv, a float32 scale per 128, bf16 k_pe, padded to 16 bytes
        from deepinfer import _deepinfer

        return _deepinfer.latent_fp8_row_bytes(d.kv_lora_rank, d.qk_rope_head_dim)
    return d.latent_dim * (2 if device == "cuda" else 4)


def cache_bytes_per_token(d: ModelDims, fp8: bool, device: str, mtp_layers: int = 0) -> int:
    """A token's latent rows over all layers, the MTP layer's too when loaded (Engine.cache_info["bytes_per_token"])."""
    return (d.num_hidden_layers + mtp_layers) * cache_row_bytes(d, fp8, device)


def _align(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


def step_working_bytes(d: ModelDims, layout: Layout, tokens: int, page_bytes: int, page_size: int,
                       linear_format: str) -> int:
    """An estimate of the device memory the engine's profiling step leaves in its pool: one prefill of `tokens`
    tokens (latent_cache.cpp profile_largest_step). The CUDA backend's workspaces (runtime/workspace.h) persist
    at the largest size asked for; the transient activations are those live at the step's peak. Under data-parallel
    attention the MoE layers see every rank's tokens."""
    act = 2  # bfloat16
    n = layout.ranks if layout.splits_attention else 1
    ep = layout.expert_parallel and layout.ranks > 1
    heads, dim = d.num_attention_heads // n, d.hidden_size
    t = tokens
    moe_tokens = t * layout.ranks if layout.dp_attention else t
    pairs = d.num_experts_per_tok + (0 if ep else d.n_shared_experts)
    moe_inter = d.moe_intermediate_size // (1 if ep else n)
    # Persistent workspaces: MLA prefill's gathered latents and decompressed k_nope | v; the MoE kernels' per-pair
    # activations and outputs; W8A8's quantized activations, the dequantization chunk, cuBLAS's workspace.
    workspaces = _align(t * d.latent_dim * act) + _align(t * heads * (d.qk_nope_head_dim + d.v_head_dim) * act)
    if d.n_routed_experts:
        workspaces += _align(moe_tokens * pairs * moe_inter * act) + _align(moe_tokens * pairs * dim * act)
    if linear_format == "fp8":
        k = max(dim, d.q_lora_rank or 0, heads * d.v_head_dim)
        workspaces += t * k + 4 * t * (k // FP8_BLOCK) + FP8_LT_WORKSPACE + FP8_DEQUANT_CHUNK
    elif linear_format in ("int4", "fp4"):
        workspaces += FP8_DEQUANT_CHUNK  # the prefill path's widened weight rows (the same workspace)
    workspaces += CUBLAS_WORKSPACE
    # Transients: the residual stream and the normalized input throughout; then the largest sublayer's tensors.
    hidden = 2 * t * dim * act
    attention = t * act * (d.latent_dim + heads * d.qk_head_dim + heads * d.v_head_dim + dim)
    dense = t * act * (d.intermediate_size // n + dim)
    moe = 0
    if d.n_routed_experts:
        moe = t * dim * act + moe_tokens * (4 * d.n_routed_experts + 8 * pairs + dim * act)
        if layout.dp_attention:
            moe += (layout.ranks + 2) * t * dim * act  # the gathered tokens, this rank's padded ones, their sums
        if ep and d.n_shared_experts:
            moe += t * act * (d.n_shared_experts * d.moe_intermediate_size // n + dim)
    # The profiling step's own cache pages: freed after it, but kept by the pool, so counted as used.
    profile_cache = math.ceil(t / page_size) * page_bytes
    logits = 2 * d.vocab_size * 4
    return workspaces + hidden + max(attention, dense, moe) + profile_cache + logits


