"""The Python work a generated token costs between the C++ engine and its consumer, without the model: how many
tokens a second the engine's dispatcher (detokenization, stop strings, the delta objects) and the hand-off to the
consumer can move, on this machine's CPU.

The C++ core is replaced by synthetic step outputs (one new token for each of --streams requests a step, tokens of
ShareGPT text under DeepSeek-V3's tokenizer), handed to the engine's dispatcher as the core's are. `--path sync`:
the streams are iterated synchronously (a `submit()` consumer); `--path generate`: generate()'s streams, only waited
on (no delta is made or queued); `--path asyncio`: the dispatcher runs in its thread and an
event loop in another consumes every stream as the server does (RequestStream.forward_to into a queue a request),
the server's path up to its HTTP layer, both on one GIL as in `deepinfer serve`; `--path server`: the whole server
in-process, every stream a streamed POST /v1/completions through the real ASGI app (its chunks, JSON, server-sent
events and metrics), the app's sends counted instead of written to a socket (the HTTP server's own framing and
socket writes are not included); `--path link`: the engine process of `deepinfer serve --api-server-count N`, every
stream's deltas handed to one API server's connection (server/engine_host.py: its writer thread packs and pickles a
step's deltas into one frame on a Unix socket), the frames read and unpickled by another process (not counted).
`--path http`: `--path server` behind a real uvicorn server on a local port (its HTTP protocol: `--http h11`, pure
Python, or `httptools`, C; framing and socket writes included), every stream a streamed request of an aiohttp client
in another process (not counted). Reports microseconds of Python per token: what bounds a server's output tok/s.

    python benchmarks/serve/dispatch_bench.py --streams 1000 --tokens 64 --path asyncio
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
from deepinfer.tokenizer import Tokenizer


def step_outputs(core_ids: list[int], texts: list[list[int]], step: int, last: bool) -> list[SimpleNamespace]:
    """What the core's wait_outputs returns for one decode step: a new token for every request."""
    return [SimpleNamespace(request_id=cid, new_token_ids=[ids[step % len(ids)]], finished=last,
                            finish_reason="length" if last else "", error="", logprobs=[], prompt_logprobs=[],
                            num_preemptions=0, num_cached_tokens=0)
            for cid, ids in zip(core_ids, texts)]


def token_texts(streams: int) -> list[list[int]]:
    tok = Tokenizer.default_deepseek_v3()
    data = json.loads(Path(__file__).resolve().parents[2].joinpath(".data", "sharegpt_v3_filtered_1000.json")
                      .read_text()) if Path(".data/sharegpt_v3_filtered_1000.json").exists() else None
    texts = [(item.get("conversations") or [{}])[-1].get("value", "") for item in (data or [])] or \
        ["The quick brown fox jumps over the lazy dog, again and again, in every language: ünïcödé, 日本語, emoji 🙂."]
    return [tok.encode(texts[i % len(texts)], add_special_tokens=False)[:512] or [100] for i in range(streams)]


def register(engine: DeepInferenceEngine, n: int, params: SamplingParams, loop, iterated: bool = True) -> list:
    """n requests registered with the dispatcher as _enqueue registers them, with no request in the core."""
    from deepinfer.engine import RequestStream, _Completion

    streams = []
    for i in range(n):
        stream = RequestStream(engine, f"bench-{i}", None, [1, 2, 3], params, loop, iterated)
        core_id = 10_000_000 + i
        completion = _Completion(0, core_id, engine.tokenizer, [1, 2, 3], params)
        stream.completions.append(completion)
        engine._by_core_id[core_id] = (stream, completion)
        streams.append(stream)
    return streams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=64, help="tokens a stream (steps)")
    ap.add_argument("--path", choices=["sync", "generate", "asyncio", "server", "link", "http"], default="asyncio")
    ap.add_argument("--http", choices=["h11", "httptools"], default="h11", help="--path http: uvicorn's protocol")
    ap.add_argument("--step-ms", type=float, default=5.0, help="--path http: the synthetic engine's step time")
    ap.add_argument("--stop", action="store_true", help="give every request two stop strings")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    engine = DeepInferenceEngine(EngineConfig(device="cpu"))
    engine.tokenizer = Tokenizer.default_deepseek_v3()
    engine._abort_core = lambda core_id: None  # nothing runs in the core
    texts = token_texts(args.streams)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True,
                            stop=["\n\nUser:", "<|stop|>"] if args.stop else None)
    runs, cpu = [], []
    for _ in range(args.repeat):
        run = {"asyncio": run_asyncio, "server": run_server, "link": run_link, "http": run_http}.get(args.path,
                                                                                                    run_sync)
        cpu_start = time.process_time()
        result = run(engine, params, texts, args)
        # A run may time its own CPU (without its setup): (wall s, CPU s).
        wall, run_cpu = result if isinstance(result, tuple) else (result, time.process_time() - cpu_start)
        runs.append(wall)
        cpu.append(run_cpu)
    best = min(runs)
    total = args.streams * args.tokens
    # Wall time bounds the tok/s; the process's CPU time (every thread, less the waits for the GIL) moves less with
    # the machine's other load, so it is the figure to compare changes by. Both include the synthetic outputs.
    http = {"http": args.http, "step_ms": args.step_ms} if args.path == "http" else {}
    print(json.dumps({"path": args.path, **http, "streams": args.streams, "tokens": args.tokens,
                      "stop_strings": args.stop, "seconds": [round(r, 3) for r in runs], "us_per_token": round(1e6 * best / total, 2),
                      "cpu_us_per_token": round(1e6 * min(cpu) / total, 2), "tokens_per_s": round(total / best)}))
    engine.shutdown()
    return 0


