"""Server-sent events of a streamed response, encoded with as little per-token work as the format allows.

Every chunk of a response repeats its id, object, created and model, and differs only in one choice: those fields
are encoded once, and a chunk is the choice's few values spliced between them. The bytes are those of
``json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))`` (strings go through the same C escaper).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from json.encoder import encode_basestring  # json.dumps(ensure_ascii=False)'s string encoder
from typing import Any

__all__ = ["ChunkEncoder", "Inbox", "sse"]


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse(payload: Any) -> bytes:
    """One event: ``data: JSON`` (a str is sent as it is, e.g. "[DONE]")."""
    return f"data: {payload if isinstance(payload, str) else _json(payload)}\n\n".encode("utf-8")


class ChunkEncoder:
    """The chunks of one streamed response, each carrying one choice:
    ``{"id", "object", "created", "model", "choices": [{"index", KEY, "logprobs", "finish_reason", "stop_reason"}]}``
    and ``"usage": null`` after the choices when the request asked for usage (it comes in a last chunk of its own)."""

    def __init__(self, request_id: str, object_name: str, created: int, model: str, content_key: str,
                 include_usage: bool) -> None:
        head = _json({"id": request_id, "object": object_name, "created": created, "model": model})[:-1]
        self._head = f'data: {head},"choices":[{{"index":'
        self._key = f",{encode_basestring(content_key)}:"
        self._tail = "}]" + (',"usage":null' if include_usage else "") + "}\n\n"

    def chunk(self, index: int, content: Any, logprobs: Any = None, finish_reason: str | None = None,
              stop_reason: Any = None) -> bytes:
        return (f'{self._head}{index}{self._key}{_json(content)},"logprobs":{_json(logprobs)},"finish_reason":'
                f'{_json(finish_reason)},"stop_reason":{_json(stop_reason)}{self._tail}').encode("utf-8")


class Inbox:
    """A response's arriving deltas, in order, for its one reader on the event loop: what an asyncio.Queue does for
    ``put_nowait`` / ``get`` / ``qsize``, without its per-item bookkeeping (no maxsize, one waiter at most)."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def qsize(self) -> int:
        return len(self._items)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()
