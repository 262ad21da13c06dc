"""`deepinfer serve --api-server-count N`: the engine process's link (engine_host.py) and a server process's proxy
(engine_proxy.py) on a real engine, the metrics sum, and the processes' lifecycle. The whole OpenAI suite also runs
against two server processes (test_server.py's `api-servers-2` cases)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from conftest import require_module

httpx = require_module("httpx")
require_module("fastapi")
require_module("uvicorn")
prometheus_client = require_module("prometheus_client")

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams  # noqa: E402
from deepinfer.server.engine_host import EngineHost  # noqa: E402
from deepinfer.server.engine_link import EngineQueueFull  # noqa: E402
from deepinfer.server.engine_proxy import EngineProxy  # noqa: E402
from deepinfer.server.metrics import sum_families  # noqa: E402
from test_server import ServerProcess, serve_env  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    e = DeepInferenceEngine(EngineConfig(max_model_len=512, max_num_seqs=4))
    yield e
    e.shutdown()


async def _collect(stream) -> dict[int, tuple[str, list[int], str | None]]:
    """Each completion's text, token ids and finish reason, by its index."""
    got: dict[int, tuple[str, list[int], str | None]] = {}
    async for delta in stream:
        for out in delta.outputs:
            text, ids, reason = got.get(out.index, ("", [], None))
            got[out.index] = (text + out.text, ids + out.token_ids, out.finish_reason or reason)
    return got