def run_sync(engine, params, texts, args) -> float:
    """`sync`: a consumer iterates every stream (takes out each step's deltas); `generate`: generate()'s streams,
    which are only waited on and keep no deltas."""
    iterated = args.path == "sync"
    streams = register(engine, args.streams, params, None, iterated)
    core_ids = [s.completions[0].core_id for s in streams]
    start = time.perf_counter()
    for step in range(args.tokens):
        engine._dispatch(step_outputs(core_ids, texts, step, step == args.tokens - 1))
        for s in streams if iterated else ():
            while not s._sync_queue.empty():
                s._sync_queue.get_nowait()
    elapsed = time.perf_counter() - start
    assert all(s.result(timeout=0).outputs[0].token_ids for s in streams)
    return elapsed


def run_asyncio(engine, params, texts, args) -> float:
    import threading

    loop = asyncio.new_event_loop()
    streams = register(engine, args.streams, params, loop)
    core_ids = [s.completions[0].core_id for s in streams]
    received = [0]

    async def consume(s) -> None:  # as the server reads a request: its stream forwarded into the run's queue
        q: asyncio.Queue = asyncio.Queue()
        s.forward_to(q, 0)
        while True:
            _, delta = await q.get()
            if delta is None:
                return
            received[0] += len(delta.outputs[0].token_ids)

    async def consume_all() -> None:
        await asyncio.gather(*(consume(s) for s in streams))

    ready = threading.Event()
    loop.call_soon(ready.set)
    consumer = threading.Thread(target=loop.run_until_complete, args=(consume_all(),))
    consumer.start()
    ready.wait()
    start = time.perf_counter()
    for step in range(args.tokens):
        engine._dispatch(step_outputs(core_ids, texts, step, step == args.tokens - 1))
    consumer.join()
    elapsed = time.perf_counter() - start
    loop.close()
    assert received[0] == args.streams * args.tokens, received[0]
    return elapsed


def _drain_link(sock, expected_tokens: int, report) -> None:
    """The API server's end (another process): reads and unpickles the frames until every token has come."""
    from deepinfer.server.engine_link import recv_message

    tokens = 0
    while tokens < expected_tokens:
        message = recv_message(sock)
        if message is None:
            break
        if message[0] == "out":
            tokens += sum(len(packed[2]) for _, packed in message[1] if packed is not None)
    report.send(tokens)


def run_link(engine, params, texts, args) -> float:
    """The streams' sink is a real engine_host connection; its frames go to another process."""
    import multiprocessing
    import socket
    from types import SimpleNamespace

    from deepinfer.engine import RequestStream, _Completion
    from deepinfer.server.engine_host import _Connection

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    report, report_child = multiprocessing.get_context("fork").Pipe()
    total = args.streams * args.tokens
    reader = multiprocessing.get_context("fork").Process(target=_drain_link, args=(theirs, total, report_child))
    reader.start()
    theirs.close()
    connection = _Connection(SimpleNamespace(engine=engine, _forget=lambda _: None), ours, "bench")
    streams = []
    for i in range(args.streams):
        stream = RequestStream(engine, f"bench-{i}", None, [1, 2, 3], params, None, True, connection)
        core_id = 30_000_000 + i
        completion = _Completion(0, core_id, engine.tokenizer, [1, 2, 3], params)
        stream.completions.append(completion)
        engine._by_core_id[core_id] = (stream, completion)
        streams.append(stream)
    core_ids = [s.completions[0].core_id for s in streams]
    start = time.perf_counter()
    for step in range(args.tokens):
        engine._dispatch(step_outputs(core_ids, texts, step, step == args.tokens - 1))
    received = report.recv()
    elapsed = time.perf_counter() - start
    reader.join()
    connection.close()
    assert received == total, (received, total)
    return elapsed


