"""Sampling parameters as users write them (vLLM/OpenAI names), validated before anything is queued."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

from deepinfer import _deepinfer
from deepinfer.structured_outputs import StructuredOutputsParams

# The most alternatives a token's logprobs carry (OpenAI's top_logprobs limit, vLLM's default --max-logprobs).
MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None         # top-N logprobs per generated token (plus the chosen token's)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token after the first (plus the token's own)
    skip_special_tokens: bool = True
    # The output follows a JSON Schema, regex, choice or grammar (vLLM's name and type; a dict is accepted too).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams (or a dict of its fields), got "
                             f"{type(self.structured_outputs).__name__}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        def require(cond: bool, message: str) -> None:
            if not cond:
                raise ValueError(message)

        def number(name: str) -> float:
            v = getattr(self, name)
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                    f"{name} must be a finite number, got {v!r}")
            return float(v)

        require(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        require(number("temperature") >= 0.0, f"temperature must be >= 0, got {self.temperature!r}")
        require(0.0 < number("top_p") <= 1.0, f"top_p must be in (0, 1], got {self.top_p!r}")
        require(isinstance(self.top_k, int) and (self.top_k >= 0 or self.top_k == -1),
                f"top_k must be an integer >= 0 (0 or -1 disables it), got {self.top_k!r}")
        require(0.0 <= number("min_p") <= 1.0, f"min_p must be in [0, 1], got {self.min_p!r}")
        require(self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
                f"seed must be None or an integer >= 0, got {self.seed!r}")
        scoring = self.prompt_logprobs is not None
        require(isinstance(self.max_tokens, int) and (self.max_tokens > 0 or (scoring and self.max_tokens == 0)),
                f"max_tokens must be an integer > 0 (0 only with prompt_logprobs), got {self.max_tokens!r}")
        require(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
                f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}")
        require(all(isinstance(s, str) and s for s in self.stop), f"stop must be non-empty strings, got {self.stop!r}")
        require(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        require(number("repetition_penalty") > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        require(-2.0 <= number("presence_penalty") <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty!r}")
        require(-2.0 <= number("frequency_penalty") <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty!r}")
        require(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
                f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        require(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int) and
                                                 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
                f"prompt_logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}")

    @classmethod
    def from_kwargs(cls, base: "SamplingParams | None" = None, **kwargs: Any) -> "SamplingParams":
        known = {f.name for f in fields(cls)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown sampling parameters {sorted(unknown)}; known: {sorted(known)}")
        values = {f.name: getattr(base, f.name) for f in fields(cls)} if base is not None else {}
        values.update(kwargs)
        return cls(**values)

    def to_core(self, seed: int | None, score_prompt: bool = True) -> "_deepinfer.SamplingParams":
        """The C++ engine's parameters; ``score_prompt=False`` leaves prompt_logprobs out (a second completion of the
        same prompt)."""
        p = _deepinfer.SamplingParams()
        p.temperature = float(self.temperature)
        p.top_k = 0 if self.top_k == -1 else int(self.top_k)
        p.top_p = float(self.top_p)
        p.min_p = float(self.min_p)
        p.seed = seed
        p.repetition_penalty = float(self.repetition_penalty)
        p.presence_penalty = float(self.presence_penalty)
        p.frequency_penalty = float(self.frequency_penalty)
        p.max_tokens = int(self.max_tokens)
        p.min_tokens = int(self.min_tokens)
        p.stop_token_ids = [int(t) for t in self.stop_token_ids]
        p.ignore_eos = bool(self.ignore_eos)
        p.logprobs = -1 if self.logprobs is None else int(self.logprobs)
        # A request that generates nothing exists only to score its prompt, so every completion of it scores.
        scores = self.prompt_logprobs is not None and (score_prompt or self.max_tokens == 0)
        p.prompt_logprobs = int(self.prompt_logprobs) if scores else -1
        if self.structured_outputs is not None:
            p.grammar = self.structured_outputs.to_core()
        return p
