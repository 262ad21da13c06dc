"""The engine process's end of ``--api-server-count``: it serves its engine to the API server processes.

Every server process connects to one Unix socket (engine_link.py). A connection has two threads: a reader that
submits and aborts the server's requests (a refusal goes back as an error, nothing queued), and a writer that sends
the connection's outbox: submission replies, the engine's deltas of that server's streams (one message an engine
step: the connection is the streams' DeltaSink, so the dispatcher hands it a step's deltas in one call and goes on)
and the engine's counters every STATS_INTERVAL_S. A server that goes away has its requests aborted (their pages
freed), as a client that disconnects does.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from typing import Any

from deepinfer.server.engine_link import STATS_INTERVAL_S, EngineFacts, encode, pack_delta, plain_fields, recv_message

logger = logging.getLogger("deepinfer.server")

_METRICS_TIMEOUT_S = 2.0  # for the other server processes' request metrics, at a scrape


def engine_facts(engine: Any, app_options: dict[str, Any], server: dict[str, Any]) -> EngineFacts:
    return EngineFacts(tokenizer=engine.tokenizer, model_config=plain_fields(engine.model_config),
                       max_model_len=int(engine.max_model_len), served_model_name=engine.served_model_name,
                       config=engine.config, generation_defaults=dict(engine.generation_defaults),
                       weight_bytes=dict(engine.weight_bytes), cache_info=dict(engine.cache_info),
                       num_speculative_tokens=int(engine.num_speculative_tokens),
                       has_structured_outputs=bool(engine.has_structured_outputs), app_options=dict(app_options),
                       server=dict(server), stats=plain_fields(engine.stats()))


class _PendingSequences:
    """The sequences submitted through the host that have produced nothing yet (queued, or in prefill), over every
    server process: what the queue limit counts, as one server process counts its own (serving.py pending_seqs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_request: dict[str, set[int]] = {}  # request id -> its completions' indices without a token yet
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def add(self, request_id: str, n: int) -> None:
        with self._lock:
            self._by_request[request_id] = set(range(n))
            self._count += n

    def produced(self, request_id: str, index: int) -> None:
        with self._lock:
            waiting = self._by_request.get(request_id)
            if waiting is not None and index in waiting:
                waiting.discard(index)
                self._count -= 1
                if not waiting:
                    del self._by_request[request_id]

    def drop(self, request_id: str) -> None:
        with self._lock:
            waiting = self._by_request.pop(request_id, None)
            if waiting:
                self._count -= len(waiting)


class _Connection:
    """One API server process: its requests and its outbox."""

    def __init__(self, host: "EngineHost", sock: socket.socket, name: str) -> None:
        self._host = host
        self._sock = sock
        self._name = name
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"deepinfer-link-in-{name}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"deepinfer-link-out-{name}", daemon=True)
        self._reader.start()
        self._writer.start()

    # DeltaSink: called on the engine's dispatcher thread, once a step.
    def deliver(self, items: list[tuple[Any, Any]]) -> None:
        self._outbox.put(items)

    def _read_loop(self) -> None:
        try:
            while True:
                message = recv_message(self._sock)
                if message is None:
                    return
                self._handle(message)
        except OSError:
            pass  # the connection broke: the same as a close
        except Exception:
            logger.exception("API server %s sent a message the engine process cannot read", self._name)
        finally:
            self.close()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        engine = self._host.engine
        if kind == "submit":
            _, seq, request_id, prompt_ids, params, max_waiting = message
            # The queue is checked here, against the engine's count of now and the sequences of every server still
            # without a token (in prefill too, which the engine's waiting count leaves out): the servers' counters
            # may be a STATS_INTERVAL_S old, and several servers feed the one queue. One check and submission at a
            # time, so two servers cannot both take the last place.
            pending = self._host.pending
            with self._host.admission:
                waiting = max(int(engine.stats().num_waiting), pending.count)
                if waiting + params.n > max_waiting:
                    self._outbox.put(("full", seq, waiting))
                    return
                pending.add(request_id, params.n)  # before the engine has it: its first outputs find it
                try:
                    stream = engine.submit({"prompt_token_ids": prompt_ids}, params, request_id=request_id, sink=self)
                except ValueError as e:
                    pending.drop(request_id)
                    self._outbox.put(("error", seq, "value", str(e)))
                    return
                except RuntimeError as e:  # the engine is shut down
                    pending.drop(request_id)
                    self._outbox.put(("error", seq, "runtime", str(e)))
                    return
            with self._lock:
                self._streams[request_id] = stream
                if stream.finished:  # it ended before it was registered here
                    self._streams.pop(request_id, None)
            self._outbox.put(("ok", seq))
        elif kind == "abort":
            with self._lock:
                stream = self._streams.get(message[1])
            if stream is not None:
                stream.abort()
        elif kind == "peer_metrics":  # the other server processes' request metrics, for this one's scrape
            seq = message[1]
            threading.Thread(target=self._answer_scrape, args=(seq,), name="deepinfer-link-metrics",
                             daemon=True).start()
        elif kind == "metrics":  # a server process's answer to "collect"
            self._host.metrics_arrived(message[1], message[2])
        elif kind == "hello":
            self._outbox.put(("hello", self._host.facts()))
        else:
            raise ValueError(f"unknown message {kind!r}")

    def _write_loop(self) -> None:
        last_stats = 0.0
        try:
            while not self._closed.is_set():
                try:
                    items = [self._outbox.get(timeout=STATS_INTERVAL_S)]
                except queue.Empty:
                    items = []
                while True:  # everything already waiting goes out in one write
                    try:
                        items.append(self._outbox.get_nowait())
                    except queue.Empty:
                        break
                frames = [self._frame(item) for item in items]
                now = time.monotonic()
                if now - last_stats >= STATS_INTERVAL_S:
                    frames.append(encode(("stats", plain_fields(self._host.engine.stats()))))
                    last_stats = now
                if frames:
                    self._sock.sendall(b"".join(frames))
        except OSError:
            pass  # the server process is gone: the reader sees it too
        finally:
            self.close()

    def _frame(self, item: Any) -> bytes:
        if isinstance(item, tuple):  # a reply
            return encode(item)
        out = []
        ended = []
        pending = self._host.pending
        for stream, delta in item:
            out.append((stream.request_id, None if delta is None else pack_delta(delta)))
            if delta is None:
                ended.append(stream.request_id)
                pending.drop(stream.request_id)
            elif delta.outputs[0].token_ids or delta.outputs[0].finish_reason:
                pending.produced(stream.request_id, delta.outputs[0].index)
        if ended:
            with self._lock:
                for request_id in ended:
                    self._streams.pop(request_id, None)
        return encode(("out", out))

    def _answer_scrape(self, seq: int) -> None:
        """A scrape's reply: the other server processes' request metrics and the engine's counters of now (the
        periodic ones may be STATS_INTERVAL_S old)."""
        peers = self._host.gather_metrics(self)
        self._outbox.put(("ok", seq, peers, plain_fields(self._host.engine.stats())))

    def ask_for_metrics(self, token: int) -> None:
        self._outbox.put(("collect", token))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:  # nobody reads their outputs any more: free their pages
            stream.abort()
            self._host.pending.drop(stream.request_id)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._host._forget(self)


class EngineHost:
    """Serves ``engine`` to API server processes on a Unix socket at ``self.path`` (in a private folder)."""

    def __init__(self, engine: Any, app_options: dict[str, Any], server: dict[str, Any]) -> None:
        self.engine = engine
        self._app_options = dict(app_options)
        self._server = dict(server)
        self._folder = tempfile.mkdtemp(prefix="deepinfer-link-")  # mode 0700: only this user connects
        self.path = os.path.join(self._folder, "engine.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._metrics_arrived = threading.Condition(self._lock)
        self._gathering: dict[int, list[Any]] = {}
        self.pending = _PendingSequences()
        self.admission = threading.Lock()  # a submission's queue check and its engine.submit, together
        self._tokens = itertools.count()
        self._count = 0
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, name="deepinfer-link-accept", daemon=True)
        self._acceptor.start()

    def facts(self) -> EngineFacts:
        return engine_facts(self.engine, self._app_options, self._server)

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._count += 1
                self._connections.add(_Connection(self, sock, str(self._count)))

    def gather_metrics(self, asking: _Connection) -> list[Any]:
        """Every other server process's request metrics, fresh: each is asked, and answers within
        _METRICS_TIMEOUT_S (one that does not is left out of this scrape)."""
        with self._lock:
            others = [c for c in self._connections if c is not asking]
            token = next(self._tokens)
            gathering = self._gathering[token] = []
        for c in others:
            c.ask_for_metrics(token)
        deadline = time.monotonic() + _METRICS_TIMEOUT_S
        with self._metrics_arrived:
            while len(gathering) < len(others) and time.monotonic() < deadline:
                self._metrics_arrived.wait(deadline - time.monotonic())
            del self._gathering[token]
        return list(gathering)

    def metrics_arrived(self, token: int, families: Any) -> None:
        with self._metrics_arrived:
            gathering = self._gathering.get(token)
            if gathering is not None:
                gathering.append(families)
                self._metrics_arrived.notify_all()

    def _forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    @property
    def num_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def close(self) -> None:
        """Stops accepting, closes every connection (aborting its requests) and removes the socket's folder."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in connections:
            c.close()
        shutil.rmtree(self._folder, ignore_errors=True)
