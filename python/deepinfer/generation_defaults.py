"""Default sampling values a checkpoint recommends, from its generation_config.json.

Model authors put the sampling values their model is meant to run with there (DeepSeek-R1: temperature 0.6,
top_p 0.95). Like vLLM's ``--generation-config auto``, DeepInfer uses them for every value a request leaves unset:
``generate()`` without sampling parameters, and every field a server request omits. Values given explicitly always
win. ``EngineConfig(generation_config="none")`` ignores the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# generation_config.json key -> SamplingParams field.
_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
         "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def load_generation_defaults(model_dir: Path, mode: str) -> dict[str, Any]:
    """The SamplingParams fields generation_config.json in ``model_dir`` sets (``mode`` "auto"), or none ("none" or
    no file). A file that is not a JSON object raises ValueError naming it."""
    if mode == "none":
        return {}
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    defaults = {field: data[key] for key, field in _KEYS.items() if data.get(key) is not None}
    if data.get("do_sample") is False:
        defaults["temperature"] = 0.0  # transformers' greedy decoding, whatever temperature says
    return defaults
