"""Engine configuration: what a user sets, validated up front with errors that name the field."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

QUANTIZATION_METHODS = ("fp8", "int4", "awq")


def is_finite_number(value: Any) -> bool:
    """An int or float that is neither NaN nor infinite (comparisons with NaN are all false, so a range check alone
    lets it through); bools are not numbers here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class QuantizationConfig:
    """How weights (and activations) are quantized.

    ``fp8`` is DeepSeek's block-scaled FP8 (e4m3 weights with a float32 ``weight_scale_inv`` per 128 x 128 block): an
    FP8 checkpoint's weights stay as stored, a bf16/fp16 checkpoint's linear layers are quantized so at load.
    ``activation_bits=8`` is W8A8 (prefill GEMMs quantize activations per token per 128 channels), ``16`` weight-only
    FP8. The CPU backend computes in fp32 with the FP8 weights' exact values.

    ``int4`` is 4-bit integer weights with 16-bit activations (W4A16). A checkpoint that stores them
    (compressed-tensors ``pack-quantized``, AutoAWQ ``gemm``) is read as stored, with its own group size; a bf16/fp32
    checkpoint's linear layers are rounded to nearest at load, in groups of ``group_size`` inputs (-1: one group per
    output channel), asymmetric with a zero point per group unless ``symmetric``. ``awq`` asks for an AWQ checkpoint's
    weights as stored (anything else is an error). On a GPU the weights stay packed and W4A16 kernels unpack them in
    registers; the CPU backend computes with the dequantized weights in float32. ``weight_bits`` / ``activation_bits``
    default to the method's (8 / 8 for fp8, 4 / 16 for int4 and awq); ``fuse_quant_dequant`` is accepted and unused.
    """

    method: str = "fp8"
    weight_bits: int | None = None
    activation_bits: int | None = None
    group_size: int = 128
    fuse_quant_dequant: bool = True
    symmetric: bool = False

    def __post_init__(self) -> None:
        four_bit = self.method in ("int4", "awq")
        if self.weight_bits is None:
            self.weight_bits = 4 if four_bit else 8
        if self.activation_bits is None:
            self.activation_bits = 16 if four_bit else 8

    def validate(self) -> None:
        if self.method not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization.method must be one of {QUANTIZATION_METHODS}, got {self.method!r}")
        if self.method == "fp8" and (self.weight_bits != 8 or self.activation_bits not in (8, 16)):
            raise ValueError(
                f"quantization: fp8 needs weight_bits=8 and activation_bits 8 or 16, got "
                f"weight_bits={self.weight_bits}, activation_bits={self.activation_bits}")
        if self.method in ("int4", "awq") and (self.weight_bits != 4 or self.activation_bits != 16):
            raise ValueError(
                f"quantization: {self.method} is 4-bit weights with 16-bit activations (W4A16): it needs "
                f"weight_bits=4 and activation_bits=16, got weight_bits={self.weight_bits}, "
                f"activation_bits={self.activation_bits}")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or not (
                self.group_size > 0 or (self.group_size == -1 and self.method != "fp8")):
            raise ValueError(f"quantization.group_size must be > 0 (or -1 for int4: one group per output channel), "
                             f"got {self.group_size!r}")
        if self.method == "fp8" and self.group_size != 128:
            raise ValueError(f"quantization.group_size={self.group_size}: fp8 weights are scaled per 128 x 128 block "
                             "(DeepSeek's format, and what the kernels read); use group_size=128")
        if not isinstance(self.symmetric, bool) or (self.symmetric and self.method != "int4"):
            raise ValueError(f"quantization.symmetric={self.symmetric!r}: a bool, and True only with method 'int4' "
                             "(round-to-nearest at load without zero points)")

    @classmethod
    def coerce(cls, value: "str | Mapping[str, Any] | QuantizationConfig | None") -> "QuantizationConfig | None":
        if value is None or isinstance(value, QuantizationConfig):
            return value
        if isinstance(value, str):
            if value.lower() in ("", "none"):
                return None
            return cls(method=value.lower())
        if isinstance(value, Mapping):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"quantization: unknown keys {sorted(unknown)}; known: {sorted(known)}")
            return cls(**dict(value))
        raise TypeError(f"quantization must be a string, a mapping or QuantizationConfig, got {type(value).__name__}")


