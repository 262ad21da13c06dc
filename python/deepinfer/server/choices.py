"""What /v1/completions and /v1/chat/completions answer differently: the shape of a choice.

A request's run is the same for both endpoints (serving.py collects or streams it, adds usage, reports failures,
aborts on disconnect). Only a choice's content differs, and this module holds that part, one ``ChoiceFormat`` per
endpoint, built for one request:

- /v1/completions: ``"text"`` (after the echoed prompt, with ``echo``) and logprobs as four parallel lists with
  character offsets;
- /v1/chat/completions: a ``"message"`` (a ``"delta"`` when streaming, opened by the assistant role), split into
  ``reasoning_content`` and ``content`` by a reasoning parser, with logprobs as one entry per token with its bytes.
"""

from __future__ import annotations

import math
from typing import Any

from deepinfer.outputs import CompletionOutput, Logprob, TokenLogprobs
from deepinfer.server.reasoning import ReasoningParser
from deepinfer.server.tool_calls import DeepSeekToolCallParser, ToolCallDelta
from deepinfer.tokenizer import TokenText

__all__ = ["ChatFormat", "Choice", "ChoiceFormat", "CompletionFormat"]

_MIN_LOGPROB = -9999.0            # JSON has no -inf


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _MIN_LOGPROB


class Choice:
    """Accumulated state of one choice while its response is built."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.parts: list[str] = []
        self.num_tokens = 0
        self.logprobs: list[TokenLogprobs] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None

    def add(self, out: CompletionOutput) -> None:
        self.parts.append(out.text)
        self.num_tokens += len(out.token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finish_reason:
            self.finish_reason, self.stop_reason, self.error = out.finish_reason, out.stop_reason, out.error

    @property
    def text(self) -> str:
        return "".join(self.parts)


class ChoiceFormat:
    """One endpoint's choices: the names on the wire and each choice's content and logprobs."""

    object: str        # the "object" of a whole response
    chunk_object: str  # the "object" of a streamed chunk
    body_key: str      # the key of a choice's content in a whole response
    delta_key: str     # the key of a choice's content in a streamed chunk

    def body(self, c: Choice) -> tuple[Any, Any]:
        """(content, logprobs) of a finished choice in the whole response."""
        raise NotImplementedError  # pragma: no cover - interface

    def first_delta(self, c: Choice) -> Any:
        """What a stream sends for a choice before its first output; None: nothing."""
        raise NotImplementedError  # pragma: no cover - interface

    def delta(self, c: Choice, out: CompletionOutput) -> tuple[Any, Any] | None:
        """(content, logprobs) to stream for a choice's new output (already added to ``c``); None: no chunk."""
        raise NotImplementedError  # pragma: no cover - interface

    def prompt_scored(self, prompt: int, entries: list[dict[int, Logprob] | None] | None) -> None:
        """The logprobs of prompt ``prompt``'s tokens (RequestOutput.prompt_logprobs), before the bodies are built."""

    def finish_reason(self, c: Choice, reason: str | None) -> str | None:
        """The finish_reason a choice reports (called once its output is complete): the engine's by default."""
        return reason


