"""The wire between `deepinfer serve`'s engine process and its API server processes (``--api-server-count``).

One Unix socket a server process, in a folder only this user can enter; both ends are this program, so a message
is a pickle behind a 4-byte length. What crosses it:

- server -> engine: ``("hello",)`` once, then ``("submit", seq, request_id, prompt_ids, params, max_waiting)``
  and ``("abort", request_id)``; at a scrape ``("peer_metrics", seq)``, and ``("metrics", token, families)`` when
  asked with ``("collect", token)``;
- engine -> server: ``("hello", EngineFacts)``; ``("ok", seq)``, ``("full", seq, waiting)`` (more than
  max_waiting sequences would wait: nothing queued) or ``("error", seq, kind, message)`` for a submission;
  ``("ok", seq, [families of each other server], stats)`` for a scrape; ``("out", [(request_id, packed delta or None at its end), ...])``, one message an engine step with
  every delta of that server's streams; ``("stats", {name: value})`` every STATS_INTERVAL_S.

A delta crosses as a tuple of its completion's fields (pack_delta / unpack_delta), not as a pickled RequestOutput:
that would carry the prompt's token ids with every token.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from deepinfer.outputs import CompletionOutput, RequestOutput

_HEADER = struct.Struct("!I")
STATS_INTERVAL_S = 0.1  # how stale the servers' view of the engine's queue (admission, /metrics) may be

@dataclass
class EngineQueueFull:
    """A submission refused because the engine's queue is full: ``waiting`` sequences wait already."""

    waiting: int


@dataclass
class EngineFacts:
    """What a server process needs to know of the engine to serve it (sent once, in the hello)."""

    tokenizer: Any
    model_config: dict[str, Any]
    max_model_len: int
    served_model_name: str
    config: Any
    generation_defaults: dict[str, Any]
    weight_bytes: dict[str, int]
    cache_info: dict[str, Any]
    num_speculative_tokens: int
    has_structured_outputs: bool
    app_options: dict[str, Any] = field(default_factory=dict)  # create_app's keyword arguments
    server: dict[str, Any] = field(default_factory=dict)  # the HTTP server's settings (serve's resolved options)
    stats: dict[str, Any] = field(default_factory=dict)


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def recv_message(sock: socket.socket) -> Any | None:
    """The next message (blocking); None when the other end has closed the connection."""
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _recv_exactly(sock, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


async def read_message(reader: asyncio.StreamReader) -> Any | None:
    """The next message on an event loop; None when the other end has closed the connection."""
    try:
        header = await reader.readexactly(_HEADER.size)
        return pickle.loads(await reader.readexactly(_HEADER.unpack(header)[0]))
    except asyncio.IncompleteReadError:
        return None


def plain_fields(obj: Any) -> dict[str, Any]:
    """An extension object's public fields as plain values (the C++ ModelConfig and engine stats do not pickle)."""
    out = {}
    for name in dir(obj):
        if name.startswith("_"):
            continue
        value = getattr(obj, name)
        if callable(value):
            continue
        if isinstance(value, (list, tuple)):
            value = list(value)
        elif not isinstance(value, (bool, int, float, str, type(None))):
            value = str(value)  # an enum of the extension: its name is what a server could show
        out[name] = value
    return out


def pack_delta(delta: RequestOutput) -> tuple:
    """A delta of one completion (the dispatcher makes one a completion) as plain fields."""
    (out,) = delta.outputs
    return (out.index, out.text, out.token_ids, out.finish_reason, out.stop_reason, out.logprobs, out.error,
            delta.finished, delta.prompt_logprobs, delta.num_cached_tokens)


def unpack_delta(request_id: str, packed: tuple) -> RequestOutput:
    index, text, token_ids, finish_reason, stop_reason, logprobs, error, finished, prompt_logprobs, cached = packed
    out = CompletionOutput(index=index, text=text, token_ids=token_ids, finish_reason=finish_reason,
                           stop_reason=stop_reason, logprobs=logprobs, error=error)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[], outputs=[out], finished=finished,
                         prompt_logprobs=prompt_logprobs, num_cached_tokens=cached)