@dataclass(frozen=True)
class WeightFormat:
    """How the engine holds the linear layers, decided from the quantization asked for and the checkpoint's own."""

    fp8_weights: bool = False
    fp8_activations: bool = True
    int4: str = ""               # "": none; "compressed-tensors" / "awq": stored 4-bit weights; "rtn": rounded at load
    int4_group_size: int = 128   # "rtn" only
    int4_symmetric: bool = False
    fp4: str = ""                # "": none; "nvfp4" / "mxfp4" / "modelopt-nvfp4": stored FP4 weights (weight-only)


def resolve_weight_format(q: "QuantizationConfig | None", fp8_checkpoint: bool, int4_checkpoint: str,
                          device: str, fp4_checkpoint: str = "", fp8_activations: bool = True) -> WeightFormat:
    """The engine's (and the plan's) reading of `quantization` against the checkpoint (config.json's
    quantization_config: FP8, with activations or weight-only (`fp8_activations`), the 4-bit integer `int4_checkpoint`
    format or the FP4 `fp4_checkpoint` one). A quantized
    checkpoint stays as stored unless asked otherwise, as vLLM runs it. Raises ValueError for what cannot be, before a
    weight is read."""
    if fp4_checkpoint:
        if q is not None:
            raise ValueError(f"quantization={q.method!r} on a checkpoint of FP4 weights ({fp4_checkpoint}): it is "
                             "already quantized; leave quantization unset to run it as stored")
        return WeightFormat(fp4=fp4_checkpoint)
    if q is None:  # as stored; an FP8 checkpoint that quantizes weights only runs W8A16
        stored = WeightFormat(fp8_weights=fp8_checkpoint, fp8_activations=fp8_activations, int4=int4_checkpoint)
    elif q.method == "fp8":
        if int4_checkpoint:
            raise ValueError(f"quantization='fp8' on a checkpoint of 4-bit weights ({int4_checkpoint}): it is already "
                             "quantized; leave quantization unset to run it as stored")
        stored = WeightFormat(fp8_weights=True, fp8_activations=q.activation_bits == 8)
    elif q.method == "awq":
        if int4_checkpoint != "awq":
            found = f"its quantization_config is {int4_checkpoint!r}" if int4_checkpoint else (
                "it is an FP8 checkpoint" if fp8_checkpoint else "its config.json has no AWQ quantization_config")
            raise ValueError(f"quantization='awq' needs an AWQ checkpoint (quantization_config.quant_method 'awq', as "
                             f"AutoAWQ writes), but {found}; quantization='int4' rounds a bf16/fp32 checkpoint to "
                             "INT4 at load")
        stored = WeightFormat(int4="awq")
    elif int4_checkpoint:  # int4 asked of a 4-bit checkpoint: as stored, with its own groups
        stored = WeightFormat(int4=int4_checkpoint)
    elif fp8_checkpoint:
        raise ValueError("quantization='int4' on an FP8 checkpoint: it is already quantized; leave quantization "
                         "unset to run it as stored")
    else:
        stored = WeightFormat(int4="rtn", int4_group_size=q.group_size, int4_symmetric=q.symmetric)
    return stored


SPECULATIVE_METHODS = ("mtp", "deepseek_mtp")
MAX_SPECULATIVE_TOKENS = 8


@dataclass
class SpeculativeConfig:
    """MTP speculative decoding, in vLLM's shape (``{"method": "mtp", "num_speculative_tokens": k}``).

    The checkpoint's MTP layer (``num_nextn_predict_layers``) drafts k tokens after every step (applied again for
    k > 1) and the next step verifies them all at once: greedy output is the output without it, and sampling keeps
    the model's distribution. ``disable_by_batch_size`` (vLLM's name): a request that arrives while the engine holds
    more requests than this (running and waiting, itself included) runs without drafts for its whole life, since at
    large batches a speculative step's extra reads (the MTP layer, the experts its drafts route to) cost more than its
    accepted tokens gain; None: every request drafts. ``forced_acceptance`` is for benchmarks only: each draft is then
    accepted with that probability instead of by verification, so speed can be measured at a chosen acceptance rate
    on random weights (the text is not the model's)."""

    method: str = "mtp"
    num_speculative_tokens: int = 1
    disable_by_batch_size: int | None = None
    forced_acceptance: float | None = None

    def validate(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config.method must be one of {SPECULATIVE_METHODS} (the checkpoint's MTP "
                             f"layer drafts), got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer in "
                             f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        n = self.disable_by_batch_size
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"speculative_config.disable_by_batch_size must be None or an integer >= 1, got {n!r}")
        f = self.forced_acceptance
        if f is not None and not (is_finite_number(f) and 0.0 <= f <= 1.0):
            raise ValueError(f"speculative_config.forced_acceptance must be None or a number in [0, 1], got {f!r}")

    @classmethod
    def coerce(cls, value: "Mapping[str, Any] | SpeculativeConfig | None") -> "SpeculativeConfig | None":
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, Mapping):
            values = dict(value)
            if values.get("model") is not None:
                raise ValueError("speculative_config.model: DeepInfer drafts with the checkpoint's own MTP layer "
                                 "(method 'mtp'); a separate draft model is not supported")
            values.pop("model", None)
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = set(values) - known
            if unknown:
                raise ValueError(f"speculative_config: unknown keys {sorted(unknown)}; known: {sorted(known | {'model'})}")
            return cls(**values)
        raise TypeError(f"speculative_config must be a mapping or SpeculativeConfig, got {type(value).__name__}")


