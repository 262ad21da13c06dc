"""The dimensions of a DeepSeek V2/V3 model that size its memory, from config.json as the engine parses it.

``deepinfer plan`` answers for a checkpoint it never loads (or for a bare config.json downloaded alone): the files go
through the extension's own reader (``_deepinfer.load_model_config`` for a directory, ``parse_model_config`` for a
bare file; csrc/model/config.cpp), which takes well under a millisecond, so the plan and the engine can never read a
field differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelDims", "load_model_dims", "config_json_path", "linear_module"]

# The linear modules of a decoder layer whose format the memory plan counts, by their checkpoint names. A stacked
# tensor takes one format (the loader refuses a mix), so a dense MLP's gate_up stack answers as its gate_proj and
# the routed experts (with the shared ones stacked after them) as expert 0's.
LAYER_LINEARS = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa",
                 "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj", "mlp.experts.0.gate_proj",
                 "mlp.experts.0.down_proj", "mlp.shared_experts.gate_proj", "mlp.shared_experts.down_proj",
                 "eh_proj")


def linear_module(layer: int, suffix: str) -> str:
    """The checkpoint name of a layer's linear module (`suffix` one of LAYER_LINEARS)."""
    return f"model.layers.{layer}.{suffix}"


@dataclass(frozen=True)
class ModelDims:
    version: int  # 2 or 3 (V3 has the router's correction bias)
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # a dense layer's MLP
    moe_intermediate_size: int  # one expert
    num_hidden_layers: int  # the main layers; MTP layers stored after them are not loaded
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    moe_layer_freq: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    fp8_checkpoint: bool  # quantization_config says block-scaled FP8 (what the engine keeps FP8 on a GPU)
    num_nextn_predict_layers: int
    int4_checkpoint: str = ""  # quantization_config's 4-bit weights: "compressed-tensors", "awq" or "" (none)
    int4_group_size: int = 128  # its inputs a scale covers (-1: a whole row)
    int4_symmetric: bool = False  # its weights have no zero points
    fp4_checkpoint: str = ""   # its FP4 weights: "nvfp4", "mxfp4", "modelopt-nvfp4" or "" (none)
    fp8_activations: bool = True  # an FP8 checkpoint quantizes activations too (W8A8); False: weight-only
    # The linear modules (LAYER_LINEARS' names) a quantized checkpoint's config leaves in their dtype: its
    # ignore / modules_to_not_convert / exclude_modules lists, or targets that leave them out.
    unquantized_linears: frozenset[str] = frozenset()

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values the latent cache keeps a token a layer: c_kv and the rotated k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @classmethod
    def from_config(cls, c: Any) -> "ModelDims":
        """From the extension's ModelConfig."""
        int4 = getattr(c, "int4_format", "")  # an extension built before a field was added lacks it
        return cls(version=c.version, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   intermediate_size=c.intermediate_size, moe_intermediate_size=c.moe_intermediate_size,
                   num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                   q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                   qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
                   n_routed_experts=c.n_routed_experts, n_shared_experts=c.n_shared_experts,
                   num_experts_per_tok=c.num_experts_per_tok, first_k_dense_replace=c.first_k_dense_replace,
                   moe_layer_freq=c.moe_layer_freq, max_position_embeddings=c.max_position_embeddings,
                   tie_word_embeddings=c.tie_word_embeddings, fp8_checkpoint=c.fp8,
                   num_nextn_predict_layers=c.num_nextn_predict_layers,
                   int4_checkpoint=int4,
                   int4_group_size=c.int4_group_size if int4 else 128,
                   int4_symmetric=c.int4_symmetric if int4 else False,
                   fp4_checkpoint=getattr(c, "fp4_format", ""),
                   fp8_activations=getattr(c, "fp8_activations", True),
                   unquantized_linears=_unquantized_linears(c))


def _unquantized_linears(c: Any) -> frozenset[str]:
    quantizes = getattr(c, "quantizes", None)
    if quantizes is None:  # an extension built before the config kept these lists
        return frozenset()
    layers = c.num_hidden_layers + c.num_nextn_predict_layers
    return frozenset(name for layer in range(layers) for suffix in LAYER_LINEARS
                     if not quantizes(name := linear_module(layer, suffix)))


def config_json_path(model: str | Path) -> Path:
    """DIR/config.json for a checkpoint directory, or the file itself for a bare config.json (any name)."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {path.parent}")
        return path
    if not path.is_file():
        raise FileNotFoundError(f"{model}: no such checkpoint directory or config.json")
    return path


def load_model_dims(model: str | Path) -> ModelDims:
    """The dimensions of the checkpoint directory or bare config.json `model`. FileNotFoundError when it is not
    there, ValueError naming the file and the field when it is not a DeepSeek V2/V3 config."""
    from deepinfer import _deepinfer

    path = config_json_path(model)
    try:
        text = path.read_text()
        json.loads(text)  # a clear message for text that is not JSON at all
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    try:
        # A checkpoint directory is read as the engine reads it: config.json with what lies beside it (ModelOpt's
        # hf_quant_config.json, generation_config.json's end tokens); a bare config.json alone.
        directory = Path(model).expanduser()
        config = (_deepinfer.load_model_config(str(directory)) if directory.is_dir()
                  else _deepinfer.parse_model_config(text))
        return ModelDims.from_config(config)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: {e}") from None