def _wait_idle(engine, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s.num_running == 0 and s.num_waiting == 0 and s.num_free_cache_pages == s.num_cache_pages:
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine did not become idle: {engine.stats()}")


def test_proxy_streams_equal_the_engine(engine):
    """Greedy outputs through the link are the engine's own, token for token and character for character, for
    several requests at once and n > 1; the proxy knows the engine's facts."""
    prompts = ["ROMEO:", "First Citizen:\nBefore we proceed", "KING HENRY:"]
    params = SamplingParams(max_tokens=24, temperature=0.0, n=2)
    want = engine.generate(prompts, params)
    host = EngineHost(engine, {}, {})
    try:
        proxy = EngineProxy(host.path)
        proxy.connect()
        assert proxy.max_model_len == engine.max_model_len
        assert proxy.model_config.vocab_size == engine.model_config.vocab_size
        assert proxy.tokenizer.encode("ROMEO:") == engine.tokenizer.encode("ROMEO:")

        async def main():
            await proxy.start()
            streams = [await proxy.submit_async(engine.tokenizer.encode(p), params, request_id=f"r{i}", max_waiting=64)
                       for i, p in enumerate(prompts)]
            got = await asyncio.gather(*(_collect(s) for s in streams))
            proxy.shutdown()
            return got

        got = asyncio.run(main())
        for out, completions in zip(want, got):
            assert sorted(completions) == [0, 1]
            for c in out.outputs:
                assert completions[c.index] == (c.text, c.token_ids, "length")
    finally:
        host.close()
    _wait_idle(engine)


def test_refusals_and_a_gone_server_free_their_requests(engine):
    """A bad request is refused with the engine's ValueError and a full queue with EngineQueueFull, nothing queued;
    a server process that goes away has its running requests aborted (every cache page free again)."""
    host = EngineHost(engine, {}, {})
    try:
        proxy = EngineProxy(host.path)
        proxy.connect()
        long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

        async def main():
            await proxy.start()
            with pytest.raises(ValueError, match="outside the vocabulary"):
                await proxy.submit_async([10 ** 9], long, request_id="bad", max_waiting=64)
            full = await proxy.submit_async([1, 2, 3], SamplingParams(n=3), request_id="full", max_waiting=2)
            assert isinstance(full, EngineQueueFull) and full.waiting == 0
            stream = await proxy.submit_async(engine.tokenizer.encode("ROMEO:"), long, request_id="long",
                                              max_waiting=64)
            async for _ in stream:  # the first delta: it runs
                break
            assert engine.stats().num_running == 1
            proxy.shutdown()  # the server process's link closes with the request in flight
            await asyncio.sleep(0.2)

        asyncio.run(main())
        _wait_idle(engine)
        assert host.num_connections == 0
    finally:
        host.close()


def test_the_queue_limit_counts_sequences_in_prefill_across_servers():
    """The engine process counts, over every server process, the sequences that have produced nothing yet: a request
    in prefill holds its place in the queue (as in one process), which the engine's waiting count alone gives back as
    soon as the scheduler starts it. Places come back with the first tokens."""
    # Prefill in chunks of 32 tokens: a 450-token prompt runs for 15 steps before its first token.
    engine = DeepInferenceEngine(EngineConfig(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=32))
    host = EngineHost(engine, {}, {})
    try:
        proxies = [EngineProxy(host.path), EngineProxy(host.path)]
        prompt = [5 + i % 50 for i in range(450)]
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

        async def main():
            for p in proxies:
                p.connect()
                await p.start()
            first = await proxies[0].submit_async(prompt, params, request_id="a", max_waiting=2)
            while engine.stats().num_running == 0:  # the scheduler took it: it waits no more, its prefill runs
                await asyncio.sleep(0.001)
            second = await proxies[1].submit_async(prompt, params, request_id="b", max_waiting=2)
            third = await proxies[0].submit_async(prompt, params, request_id="c", max_waiting=2)
            assert not isinstance(first, EngineQueueFull) and not isinstance(second, EngineQueueFull)
            assert isinstance(third, EngineQueueFull) and third.waiting == 2
            await asyncio.gather(_collect(first), _collect(second))
            assert host.pending.count == 0
            again = await proxies[1].submit_async(prompt, params, request_id="d", max_waiting=2)
            assert not isinstance(again, EngineQueueFull)
            await _collect(again)
            for p in proxies:
                p.shutdown()

        asyncio.run(main())
        assert host.pending.count == 0
    finally:
        host.close()
        engine.shutdown()


def test_sum_families_adds_processes_as_prometheus_would():
    """Two processes' request metrics summed equal one registry that saw both processes' observations."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    def registry(observations):
        r = CollectorRegistry()
        c = Counter("req_finished", "doc", ["reason"], registry=r)
        h = Histogram("ttft_seconds", "doc", buckets=(0.1, 1.0), registry=r)
        for reason, seconds in observations:
            c.labels(reason).inc()
            h.observe(seconds)
        return r

    a = [("stop", 0.05), ("length", 0.5)]
    b = [("stop", 2.0), ("abort", 0.2), ("stop", 0.01)]
    summed = sum_families([list(registry(a).collect()), list(registry(b).collect())])

    class Static:
        def collect(self):
            return summed

    merged = CollectorRegistry(auto_describe=False)
    merged.register(Static())

    def values(text: str) -> dict:
        from prometheus_client.parser import text_string_to_metric_families
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples if not s.name.endswith("_created")}

    assert values(generate_latest(merged).decode()) == values(generate_latest(registry(a + b)).decode())


def test_bad_api_server_count_fails_before_loading():
    p = subprocess.run([sys.executable, "-m", "deepinfer.cli", "serve", "--api-server-count", "0"],
                       capture_output=True, text=True, timeout=60, env=serve_env())
    assert p.returncode == 2 and "api_server_count must be an integer >= 1" in p.stderr, p.stderr
    assert "resident weights" not in p.stderr


def _server_processes(parent: int) -> list[int]:
    """The API server processes that the engine process ``parent`` started."""
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"deepinfer.server.api_servers" in cmdline:
            out.append(int(stat.parent.name))
    return out


def test_a_killed_server_process_stops_the_others():
    """A server process that dies takes the service down with exit status 1, naming it, rather than leaving a
    server that answers only some connections."""
    srv = ServerProcess("--max-model-len", "256", "--api-server-count", "2")
    try:
        srv.wait_ready()
        children = _server_processes(srv.proc.pid)
        assert len(children) == 2, srv.output()
        subprocess.run(["kill", "-KILL", str(children[0])], check=True)
        assert srv.proc.wait(30) == 1, srv.output()
        assert "ended (exit status -9): stopping the others" in srv.output(), srv.output()
        assert _server_processes(srv.proc.pid) == []
    finally:
        srv.stop()