# What each EngineConfig field means, in one line: the help of its command-line flag (`deepinfer serve`, `generate`,
# `chat`, which add "(default: ...)" themselves) and the reference for the fields below. Kept in this one place;
# tests check that every field has an entry.
ENGINE_FIELD_HELP: dict[str, str] = {
    "model_name_or_path": "Hugging Face DeepSeek V2/V3 directory or hub id; none: the embedded demo model",
    "revision": "the hub revision (branch, tag or commit) of a model given as a hub id; none: the default branch",
    "download_dir": "where a hub model is downloaded (Hugging Face's cache_dir); none: the Hugging Face cache",
    "tokenizer": "directory with tokenizer.json; none: the model's own (or DeepSeek-V3's when it has none)",
    "tensor_parallel_size": "ranks to split the model across: GPUs 0..N-1 (CUDA) or threads (CPU)",
    "enable_expert_parallel": "partition the routed experts across the tensor-parallel ranks instead of splitting "
                              "each expert",
    "data_parallel_size": "data-parallel ranks: 1, or tensor_parallel_size with enable_dp_attention",
    "enable_dp_attention": "each rank serves its own requests with its own latent cache; the MoE layers are "
                           "expert-parallel over all ranks (needs enable_expert_parallel)",
    "collective_timeout_s": "seconds a rank may wait for the others in a collective before the engine fails",
    "distributed_executor_backend": "who starts the ranks: 'mp' (this process, one thread a rank), 'mpi' (mpirun, "
                                    "one process a rank), 'external_launcher' (torchrun, one process a rank); none: "
                                    "from the environment (mpirun's, torchrun's) and nnodes / dist_init_addr",
    "nnodes": "machines the ranks run on, one command each, tensor_parallel_size / nnodes ranks a machine (as SGLang's "
              "--nnodes); a LeaderWorkerSet's LWS_GROUP_SIZE when left at 1",
    "node_rank": "this machine's index in [0, nnodes): node 0 runs the engine and serves (a LeaderWorkerSet's "
                 "LWS_WORKER_INDEX when nnodes is taken from it)",
    "dist_init_addr": "HOST:PORT of node 0 where the ranks meet (rank 0 listens there); with nnodes 1, the ranks "
                      "become processes of this machine; none: LWS_LEADER_ADDRESS:29500 under a LeaderWorkerSet",
    "max_model_len": "longest prompt + output, in tokens; none: min(max_position_embeddings, what the cache holds)",
    "gpu_memory_utilization": "fraction of GPU memory for weights + latent cache, in (0, 1] (CUDA backend)",
    "enforce_eager": "CUDA backend: run without CUDA graphs",
    "enable_prefix_caching": "requests share the latent-cache pages of their common prompt prefixes",
    "kv_cache_dtype": "the latent cache's dtype: 'auto' = the model's compute dtype; 'fp8' (= 'fp8_e4m3') stores c_kv "
                      "in e4m3 with a power-of-two scale per 128 values and k_pe in bf16: 656 bytes a token a layer "
                      "at DeepSeek's dims instead of 1,152",
    "quantization": "'fp8': FP8 weights (an FP8 checkpoint as stored, a bf16 one quantized at load); 'int4': "
                    "4-bit weights (a compressed-tensors or AWQ checkpoint as stored, a bf16 one rounded at load; kept "
                    "packed on a GPU); 'awq': an AWQ checkpoint as stored; none: the checkpoint's own format",
    "speculative_config": 'MTP speculative decoding, e.g. {"method": "mtp", "num_speculative_tokens": 1}: the '
                          "checkpoint's MTP layer drafts that many tokens a step and the model verifies them; none: off",
    "device": "'auto' (CUDA when a GPU is visible), 'cpu' or 'cuda'",
    "dtype": "compute dtype: 'auto', 'float32' (CPU), 'bfloat16' (CUDA) or 'float16'",
    "seed": "engine seed: dummy weights and requests that give no seed",
    "page_size": "tokens per latent-cache page",
    "cache_memory_gb": "latent-cache budget on the CPU, in GiB (when num_cache_pages is 0)",
    "num_cache_pages": "explicit latent-cache page count; overrides cache_memory_gb (0: from the budget)",
    "max_num_seqs": "sequences batched together at most",
    "max_num_batched_tokens": "tokens one engine step processes at most (prefill chunks)",
    "load_format": "'auto', 'safetensors', or 'dummy' (random weights built from config.json, for benchmarks)",
    "generation_config": "'auto': sampling values a request leaves unset come from generation_config.json; 'none'",
    "served_model_name": "the model's name in the API; none: the model path",
    "trust_remote_code": "accepted for compatibility; DeepInfer never runs remote code",
}


