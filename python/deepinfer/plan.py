"""What a deployment needs a GPU, before anything is loaded: the plan of ``deepinfer plan`` and of the engine's
check before it reads a weight (one arithmetic for both, so the command and the refusal say the same).

On a GPU the latent cache gets what latent_cache_pages (csrc/engine/latent_cache.cpp) leaves of
gpu_memory_utilization x the GPU's memory: after the weights, the largest step's working memory, what the device
holds besides (the CUDA context, libraries, NCCL) and the engine's fixed reserves (the decode graphs' logits and
arena, 512 MiB more). The weights and the reserves are exact; the working memory and the context are estimates (the
engine measures them), a few GiB on a 141 GiB GPU, so they move the cache's size by a few percent at most. The
engine's refusal before loading (check_fits_before_load) rests on the exact terms alone. On the CPU the cache is the
cache_memory_gb budget.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from deepinfer.config import EngineConfig, WeightFormat, resolve_weight_format
from deepinfer.model_dims import ModelDims
from deepinfer.plan_terms import (BF16, F32, FP8, GIB, MIB, Layout, cache_bytes_per_token, parameter_count,
                                  resident_weight_bytes, step_working_bytes)

__all__ = ["MemoryPlan", "Option", "plan_memory", "plan_options", "check_fits_before_load", "GIB"]

ENGINE_RESERVE = 512 * MIB       # latent_cache.cpp: the sampler and fragmentation
GRAPH_ARENA_RESERVE = 256 * MIB  # latent_cache.cpp: the decode graphs' arena for a step's temporaries
# What a GPU holds besides the engine's tensors, when it cannot be asked: the CUDA context with its loaded kernels
# and the cuBLAS handles, and NCCL's buffers under tensor parallelism. An allowance, not a measurement.
CUDA_CONTEXT_ALLOWANCE = 1 * GIB
NCCL_ALLOWANCE = GIB // 2
MAX_PLANNED_RANKS = 64  # the tensor_parallel_size values searched for one that fits


@dataclass
class MemoryPlan:
    """One deployment's memory, a GPU (one rank), and whether it holds what it is asked to."""

    model: str
    architecture: str
    parameters: int
    device: str                       # "cuda" or "cpu"
    gpus: int                         # GPUs the deployment has (the ranks take the first tensor_parallel_size)
    tensor_parallel_size: int
    enable_expert_parallel: bool
    enable_dp_attention: bool
    weight_format: str                # "fp8 (W8A8)", "fp8 (W8A16)", "bfloat16", "float32", "int4 (W4A16)",
                                      # "int4 (float32 on the CPU)",
                                      # "fp4 (W4A16, e2m1)", "fp4 (float32 on the CPU)",
    weight_bytes: dict[str, int]      # a GPU, by dtype: what Engine.weight_bytes reports
    cache_dtype: str
    cache_bytes_per_token: int        # all layers: Engine.cache_info["bytes_per_token"]
    page_size: int
    gpu_memory_bytes: int | None      # a GPU's total (CUDA)
    gpu_memory_utilization: float
    working_bytes: int                # the largest step's working memory (estimated; CUDA)
    working_tokens: int               # that step's tokens
    context_bytes: int                # the CUDA context, libraries, NCCL: the allowance, or what is in use
    in_use_bytes: int | None          # measured in use on the GPU before loading (the engine's check), else None
    reserve_bytes: int                # the engine's fixed reserves (CUDA)
    cache_pages: int                  # a GPU (a data-parallel rank's own): EngineStats.num_cache_pages / lanes
    max_model_len: int | None         # as asked; None: the engine takes min(max_position_embeddings, the cache)
    max_position_embeddings: int
    max_num_seqs: int
    notes: list[str] = field(default_factory=list)

    @property
    def weights_per_gpu(self) -> int:
        return sum(self.weight_bytes.values())

    @property
    def budget_bytes(self) -> int | None:
        """gpu_memory_utilization x a GPU's memory: what everything of the engine's may take."""
        if self.gpu_memory_bytes is None:
            return None
        return int(self.gpu_memory_utilization * self.gpu_memory_bytes)

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.cache_bytes_per_token

    @property
    def cache_bytes(self) -> int:
        return self.cache_pages * self.page_bytes

    @property
    def cache_tokens_per_gpu(self) -> int:
        return self.cache_pages * self.page_size

    @property
    def lanes(self) -> int:
        """Latent caches: one all TP ranks hold (it is shared by the heads), or one per data-parallel rank."""
        return self.tensor_parallel_size if self.enable_dp_attention else 1

    @property
    def cache_tokens_total(self) -> int:
        return self.cache_tokens_per_gpu * self.lanes

    @property
    def context_len(self) -> int:
        """The sequence length 'sequences that fit' counts: max_model_len, or what the engine would take unset."""
        if self.max_model_len is not None:
            return self.max_model_len
        return max(2, min(self.max_position_embeddings, self.cache_tokens_per_gpu))

    @property
    def sequences(self) -> int:
        """Sequences of context_len tokens the caches hold at once (max_num_seqs still caps a batch)."""
        return self.lanes * (self.cache_pages // math.ceil(self.context_len / self.page_size))

    @property
    def weights_fit(self) -> bool:
        """Whether the exact terms (the weights, the engine's reserves, what the GPU already holds when measured)
        leave a page of cache: false means the engine cannot start, whatever the estimates."""
        if self.budget_bytes is None:
            return True
        room = self.budget_bytes - self.weights_per_gpu - self.reserve_bytes - (self.in_use_bytes or 0)
        return room >= self.page_bytes

    @property
    def fits(self) -> bool:
        """Whether the engine would start: the cache holds max_model_len tokens (unset: two)."""
        return self.weights_fit and self.cache_tokens_per_gpu >= max(2, self.max_model_len or 2)

    def verdict(self) -> str:
        """One line, the table's and the engine's refusal's: whether it fits, and if not, why."""
        if self.fits:
            # Each data-parallel rank schedules its own max_num_seqs.
            at_most = self.max_num_seqs * self.lanes
            capped = f"; max_num_seqs lets {at_most:,} run at once" if self.sequences > at_most else ""
            return (f"fits: {self.sequences:,} sequence{'s' if self.sequences != 1 else ''} of "
                    f"{self.context_len:,} tokens at once ({self.cache_tokens_total:,} cache tokens{capped})")
        if not self.weights_fit:
            in_use = f", {_gib(self.in_use_bytes)} already in use on the GPU" if self.in_use_bytes else ""
            return (f"does not fit: the weights take {_gib(self.weights_per_gpu)} a GPU ({self.weight_format}, "
                    f"tensor_parallel_size {self.tensor_parallel_size}); with the engine's "
                    f"{_gib(self.reserve_bytes)} of reserves{in_use} that leaves no room for the latent cache in "
                    f"gpu_memory_utilization {self.gpu_memory_utilization:g} x {_gib(self.gpu_memory_bytes or 0)} = "
                    f"{_gib(self.budget_bytes or 0)}")
        return (f"does not fit: the latent cache holds {self.cache_tokens_per_gpu:,} tokens a GPU, fewer than "
                f"max_model_len {self.max_model_len or 2:,}")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(weights_per_gpu=self.weights_per_gpu, budget_bytes=self.budget_bytes, cache_bytes=self.cache_bytes,
                   cache_tokens_per_gpu=self.cache_tokens_per_gpu, cache_tokens_total=self.cache_tokens_total,
                   context_len=self.context_len, sequences=self.sequences, weights_fit=self.weights_fit,
                   fits=self.fits, verdict=self.verdict())
        return out


def _gib(n: int | None) -> str:
    return f"{(n or 0) / GIB:.1f} GiB"


def plan_device(config: EngineConfig) -> str:
    """The backend a plan is for: "cpu" when asked, else "cuda" (device 'auto' plans GPUs: what a plan is for)."""
    return "cpu" if config.device == "cpu" else "cuda"


def _weight_format(f: WeightFormat, device: str) -> tuple[str, str]:
    """(the linear layers' format, its name) for the engine's reading `f` (config.resolve_weight_format):
    an FP8 or 4-bit checkpoint stays as stored unless asked otherwise, quantization='fp8' makes a bf16 one FP8 and
    'int4' rounds it to INT4. INT4 and FP4 stay packed on GPUs; the CPU holds the dequantized weights in float32."""
    if f.int4:
        return ("int4", "int4 (W4A16)") if device == "cuda" else ("plain", "int4 (float32 on the CPU)")
    if f.fp4:
        return ("fp4", "fp4 (W4A16, e2m1)") if device == "cuda" else ("plain", "fp4 (float32 on the CPU)")
    if not f.fp8_weights:
        return "plain", BF16 if device == "cuda" else F32
    if device == "cpu":
        return "fp8", "fp8 (float32 on the CPU)"
    return "fp8", "fp8 (W8A8)" if f.fp8_activations else "fp8 (W8A16)"


def plan_memory(d: ModelDims, config: EngineConfig, *, gpus: int | None = None, gpu_memory_bytes: int | None = None,
                in_use_bytes: int | None = None, model: str = "") -> MemoryPlan:
    """The memory plan of `config` for the model of `d`: on CUDA for GPUs of `gpu_memory_bytes` each, of which
    `in_use_bytes` are already taken when known (the engine's check measures it; a plan uses an allowance).
    Raises ValueError, in the engine's
    words, for a split the model does not divide into or a max_model_len past its positions."""
    device = plan_device(config)
    layout = Layout(config.tensor_parallel_size, config.enable_expert_parallel, config.enable_dp_attention)
    layout.validate(d)
    if config.max_model_len is not None and config.max_model_len > d.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} is larger than the model's max_position_embeddings="
                         f"{d.max_position_embeddings}; use max_model_len (--max-model-len) "
                         f"{d.max_position_embeddings} or less, or leave it unset")
    if device == "cuda" and gpu_memory_bytes is None:
        raise ValueError("a plan for GPUs needs the memory of one: give --gpu-memory-gb, in GiB (80 for an H100, "
                         "141 for an H200), or --device cpu for the CPU backend")
    f = resolve_weight_format(config.quantization, d.fp8_checkpoint, d.int4_checkpoint, device, d.fp4_checkpoint,
                              d.fp8_activations)
    linear_format, format_name = _weight_format(f, device)
    mtp_layers = 1 if config.speculative_config is not None else 0
    if mtp_layers and d.num_nextn_predict_layers < 1:
        raise ValueError("speculative_config: the model has no MTP layer (num_nextn_predict_layers is 0 in its "
                         "config.json); MTP speculative decoding needs one")
    # A 4-bit checkpoint's own groups; rounding at load, the quantization's.
    int4_group, int4_symmetric = ((f.int4_group_size, f.int4_symmetric) if f.int4 == "rtn"
                                  else (d.int4_group_size, d.int4_symmetric))
    weights = resident_weight_bytes(d, layout, linear_format, device, mtp_layers, int4_group, int4_symmetric)
    kv_fp8 = config.kv_cache_dtype != "auto"
    per_token = cache_bytes_per_token(d, kv_fp8, device, mtp_layers)
    page_bytes = per_token * config.page_size
    tokens = min(config.max_num_batched_tokens, d.max_position_embeddings - 1)
    working = context = reserve = 0
    if device == "cuda":
        working = step_working_bytes(d, layout, tokens, page_bytes, config.page_size, linear_format)
        context = CUDA_CONTEXT_ALLOWANCE + (NCCL_ALLOWANCE if layout.ranks > 1 else 0)
        context = max(context, in_use_bytes or 0)
        reserve = ENGINE_RESERVE
        if not config.enforce_eager:  # the decode graphs' logits rows ([max_num_seqs, V] float32, twice) and arena
            reserve += 2 * config.max_num_seqs * d.vocab_size * 4 + GRAPH_ARENA_RESERVE
    if config.num_cache_pages > 0:
        pages = config.num_cache_pages
    elif device == "cpu":
        pages = int(config.cache_memory_gb * GIB) // page_bytes
    else:
        usable = int(config.gpu_memory_utilization * gpu_memory_bytes) - sum(weights.values()) - working - context
        usable -= reserve
        pages = max(0, usable // page_bytes)
    gpus = layout.ranks if gpus is None else gpus
    notes = []
    if gpus > layout.ranks:
        notes.append(f"{gpus - layout.ranks} of the {gpus} GPUs stay idle: the engine runs one copy of the model over "
                     f"tensor_parallel_size {layout.ranks} ranks (no replicas)")
    if mtp_layers:
        notes.append(f"the MTP layer is loaded for speculative decoding ({config.speculative_config.num_speculative_tokens}"
                     " draft tokens a step): its weights and its latent-cache layer are counted")
    elif d.num_nextn_predict_layers:
        notes.append(f"MTP layers stored after the main ones ({d.num_nextn_predict_layers}) are not loaded")
    if config.max_model_len is None:
        notes.append(f"max_model_len unset: the engine takes min(max_position_embeddings "
                     f"{d.max_position_embeddings:,}, what the cache holds)")
    return MemoryPlan(
        model=model, architecture=f"DeepseekV{d.version}ForCausalLM", parameters=parameter_count(d), device=device,
        gpus=gpus, tensor_parallel_size=layout.ranks, enable_expert_parallel=layout.expert_parallel,
        enable_dp_attention=layout.dp_attention, weight_format=format_name, weight_bytes=weights,
        cache_dtype=FP8 if kv_fp8 else (BF16 if device == "cuda" else F32), cache_bytes_per_token=per_token,
        page_size=config.page_size, gpu_memory_bytes=gpu_memory_bytes if device == "cuda" else None,
        gpu_memory_utilization=config.gpu_memory_utilization, working_bytes=working, working_tokens=tokens,
        context_bytes=context, in_use_bytes=in_use_bytes, reserve_bytes=reserve, cache_pages=pages,
        max_model_len=config.max_model_len, max_position_embeddings=d.max_position_embeddings,
        max_num_seqs=config.max_num_seqs, notes=notes)


@dataclass
class Option:
    """A change to the flags, with the plan it gives."""

    change: str           # the flags, e.g. "--quantization fp8"
    plan: MemoryPlan
    available: bool = True
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "available": self.available, "note": self.note,
                "weights_per_gpu": self.plan.weights_per_gpu, "cache_tokens_per_gpu": self.plan.cache_tokens_per_gpu,
                "cache_tokens_total": self.plan.cache_tokens_total, "sequences": self.plan.sequences,
                "fits": self.plan.fits}


