"""The embedded default model: what runs when no model is given.

A trained DeepSeek-V3-architecture demo model ships inside the package (``deepinfer/default_model``). If a build
lacks it, a deterministic random model of the same architecture is used instead, and says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

TRAINED_MODEL_DIR = Path(__file__).resolve().parent / "default_model"
RANDOM_MODEL_NAME = "deepinfer-random-tiny-v3"

# A tiny DeepSeek-V3 (MLA with q_lora, MoE with shared experts, grouped sigmoid routing, YaRN) over DeepSeek-V3's
# real vocabulary, with random weights (load_format="dummy"): it exercises every code path, and prints noise.
_RANDOM_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rms_norm_eps": 1e-6,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def has_trained_model() -> bool:
    return (TRAINED_MODEL_DIR / "config.json").is_file() and any(TRAINED_MODEL_DIR.glob("*.safetensors"))


def random_model_dir() -> Path:
    """Writes the random model's config.json once into a cache folder and returns that folder."""
    root = Path(os.environ.get("DEEPINFER_CACHE", Path(tempfile.gettempdir()) / "deepinfer-cache"))
    path = root / RANDOM_MODEL_NAME
    config_path = path / "config.json"
    text = json.dumps(_RANDOM_CONFIG, indent=2)
    if not config_path.is_file() or config_path.read_text() != text:
        path.mkdir(parents=True, exist_ok=True)
        tmp = config_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(config_path)
    return path


def default_model() -> tuple[Path, str]:
    """(model directory, load_format) of the embedded default model."""
    if has_trained_model():
        return TRAINED_MODEL_DIR, "safetensors"
    return random_model_dir(), "dummy"