@dataclass
class EngineConfig:
    """Everything the engine needs to start. ``model_name_or_path=None`` uses the embedded demo model.

    ENGINE_FIELD_HELP (above) says what each field means."""

    model_name_or_path: str | None = None
    revision: str | None = None
    download_dir: str | None = None
    tokenizer: str | None = None
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1
    enable_dp_attention: bool = False
    collective_timeout_s: float = 600.0
    distributed_executor_backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.90
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    quantization: str | Mapping[str, Any] | QuantizationConfig | None = None
    speculative_config: Mapping[str, Any] | SpeculativeConfig | None = None
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    page_size: int = 64
    cache_memory_gb: float = 1.0
    num_cache_pages: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    load_format: str = "auto"
    generation_config: str = "auto"
    served_model_name: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        self.quantization = QuantizationConfig.coerce(self.quantization)
        self.speculative_config = SpeculativeConfig.coerce(self.speculative_config)
        self.validate()

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens a step (0: no speculative decoding)."""
        return self.speculative_config.num_speculative_tokens if self.speculative_config is not None else 0

    def validate(self) -> None:
        def require(cond: bool, message: str) -> None:
            if not cond:
                raise ValueError(message)

        if self.model_name_or_path is not None:
            require(isinstance(self.model_name_or_path, (str, os.PathLike)) and str(self.model_name_or_path) != "",
                    "model_name_or_path must be a non-empty path or None (the embedded model)")
        for name in ("revision", "download_dir"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, (str, os.PathLike)) and str(value) != ""),
                    f"{name} must be None or a non-empty string, got {value!r}")
        require(isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size >= 1,
                f"tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}")
        require(isinstance(self.enable_expert_parallel, bool),
                f"enable_expert_parallel must be a bool, got {self.enable_expert_parallel!r}")
        require(not self.enable_expert_parallel or self.tensor_parallel_size > 1,
                "enable_expert_parallel needs tensor_parallel_size > 1 (the experts are partitioned across its ranks)")
        require(isinstance(self.data_parallel_size, int) and self.data_parallel_size >= 1,
                f"data_parallel_size must be an integer >= 1, got {self.data_parallel_size!r}")
        require(isinstance(self.enable_dp_attention, bool),
                f"enable_dp_attention must be a bool, got {self.enable_dp_attention!r}")
        require(not self.enable_dp_attention or (self.tensor_parallel_size > 1 and self.enable_expert_parallel),
                "enable_dp_attention needs tensor_parallel_size > 1 and enable_expert_parallel: the ranks serve "
                "their own requests and share the experts")
        require(self.data_parallel_size in (1, self.tensor_parallel_size if self.enable_dp_attention else 1),
                f"data_parallel_size={self.data_parallel_size}: whole-model replicas are not built; data-parallel "
                "attention runs over the tensor_parallel_size ranks (enable_dp_attention, data_parallel_size 1 or "
                "equal to tensor_parallel_size)")
        require(is_finite_number(self.collective_timeout_s) and self.collective_timeout_s > 0,
                f"collective_timeout_s must be a finite number > 0, got {self.collective_timeout_s!r}")
        require(self.distributed_executor_backend in (None, "mp", "mpi", "external_launcher"),
                "distributed_executor_backend must be None, 'mp', 'mpi' or 'external_launcher', got "
                f"{self.distributed_executor_backend!r}")
        require(isinstance(self.nnodes, int) and not isinstance(self.nnodes, bool) and self.nnodes >= 1,
                f"nnodes must be an integer >= 1, got {self.nnodes!r}")
        require(isinstance(self.node_rank, int) and not isinstance(self.node_rank, bool)
                and 0 <= self.node_rank < self.nnodes,
                f"node_rank must be an integer in [0, nnodes={self.nnodes}), got {self.node_rank!r}")
        require(self.tensor_parallel_size % self.nnodes == 0,
                f"tensor_parallel_size {self.tensor_parallel_size} is not a multiple of nnodes {self.nnodes}: every "
                "machine runs as many ranks")
        require(self.nnodes == 1 or self.dist_init_addr is not None,
                f"nnodes={self.nnodes} needs dist_init_addr (HOST:PORT of node 0, where the ranks meet)")
        if self.dist_init_addr is not None:
            from deepinfer.launch import check_init_addr

            require(isinstance(self.dist_init_addr, str), f"dist_init_addr must be a string, got {self.dist_init_addr!r}")
            check_init_addr(self.dist_init_addr)
        require(self.max_model_len is None or (isinstance(self.max_model_len, int) and self.max_model_len >= 2),
                f"max_model_len must be None or an integer >= 2, got {self.max_model_len!r}")
        require(is_finite_number(self.gpu_memory_utilization) and 0.0 < self.gpu_memory_utilization <= 1.0,
                f"gpu_memory_utilization must be a number in (0, 1], got {self.gpu_memory_utilization!r}")
        require(self.device in ("auto", "cpu", "cuda"), f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        require(self.dtype in ("auto", "float32", "bfloat16", "float16"),
                f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")
        require(isinstance(self.page_size, int) and 1 <= self.page_size <= 1024,
                f"page_size must be an integer in [1, 1024], got {self.page_size!r}")
        require(is_finite_number(self.cache_memory_gb) and self.cache_memory_gb > 0,
                f"cache_memory_gb must be a finite number > 0, got {self.cache_memory_gb!r}")
        require(isinstance(self.num_cache_pages, int) and self.num_cache_pages >= 0,
                f"num_cache_pages must be an integer >= 0, got {self.num_cache_pages!r}")
        require(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
                f"max_num_seqs must be an integer >= 1, got {self.max_num_seqs!r}")
        require(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= 1,
                f"max_num_batched_tokens must be an integer >= 1, got {self.max_num_batched_tokens!r}")
        require(self.load_format in ("auto", "safetensors", "dummy"),
                f"load_format must be 'auto', 'safetensors' or 'dummy', got {self.load_format!r}")
        require(isinstance(self.seed, int) and self.seed >= 0, f"seed must be an integer >= 0, got {self.seed!r}")
        require(self.kv_cache_dtype in ("auto", "fp8", "fp8_e4m3"),
                f"kv_cache_dtype must be 'auto', 'fp8' or 'fp8_e4m3', got {self.kv_cache_dtype!r}")
        require(isinstance(self.enable_prefix_caching, bool),
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        require(self.generation_config in ("auto", "none"),
                f"generation_config must be 'auto' or 'none', got {self.generation_config!r}")
        if self.quantization is not None:
            self.quantization.validate()
        if self.speculative_config is not None:
            self.speculative_config.validate()

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "EngineConfig":
        """Builds a config from a mapping (a YAML file, CLI flags); unknown keys are an error, not ignored."""
        values = dict(values)
        if "num_speculative_tokens" in values:  # vLLM's shorthand flag: MTP drafts of that many tokens
            k = values.pop("num_speculative_tokens")
            spec = dict(values.get("speculative_config") or {"method": "mtp"})
            if "num_speculative_tokens" in spec and spec["num_speculative_tokens"] != k:
                raise ValueError(f"num_speculative_tokens={k} disagrees with speculative_config's "
                                 f"{spec['num_speculative_tokens']}")
            spec["num_speculative_tokens"] = k
            values["speculative_config"] = spec
        if "quantization_config" in values:
            block = values.pop("quantization_config")
            if block is not None:
                if values.get("quantization") is not None:
                    raise ValueError("give either quantization or quantization_config, not both")
                values["quantization"] = block
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown engine config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)
