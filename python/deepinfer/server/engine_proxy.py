"""An API server process's view of the engine in the engine process (``--api-server-count``, engine_link.py).

EngineProxy stands where the app expects a DeepInferenceEngine: the same tokenizer, limits, defaults and counters
(the counters as the engine process last sent them, at most STATS_INTERVAL_S old), and ``submit_async``, which
returns once the engine has queued the request or refused it (ValueError, as the engine's own submit). Its
streams are fed by one task reading the engine's per-step messages. When the engine process goes away, the
counters say the engine is not alive (the server then stops) and every open stream ends with "abort".
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

from deepinfer.outputs import CompletionOutput, RequestOutput
from deepinfer.sampling_params import SamplingParams
from deepinfer.server.engine_link import EngineFacts, EngineQueueFull, encode, read_message, recv_message, unpack_delta


class ProxyStream:
    """One request's deltas in this process, as RequestStream gives them (iteration or forward_to)."""

    def __init__(self, proxy: "EngineProxy", request_id: str, n: int) -> None:
        self._proxy = proxy
        self.request_id = request_id
        self._open = set(range(n))  # completions that have not finished
        self._queue: asyncio.Queue[RequestOutput | None] = asyncio.Queue()
        self._forward: tuple[Any, Any] | None = None
        self.ended = False

    def _push(self, delta: RequestOutput | None) -> None:
        if self.ended:
            return
        if delta is None:
            self.ended = True
        else:
            for out in delta.outputs:
                if out.finish_reason is not None:
                    self._open.discard(out.index)
        if self._forward is not None:
            self._forward[0].put_nowait((self._forward[1], delta))
        else:
            self._queue.put_nowait(delta)

    def _lost(self) -> None:
        """The engine process is gone: the open completions end as aborted."""
        for index in sorted(self._open):
            self._push(RequestOutput(request_id=self.request_id, prompt=None, prompt_token_ids=[],
                                     outputs=[CompletionOutput(index=index, finish_reason="abort",
                                                               error="the engine process is gone")]))
        self._push(None)

    def forward_to(self, q: Any, tag: Any) -> None:
        while not self._queue.empty():
            q.put_nowait((tag, self._queue.get_nowait()))
        self._forward = (q, tag)

    def abort(self) -> None:
        if not self.ended:
            self._proxy._send(("abort", self.request_id))

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item


class EngineProxy:
    """The engine of the process at ``path``, for this process's app. Connect with ``connect()`` (blocking: the
    hello is read before the app is made), then ``await start()`` on the serving event loop."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._streams: dict[str, ProxyStream] = {}
        self._replies: dict[int, asyncio.Future] = {}
        self._seq = itertools.count()
        self._stats = SimpleNamespace(alive=True, failure="")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.request_metrics: Callable[[], list[Any]] | None = None  # this process's, for the others' scrapes
        self.facts: EngineFacts | None = None

    def connect(self, timeout_s: float = 60.0) -> EngineFacts:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(self._path)
            sock.sendall(encode(("hello",)))
            reply = recv_message(sock)
        except OSError as e:
            sock.close()
            raise RuntimeError(f"cannot reach the engine process at {self._path}: {e}") from None
        if not reply or reply[0] != "hello":
            sock.close()
            raise RuntimeError(f"the engine process at {self._path} did not answer the hello")
        sock.settimeout(None)
        self._sock = sock
        facts: EngineFacts = reply[1]
        self.facts = facts
        self.tokenizer = facts.tokenizer
        self.model_config = SimpleNamespace(**facts.model_config)
        self.max_model_len = facts.max_model_len
        self.served_model_name = facts.served_model_name
        self.config = facts.config
        self.generation_defaults = facts.generation_defaults
        self.weight_bytes = facts.weight_bytes
        self.cache_info = facts.cache_info
        self.num_speculative_tokens = facts.num_speculative_tokens
        self.has_structured_outputs = facts.has_structured_outputs
        self._stats = SimpleNamespace(**facts.stats)
        return facts

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._reader_task = asyncio.ensure_future(self._read_loop(reader))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await read_message(reader)
                if message is None:
                    break
                kind = message[0]
                if kind == "out":
                    streams = self._streams
                    for request_id, packed in message[1]:
                        stream = streams.get(request_id)
                        if stream is None:
                            continue
                        if packed is None:
                            del streams[request_id]
                            stream._push(None)
                        else:
                            stream._push(unpack_delta(request_id, packed))
                elif kind == "stats":
                    self._stats = SimpleNamespace(**message[1])
                elif kind == "collect":  # another server process's scrape wants this one's request metrics
                    source = self.request_metrics
                    self._send(("metrics", message[1], source() if source is not None else []))
                elif kind in ("ok", "error", "full"):
                    future = self._replies.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message)
        except (OSError, EOFError, asyncio.CancelledError):
            pass
        finally:
            self._lost()

    def _lost(self) -> None:
        if not self._closing:  # the link broke: the engine process is gone (a server then stops)
            self._stats = SimpleNamespace(**{**vars(self._stats), "alive": False,
                                             "failure": "the engine process is gone"})
        for future in self._replies.values():
            if not future.done():
                future.set_result(("error", -1, "runtime", "the engine process is gone"))
        self._replies.clear()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._lost()

    def _send(self, message: tuple) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        writer.write(encode(message))

    # ------------------------------------------------------------------ what the app calls

    admits_in_engine = True  # submit_async checks the engine's queue (the counters here may be stale)

    async def submit_async(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str,
                           max_waiting: int) -> ProxyStream | EngineQueueFull:
        """Queues the request in the engine, or refuses it: ValueError / RuntimeError as the engine's submit, or
        EngineQueueFull when more than ``max_waiting`` sequences would wait."""
        if not self._stats.alive or self._writer is None:
            raise RuntimeError("the engine process is gone")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        stream = ProxyStream(self, request_id, params.n)
        self._streams[request_id] = stream  # before the engine's first delta can arrive
        seq = next(self._seq)
        future = asyncio.get_running_loop().create_future()
        self._replies[seq] = future
        self._send(("submit", seq, request_id, list(prompt_ids), params, max_waiting))
        reply = await future
        if reply[0] == "full":
            self._streams.pop(request_id, None)
            return EngineQueueFull(reply[2])
        if reply[0] == "error":
            self._streams.pop(request_id, None)
            raise (ValueError if reply[2] == "value" else RuntimeError)(reply[3])
        return stream

    def stats(self) -> Any:
        return self._stats

    async def peer_metrics(self) -> list[Any]:
        """The other server processes' request metrics (metric families, one list a process), for /metrics; the
        engine's counters are refreshed with them."""
        if not self._stats.alive or self._writer is None:
            return []
        seq = next(self._seq)
        future = asyncio.get_running_loop().create_future()
        self._replies[seq] = future
        self._send(("peer_metrics", seq))
        reply = await future
        if reply[0] != "ok":
            return []
        self._stats = SimpleNamespace(**reply[3])  # the engine's counters as of this scrape
        return reply[2]

    def render_chat(self, messages: Any, **kwargs: Any) -> list[int]:
        return self.tokenizer.chat_prompt_ids(messages, **kwargs)

    def prepare_structured_outputs(self) -> bool:
        return self.has_structured_outputs  # the engine process prepares its grammar engine itself

    def shutdown(self) -> None:
        """Closes this process's link (the engine process aborts what it still runs for it); the engine itself
        belongs to the engine process. Safe from any thread."""
        self._closing = True
        if self._writer is None:
            if self._sock is not None:
                self._sock.close()
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._writer.close()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._writer.close)