def plan_options(d: ModelDims, config: EngineConfig, base: MemoryPlan) -> list[Option]:
    """What else would fit, or give more room (CUDA plans): the smallest tensor_parallel_size that fits, FP8
    weights, the FP8 cache, and INT4 weights (rounded at load, groups of 128)."""
    if base.device != "cuda":
        return []
    same = dict(gpus=base.gpus, gpu_memory_bytes=base.gpu_memory_bytes, in_use_bytes=base.in_use_bytes,
                model=base.model)
    options: list[Option] = []
    for ranks in range(1, MAX_PLANNED_RANKS + 1):
        split = dict(tensor_parallel_size=ranks)
        if config.data_parallel_size > 1:  # data-parallel attention runs over the same ranks
            split["data_parallel_size"] = ranks
        try:
            plan = plan_memory(d, dataclasses.replace(config, **split), **same)
        except ValueError:  # a split the model does not divide into, or one EngineConfig refuses
            continue
        if plan.fits:
            if ranks != config.tensor_parallel_size:
                more = f"; more than the {base.gpus} GPUs given" if ranks > base.gpus else ""
                options.append(Option(f"--tensor-parallel-size {ranks}", plan, note=f"the smallest that fits{more}"))
            break
    if not base.weight_format.startswith("fp8"):
        if d.int4_checkpoint or d.fp4_checkpoint:
            # A 4-bit checkpoint is not quantized again: its FP8 row is what an FP8 checkpoint of the model needs.
            fp8_dims = dataclasses.replace(d, fp8_checkpoint=True, int4_checkpoint="", fp4_checkpoint="",
                                           unquantized_linears=frozenset())
            options.append(Option("FP8 weights", plan_memory(fp8_dims, dataclasses.replace(config, quantization=None),
                                                             **same), note="from an FP8 checkpoint"))
        else:
            options.append(Option("--quantization fp8",
                                  plan_memory(d, dataclasses.replace(config, quantization="fp8"), **same)))
    if config.kv_cache_dtype == "auto":
        options.append(Option("--kv-cache-dtype fp8", plan_memory(d, dataclasses.replace(config, kv_cache_dtype="fp8"),
                                                                  **same)))
    if not base.weight_format.startswith("int4"):
        # A quantized checkpoint is not quantized again: its INT4 row is what a 4-bit checkpoint of the model needs.
        quantized = bool(d.fp8_checkpoint or d.int4_checkpoint or d.fp4_checkpoint)
        int4_dims = dataclasses.replace(d, fp8_checkpoint=False, int4_checkpoint="", fp4_checkpoint="",
                                        unquantized_linears=frozenset())
        options.append(Option("INT4 weights" if quantized else "--quantization int4",
                              plan_memory(int4_dims, dataclasses.replace(config, quantization="int4"), **same),
                              note="from a 4-bit checkpoint: AWQ, GPTQ" if quantized else ""))
    return options


def check_fits_before_load(d: ModelDims, config: EngineConfig, gpu_memory: list[tuple[int, int]],
                           model: str = "") -> MemoryPlan:
    """The engine's check on CUDA, before it reads a weight. `gpu_memory` holds (free, total) bytes of each GPU the
    ranks take. Raises ValueError, in the plan's words, when the weights and the engine's fixed reserves cannot fit
    gpu_memory_utilization of the smallest GPU beside what is already in use on the fullest; returns the plan
    otherwise (whose `fits` may still be False on the estimated terms, which the engine then measures)."""
    total = min(t for _, t in gpu_memory)
    in_use = max(t - f for f, t in gpu_memory)
    plan = plan_memory(d, config, gpus=config.tensor_parallel_size, gpu_memory_bytes=total, in_use_bytes=in_use,
                       model=model)
    if not plan.weights_fit:
        would = [o.change for o in plan_options(d, config, plan) if o.available and o.plan.fits]
        hint = f"; would fit: {', '.join(would)}" if would else ""
        raise ValueError(f"{plan.verdict()}{hint} (`deepinfer plan` with the same flags shows every figure)")
    return plan
