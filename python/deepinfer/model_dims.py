"""The dimensions of a DeepSeek V2/V3 model that size its memory, read from config.json in pure Python.

``deepinfer plan`` must answer in well under a second for a checkpoint it never loads (or for a bare config.json
downloaded alone), so it reads the fields itself rather than through the extension. Names, defaults and the
fields required are those of csrc/model/config.cpp (``parse_model_config``), so a config the engine accepts gives
the same dimensions here; the engine's own parser still validates everything else when it loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["ModelDims", "load_model_dims", "config_json_path"]

_ARCHITECTURES = {"DeepseekV3ForCausalLM": 3, "DeepseekV2ForCausalLM": 2}
_MODEL_TYPES = {"deepseek_v3": 3, "deepseek_v2": 2}


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
    def from_json(cls, j: Mapping[str, Any], where: str = "config.json") -> "ModelDims":
        if not isinstance(j, Mapping):
            raise ValueError(f"{where}: expected a JSON object")
        archs = j.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
        version = _ARCHITECTURES.get(arch) or (_MODEL_TYPES.get(j.get("model_type", "")) if not arch else None)
        if version is None:
            raise ValueError(f"{where}: unsupported architecture {arch or j.get('model_type')!r}: DeepInfer serves "
                             "DeepseekV2ForCausalLM and DeepseekV3ForCausalLM")

        def integer(key: str, default: int | None = None) -> int:
            value = j.get(key)
            if value is None:
                if default is None:
                    raise ValueError(f"{where}: missing integer field {key!r}")
                return default
            if isinstance(value, float) and value.is_integer():  # 4096.0: the engine's parser converts it too
                return int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{where}: field {key!r} has the wrong type: {json.dumps(value)}")
            return value

        q_lora = j.get("q_lora_rank")
        quant = j.get("quantization_config")
        if isinstance(quant, Mapping) and quant.get("quant_method", "") != "fp8":
            raise ValueError(f"{where}: quantization_config.quant_method {quant.get('quant_method')!r} is not "
                             "supported (native FP8 block-scaled checkpoints are)")
        dims = cls(version=version, vocab_size=integer("vocab_size"), hidden_size=integer("hidden_size"),
                   intermediate_size=integer("intermediate_size", 0),
                   moe_intermediate_size=integer("moe_intermediate_size", 0),
                   num_hidden_layers=integer("num_hidden_layers"), num_attention_heads=integer("num_attention_heads"),
                   q_lora_rank=q_lora if isinstance(q_lora, int) and not isinstance(q_lora, bool) else None,
                   kv_lora_rank=integer("kv_lora_rank"), qk_nope_head_dim=integer("qk_nope_head_dim"),
                   qk_rope_head_dim=integer("qk_rope_head_dim"), v_head_dim=integer("v_head_dim"),
                   n_routed_experts=integer("n_routed_experts", 0), n_shared_experts=integer("n_shared_experts", 0),
                   num_experts_per_tok=integer("num_experts_per_tok", 0),
                   first_k_dense_replace=integer("first_k_dense_replace", 0),
                   moe_layer_freq=integer("moe_layer_freq", 1),
                   max_position_embeddings=integer("max_position_embeddings", 4096),
                   tie_word_embeddings=bool(j.get("tie_word_embeddings") or False),
                   fp8_checkpoint=isinstance(quant, Mapping),
                   num_nextn_predict_layers=integer("num_nextn_predict_layers", 0))
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(dims, name) <= 0:
                raise ValueError(f"{where}: {name!r} must be > 0, got {getattr(dims, name)}")
        if dims.n_routed_experts > 0 and (dims.moe_intermediate_size <= 0 or dims.num_experts_per_tok <= 0):
            raise ValueError(f"{where}: a MoE model needs moe_intermediate_size and num_experts_per_tok > 0")
        return dims


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
    path = config_json_path(model)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    return ModelDims.from_json(data, str(path))