def stub_submit(engine, first_core_id: int, streams: int):
    """Replaces the engine's submit (until `del engine.submit`) by one that registers each stream with the dispatcher
    without a core, as register() does: (the core ids in submission order, an event set once `streams` are in)."""
    import threading

    from deepinfer.engine import RequestStream, _Completion

    core_ids: list[int] = []
    all_submitted = threading.Event()

    def submit(prompt, sampling, *, loop=None, request_id=None):
        stream = RequestStream(engine, request_id, None, prompt["prompt_token_ids"], sampling, loop, True)
        core_id = first_core_id + len(core_ids)
        completion = _Completion(0, core_id, engine.tokenizer, prompt["prompt_token_ids"], sampling)
        stream.completions.append(completion)
        engine._by_core_id[core_id] = (stream, completion)
        core_ids.append(core_id)
        if len(core_ids) == streams:
            all_submitted.set()
        return stream

    engine.submit = submit
    return core_ids, all_submitted


def run_server(engine, params, texts, args) -> float:
    """Every stream one streamed /v1/completions request into the real ASGI app, on an event loop in its own thread;
    the engine's submit registers the stream with the dispatcher without a core (as register() does)."""
    import threading

    from deepinfer.server.app import create_app

    core_ids, all_submitted = stub_submit(engine, 20_000_000, args.streams)
    app = create_app(engine, max_queue=args.streams + 1)
    body = json.dumps({"model": engine.served_model_name, "prompt": [1, 2, 3], "max_tokens": args.tokens,
                       "ignore_eos": True, "stream": True, "temperature": 0,
                       **({"stop": params.stop} if params.stop else {})}).encode()
    events = [0]

    async def one_request() -> None:
        sent_body = [False]
        never = asyncio.Event()

        async def receive():
            if not sent_body[0]:
                sent_body[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the client stays connected
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body":
                events[0] += message.get("body", b"").count(b"data: ")

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
        await app(scope, receive, send)

    loop = asyncio.new_event_loop()

    async def serve_all() -> None:
        await asyncio.gather(*(one_request() for _ in range(args.streams)))

    server = threading.Thread(target=loop.run_until_complete, args=(serve_all(),))
    server.start()
    all_submitted.wait()
    start = time.perf_counter()
    for step in range(args.tokens):
        engine._dispatch(step_outputs(core_ids, texts, step, step == args.tokens - 1))
    server.join()
    elapsed = time.perf_counter() - start
    loop.close()
    del engine.submit
    # Each stream: its token chunks (several may share one send) and [DONE].
    assert events[0] >= args.streams * (args.tokens + 1) - args.streams, events[0]
    return elapsed


def _http_clients(port: int, model: str, streams: int, tokens: int, report) -> None:
    """Another process: `streams` streamed completions at once through aiohttp; reports (tokens, text events) read:
    the tokens by the usage chunk, the events those that carry text (a server behind its engine sends several
    tokens in one)."""
    import aiohttp

    async def one(session) -> tuple[int, int]:
        body = {"model": model, "prompt": [1, 2, 3], "max_tokens": tokens, "ignore_eos": True, "stream": True,
                "temperature": 0, "stream_options": {"include_usage": True}}
        events, used = 0, 0
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
                elif chunk["choices"]:
                    events += 1
        return used, events

    async def run() -> tuple[int, int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            results = await asyncio.gather(*(one(session) for _ in range(streams)))
        return sum(t for t, _ in results), sum(e for _, e in results)

    report.send(asyncio.run(run()))


def run_http(engine, params, texts, args) -> float:
    """run_server's app behind uvicorn on a local port, the clients in another process; the synthetic steps come
    every --step-ms (the dispatcher's own time counted in it)."""
    import multiprocessing
    import socket
    import threading

    import uvicorn

    from deepinfer.server.app import create_app

    core_ids, all_submitted = stub_submit(engine, 40_000_000, args.streams)
    app = create_app(engine, max_queue=args.streams + 1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=args.http, loop="asyncio", log_level="warning", access_log=False,
                            lifespan="off", backlog=4096)
    server = uvicorn.Server(config)
    serving = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    serving.start()
    while not server.started:
        time.sleep(0.01)
    report, report_child = multiprocessing.get_context("spawn").Pipe()
    clients = multiprocessing.get_context("spawn").Process(
        target=_http_clients, args=(port, engine.served_model_name, args.streams, args.tokens, report_child))
    clients.start()
    all_submitted.wait()
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(args.tokens):
        due = start + step * args.step_ms / 1e3
        time.sleep(max(0.0, due - time.perf_counter()))
        engine._dispatch(step_outputs(core_ids, texts, step, step == args.tokens - 1))
    received, events = report.recv()
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"{args.http}: {events / received:.3f} text events a token (1: none merged)", file=sys.stderr)
    clients.join()
    server.should_exit = True
    serving.join(timeout=10)
    del engine.submit
    assert received == args.streams * args.tokens, (received, args.streams * args.tokens)
    return elapsed, cpu_s


if __name__ == "__main__":
    sys.exit(main())
