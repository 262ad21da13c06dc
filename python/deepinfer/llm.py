"""vLLM's offline entry point, so that code written against ``vllm.LLM`` runs with ``vllm`` replaced by ``deepinfer``:

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="deepseek-ai/DeepSeek-V3", tensor_parallel_size=8, quantization="fp8")
    outputs = llm.generate(prompts, SamplingParams(temperature=0.6, top_p=0.9, max_tokens=1024))

Its keyword arguments are EngineConfig's fields under vLLM's names (``model``, ``block_size`` for ``page_size``); the
vLLM arguments about machinery DeepInfer does not have (``swap_space``, ...) are taken with a warning that says why,
as ``deepinfer serve`` takes their flags; any other unknown argument is a TypeError naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from deepinfer.config import EngineConfig
from deepinfer.engine import DeepInferenceEngine
from deepinfer.server.vllm_flags import ALIASES, INAPPLICABLE
from deepinfer.tokenizer import Tokenizer

__all__ = ["LLM"]

logger = logging.getLogger("deepinfer")


class LLM(DeepInferenceEngine):
    """``DeepInferenceEngine`` built the way ``vllm.LLM`` is: ``LLM(model=..., **engine arguments)``; ``generate``,
    ``chat``, ``get_tokenizer`` as vLLM has them."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        values: dict[str, Any] = {"model_name_or_path": model}
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        for name, value in kwargs.items():
            if name in ALIASES:
                target = ALIASES[name]
                if target in kwargs and kwargs[target] != value:
                    raise ValueError(f"{name}={value!r} and {target}={kwargs[target]!r} differ ({name} is vLLM's name "
                                     f"for {target}); give one of them")
                values[target] = value
            elif "--" + name.replace("_", "-") in INAPPLICABLE:
                logger.warning("LLM(%s=...) is ignored: %s", name, INAPPLICABLE["--" + name.replace("_", "-")][1])
            elif name in fields and name != "model_name_or_path":
                values[name] = value
            else:
                raise TypeError(f"LLM() got an unexpected keyword argument {name!r} (DeepInfer's engine arguments: "
                                f"{', '.join(sorted(fields - {'model_name_or_path'}))}, and model)")
        super().__init__(EngineConfig(**values))

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer
