"""DeepSeek's tool-call text, parsed into OpenAI ``tool_calls``.

DeepSeek-V3/R1 write a turn's tool calls after its content, between ``<｜tool▁calls▁begin｜>`` and
``<｜tool▁calls▁end｜>``, each call as

    V3/R1:  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGUMENTS\\n```<｜tool▁call▁end｜>
    V3.1:   <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>

One parser reads both forms (a call that starts with ``function<｜tool▁sep｜>`` is the V3 form). It works on text deltas
as they stream, holding back only what could still be the start of a marker or of the closing fence, so a streamed
and a whole response split the same output identically: content first, then each call as it completes its name
(name first, then argument fragments). Text that does not follow the format is returned as content, never an error.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

__all__ = ["DeepSeekToolCallParser", "TOOL_CALL_PARSERS", "ToolCallDelta"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
V3_KIND = "function" + SEP
FENCE_OPEN = "```json\n"
FENCE_CLOSE = "\n```"


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for n in range(min(len(text), len(tag) - 1), best, -1):
            if tag.startswith(text[-n:]):
                best = n
                break
    return best


@dataclass
class ToolCallDelta:
    """A piece of tool call ``index``: its id and name (the first piece), then fragments of its arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict:
        out: dict = {"index": self.index}
        if self.id is not None:
            out.update({"id": self.id, "type": "function"})
        function: dict = {}
        if self.name is not None:
            function["name"] = self.name
        function["arguments"] = self.arguments
        out["function"] = function
        return out


@dataclass
class _Call:
    name: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    arguments: str = ""
    complete: bool = False  # its end marker was read


class DeepSeekToolCallParser:
    """Feed text deltas, then ``finish``; each returns (content delta, tool-call deltas)."""

    _CONTENT, _BETWEEN, _HEAD, _ARGS = range(4)  # content; between calls; a call's kind/name; its arguments

    def __init__(self) -> None:
        self._state = self._CONTENT
        self._buffer = ""
        self.calls: list[_Call] = []
        self._v3_form = False      # the call being read has the V3 form (fenced JSON)
        self._fence_opened = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(content, deltas, final=False):
            pass
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(content, deltas, final=True):
            pass
        # Whatever is left did not complete the format (the output ended inside a call): it is content.
        if self._state != self._CONTENT or self._buffer:
            content.append(self._buffer)
            self._buffer = ""
        self._state = self._CONTENT
        return "".join(content), deltas

    @property
    def made_calls(self) -> bool:
        """Whether the output holds at least one complete call."""
        return any(c.complete for c in self.calls)

    def parse(self, text: str) -> tuple[str, list[dict]]:
        """One-shot: the whole output -> (content, OpenAI tool_calls). An output that ends inside a call is all
        content, and so is one whose call markers hold no call (a stream has sent such text's pieces by then as they
        came; a whole response need not)."""
        c1, _ = self.feed(text)
        c2, _ = self.finish()
        if not self.made_calls or not all(c.complete for c in self.calls):
            return text, []
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in self.calls]
        return c1 + c2, calls

    # One transition of the state machine; False when it needs more text.
    def _step(self, content: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        b = self._buffer
        if self._state == self._CONTENT:
            at = b.find(CALLS_BEGIN)
            if at < 0:
                keep = 0 if final else _partial_suffix(b, (CALLS_BEGIN,))
                content.append(b[:len(b) - keep])
                self._buffer = b[len(b) - keep:]
                return False
            content.append(b[:at])
            self._buffer = b[at + len(CALLS_BEGIN):]
            self._state = self._BETWEEN
            return True
        if self._state == self._BETWEEN:
            stripped = b.lstrip()
            if stripped.startswith(CALL_BEGIN):
                self._buffer = stripped[len(CALL_BEGIN):]
                self._state = self._HEAD
                return True
            if stripped.startswith(CALLS_END):
                self._buffer = stripped[len(CALLS_END):]
                self._state = self._CONTENT  # text after the calls (rare) is content again
                return True
            if stripped and not CALL_BEGIN.startswith(stripped) and not CALLS_END.startswith(stripped):
                # Not the format: the rest is content, the calls read so far stand.
                content.append(b)
                self._buffer = ""
                self._state = self._CONTENT
                return False
            return False
        if self._state == self._HEAD:
            at = b.find(SEP)
            if at < 0:
                return False
            head = b[:at]
            rest = b[at + len(SEP):]
            if head == "function":  # V3: the name follows the separator, up to the end of its line
                newline = rest.find("\n")
                if newline < 0:
                    return False
                name, rest = rest[:newline].strip(), rest[newline + 1:]
                self._v3_form = True
            else:
                name = head.strip()
                self._v3_form = False
            self._fence_opened = False
            call = _Call(name=name)
            self.calls.append(call)
            deltas.append(ToolCallDelta(index=len(self.calls) - 1, id=call.id, name=name))
            self._buffer = rest
            self._state = self._ARGS
            return True
        # _ARGS
        if self._v3_form and not self._fence_opened:
            stripped = b.lstrip("\n")
            if stripped.startswith(FENCE_OPEN):
                self._buffer = b = stripped[len(FENCE_OPEN):]
                self._fence_opened = True
            elif FENCE_OPEN.startswith(stripped) and not final:
                return False
            else:
                self._fence_opened = True  # no fence: the arguments as they come
        at = b.find(CALL_END)
        done = at >= 0
        piece = b[:at] if done else b
        if done:
            if self._v3_form and piece.endswith(FENCE_CLOSE):
                piece = piece[:-len(FENCE_CLOSE)]
            rest = b[at + len(CALL_END):]
        else:
            keep = _partial_suffix(piece, (CALL_END,))
            if self._v3_form:
                keep = max(keep, _partial_suffix(piece, (FENCE_CLOSE + CALL_END,)))
            rest = piece[len(piece) - keep:]
            piece = piece[:len(piece) - keep]
        if piece:
            self.calls[-1].arguments += piece
            deltas.append(ToolCallDelta(index=len(self.calls) - 1, arguments=piece))
        self._buffer = rest
        if done:
            self.calls[-1].complete = True
            self._state = self._BETWEEN
            return True
        return False


TOOL_CALL_PARSERS = {"deepseek_v3": DeepSeekToolCallParser, "deepseek_v31": DeepSeekToolCallParser}