class CompletionFormat(ChoiceFormat):
    object = chunk_object = "text_completion"
    body_key = delta_key = "text"

    def __init__(self, token_text: TokenText, echo_texts: list[str], echo: bool, n: int,
                 want_logprobs: bool, scored_prompts: list[list[int]] | None = None) -> None:
        """``echo_texts``: per prompt, the prompt's text with ``echo`` and "" without. ``scored_prompts``: per prompt,
        its token ids, when the request scores its prompts (echo with logprobs): their logprobs lead each choice's."""
        self._token_text = token_text
        self._scored_prompts = scored_prompts
        self._prompt_logprobs: dict[int, list[dict[int, Logprob] | None]] = {}
        self._echo_texts = echo_texts
        self._echo = echo
        self._n = n
        self._want_logprobs = want_logprobs
        # Per choice, the character offset of the next token's text (after the echoed prompt).
        self._text_offsets = [len(echo_texts[i // n]) for i in range(len(echo_texts) * n)]

    def _logprobs(self, entries: list[TokenLogprobs], c: Choice) -> dict[str, Any]:
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for e in entries:
            text, _ = self._token_text.get(e.token_id)
            tokens.append(text)
            token_logprobs.append(_finite(e.logprob))
            top_logprobs.append({self._token_text.get(t.token_id)[0]: _finite(t.logprob) for t in e.top})
            offsets.append(self._text_offsets[c.index])
            self._text_offsets[c.index] += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def prompt_scored(self, prompt: int, entries: list[dict[int, Logprob] | None] | None) -> None:
        if entries is not None:
            self._prompt_logprobs[prompt] = entries

    def _prompt_part(self, prompt: int) -> dict[str, Any]:
        """The prompt's tokens as the leading entries of the four lists: the first token has no logprob (null)."""
        ids = self._scored_prompts[prompt] if self._scored_prompts else []
        entries = self._prompt_logprobs.get(prompt, [])
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        offset = 0
        for i, token_id in enumerate(ids):
            text, _ = self._token_text.get(token_id)
            entry = entries[i] if i < len(entries) else None
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if entry is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(_finite(entry[token_id].logprob))
            top_logprobs.append({self._token_text.get(t)[0]: _finite(lp.logprob) for t, lp in entry.items()})
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def body(self, c: Choice) -> tuple[Any, Any]:
        logprobs = self._logprobs(c.logprobs, c) if self._want_logprobs else None
        if logprobs is not None and self._scored_prompts is not None:
            prompt = self._prompt_part(c.index // self._n)
            logprobs = {key: prompt[key] + logprobs[key] for key in prompt}
        return self._echo_texts[c.index // self._n] + c.text, logprobs

    def first_delta(self, c: Choice) -> Any:
        return self._echo_texts[c.index // self._n] if self._echo else None

    def delta(self, c: Choice, out: CompletionOutput) -> tuple[Any, Any] | None:
        logprobs = self._logprobs(out.logprobs or [], c) if self._want_logprobs else None
        if out.text or out.finish_reason or (logprobs and logprobs["tokens"]):
            return out.text, logprobs
        return None


class ChatFormat(ChoiceFormat):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    body_key = "message"
    delta_key = "delta"

    def __init__(self, token_text: TokenText, n: int, want_logprobs: bool,
                 parser_cls: type[ReasoningParser] | None, opens_reasoning: bool,
                 tool_parser_cls: type[DeepSeekToolCallParser] | None = None, parallel_tool_calls: bool = True,
                 role: str = "assistant", echo_text: str = "") -> None:
        self._token_text = token_text
        self._role = role  # the server's --response-role
        self._echo_text = echo_text  # the request's echo: the final message's content, leading every reply
        self._want_logprobs = want_logprobs
        # Per choice, its reasoning parser (None: no reasoning_content, all is content).
        self._parsers: list[ReasoningParser | None] = [parser_cls(opens_reasoning) if parser_cls else None
                                                       for _ in range(n)]
        # Per choice, its tool-call parser over the content (None: the request has no tools).
        self._tool_parsers: list[DeepSeekToolCallParser | None] = [tool_parser_cls() if tool_parser_cls else None
                                                                   for _ in range(n)]
        self._parallel_tool_calls = parallel_tool_calls

    def finish_reason(self, c: Choice, reason: str | None) -> str | None:
        parser = self._tool_parsers[c.index]
        return "tool_calls" if reason == "stop" and parser is not None and parser.made_calls else reason

    def _tool_deltas(self, c: Choice, deltas: list[ToolCallDelta]) -> list[dict]:
        # Without parallel tool calls only the first call is the turn's; later ones are dropped.
        return [d.openai() for d in deltas if self._parallel_tool_calls or d.index == 0]

    def _logprobs(self, entries: list[TokenLogprobs]) -> dict[str, Any]:
        content = []
        for e in entries:
            text, raw = self._token_text.get(e.token_id)
            top = []
            for t in e.top:
                t_text, t_raw = self._token_text.get(t.token_id)
                top.append({"token": t_text, "logprob": _finite(t.logprob), "bytes": t_raw})
            content.append({"token": text, "logprob": _finite(e.logprob), "bytes": raw, "top_logprobs": top})
        return {"content": content}

    def body(self, c: Choice) -> tuple[Any, Any]:
        message: dict[str, Any] = {"role": self._role}
        parser = self._parsers[c.index]
        if parser is not None:
            reasoning, content = parser.parse(c.text)
            # All reasoning and no answer (max_tokens reached while thinking): content is null.
            message["content"] = content if content is not None else ("" if reasoning is None else None)
            message["reasoning_content"] = reasoning
        else:
            message["content"] = c.text
        tools = self._tool_parsers[c.index]
        if tools is not None:
            content, calls = tools.parse(message["content"] or "")
            if calls:
                message["content"] = content or None
                message["tool_calls"] = calls if self._parallel_tool_calls else calls[:1]
        if self._echo_text:
            message["content"] = self._echo_text + (message["content"] or "")
        return message, self._logprobs(c.logprobs) if self._want_logprobs else None

    def first_delta(self, c: Choice) -> Any:
        return {"role": self._role, "content": self._echo_text}

    def delta(self, c: Choice, out: CompletionOutput) -> tuple[Any, Any] | None:
        delta: dict[str, Any] = {}
        parser = self._parsers[c.index]
        if parser is not None:
            reasoning, content = parser.feed(out.text)
            if out.finish_reason:
                r2, c2 = parser.finish()
                reasoning, content = reasoning + r2, content + c2
            if reasoning:
                delta["reasoning_content"] = reasoning
        else:
            content = out.text
        tools = self._tool_parsers[c.index]
        if tools is not None:
            content, deltas = tools.feed(content)
            if out.finish_reason:
                c2, d2 = tools.finish()
                content, deltas = content + c2, deltas + d2
            calls = self._tool_deltas(c, deltas)
            if calls:
                delta["tool_calls"] = calls
        if content:
            delta["content"] = content
        logprobs = self._logprobs(out.logprobs) if self._want_logprobs and out.logprobs else None
        if delta or logprobs or out.finish_reason:
            return delta, logprobs
        return None


def prompt_logprobs_body(token_text: TokenText, ids: list[int],
                         entries: list[dict[int, Logprob] | None] | None, top: int) -> list[Any] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, null for the first (nothing precedes it), then {token id:
    {"logprob", "rank", "decoded_token"}} for the token itself and the ``top`` most likely. A rank is 1 + the
    entries above it, which is the true rank for the top ones; the prompt token itself, when it is not among them,
    has an unknown rank (null)."""
    if entries is None:
        return None
    out: list[Any] = []
    for i, entry in enumerate(entries):
        if entry is None:
            out.append(None)
            continue
        outside_top = len(entry) > top
        position = {}
        for token_id, lp in entry.items():
            if outside_top and token_id == ids[i]:
                rank = None
            else:
                rank = 1 + sum(1 for other in entry.values() if other.logprob > lp.logprob)
            position[str(token_id)] = {"logprob": _finite(lp.logprob), "rank": rank,
                                       "decoded_token": token_text.get(token_id)[0]}
        out.append(position)
    return out
