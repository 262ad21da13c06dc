"""What generate(), chat() and streams return."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    token_id: int
    logprob: float
    token: str | None = None


@dataclass
class TokenLogprobs:
    """The chosen token's logprob and the top-N alternatives, under the model's raw distribution."""

    token_id: int
    logprob: float
    top: list[Logprob] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None      # "stop", "length", "abort", "error"
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list[TokenLogprobs] | None = None
    error: str | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        return None if self.logprobs is None else sum(t.logprob for t in self.logprobs)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    # With SamplingParams.prompt_logprobs: per prompt token, its own logprob and the top N ({token id: Logprob}),
    # None for the first token (nothing precedes it). In the result and the last delta of a stream.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # Prompt tokens whose latents came from the prefix cache instead of being computed (vLLM's num_cached_tokens).
    num_cached_tokens: int = 0

    # The first completion's fields, for the common n=1 case.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def ttft_s(self) -> float | None:
        return self.metrics.ttft_s if self.metrics else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Generated tokens after the first, per second of decoding (summed over the n completions)."""
        m = self.metrics
        if m is None or m.first_token_time is None or m.finish_time is None:
            return None
        tokens = sum(len(o.token_ids) for o in self.outputs) - len(self.outputs)
        elapsed = m.finish_time - m.first_token_time
        return tokens / elapsed if elapsed > 0 and tokens > 0 else None
