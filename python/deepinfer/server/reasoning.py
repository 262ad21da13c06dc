"""Reasoning parsers: split a model's output into ``reasoning_content`` and ``content``.

DeepSeek-R1 (and V3.1 in thinking mode) write their chain of thought between ``<think>`` and ``</think>``, then
the answer. The opening tag comes either from the model or from the chat template (R1's newer templates end the
prompt with ``<｜Assistant｜><think>\\n``, so the output starts inside the reasoning and only ``</think>`` appears in
it). The parser works on text deltas as they stream, holding back only what could still be the start of a tag,
so streamed and non-streamed responses split the same output identically.
"""

from __future__ import annotations

__all__ = ["DeepSeekR1ReasoningParser", "REASONING_PARSERS", "ReasoningParser", "get_reasoning_parser"]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Interface: ``feed`` text deltas, then ``finish``; each returns (reasoning delta, content delta)."""

    def feed(self, text: str) -> tuple[str, str]:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> tuple[str, str]:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def saw_reasoning(self) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """One-shot: the whole output -> (reasoning or None, content or None)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        reasoning, content = r1 + r2, c1 + c2
        return (reasoning if self.saw_reasoning else None), (content or None)


class DeepSeekR1ReasoningParser(ReasoningParser):
    """``<think>reasoning</think>content``, the opening tag optional when the prompt already ends with it.

    Whitespace right after a tag is dropped (R1 writes ``<think>\\n`` and ``</think>\\n\\n``). An output that does
    not start with ``<think>`` (and whose prompt did not open one) is all content. An output that ends inside the
    reasoning (``max_tokens`` reached) is all reasoning.
    """

    start_tag = "<think>"
    end_tag = "</think>"

    _UNDECIDED, _REASONING_START, _REASONING, _CONTENT_START, _CONTENT = range(5)

    def __init__(self, prompt_opens_reasoning: bool = False) -> None:
        self._state = self._REASONING_START if prompt_opens_reasoning else self._UNDECIDED
        self._buffer = ""   # text received but not yet classified
        self._saw_reasoning = prompt_opens_reasoning

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        """Whether a rendered prompt leaves the model inside a ``<think>`` block."""
        tail = prompt_text.rstrip()
        return tail.endswith(cls.start_tag)

    @property
    def saw_reasoning(self) -> bool:
        return self._saw_reasoning

    @property
    def in_reasoning(self) -> bool:
        return self._state in (self._REASONING_START, self._REASONING)

    def feed(self, text: str) -> tuple[str, str]:
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            buf = self._buffer
            if self._state == self._UNDECIDED:
                stripped = buf.lstrip()
                if stripped.startswith(self.start_tag):
                    self._state, self._saw_reasoning = self._REASONING_START, True
                    self._buffer = stripped[len(self.start_tag):]
                    continue
                if stripped == "" or self.start_tag.startswith(stripped):
                    break  # could still become "<think>"
                self._state = self._CONTENT
                continue
            if self._state == self._REASONING_START:
                stripped = buf.lstrip()
                if not stripped:
                    self._buffer = ""
                    break
                self._state, self._buffer = self._REASONING, stripped
                continue
            if self._state == self._REASONING:
                end = buf.find(self.end_tag)
                if end >= 0:
                    reasoning.append(buf[:end])
                    self._state, self._buffer = self._CONTENT_START, buf[end + len(self.end_tag):]
                    continue
                keep = _partial_suffix(buf, self.end_tag)
                reasoning.append(buf[:len(buf) - keep])
                self._buffer = buf[len(buf) - keep:]
                break
            if self._state == self._CONTENT_START:
                stripped = buf.lstrip()
                if not stripped:
                    self._buffer = ""
                    break
                self._state, self._buffer = self._CONTENT, stripped
                continue
            # _CONTENT
            content.append(buf)
            self._buffer = ""
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """Releases what was held back: a partial tag is text after all."""
        buf, self._buffer = self._buffer, ""
        if self._state in (self._REASONING, self._REASONING_START):
            return buf, ""
        if self._state == self._CONTENT_START:
            return "", buf.lstrip()
        return "", buf


REASONING_PARSERS = {
    "deepseek-r1": DeepSeekR1ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
}


def get_reasoning_parser(name: str | None) -> type[ReasoningParser] | None:
    if name is None:
        return None
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = sorted(set(REASONING_PARSERS) - {"deepseek_r1"})
        raise ValueError(f"unknown reasoning parser {name!r}; known: {known}") from None
