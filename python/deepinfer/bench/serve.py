"""``deepinfer bench serve``: a load test of any OpenAI-compatible endpoint.

Requests arrive as a Poisson process at ``--request-rate`` (``inf``: all at once), each a prompt from a JSON prompt
set (``--dataset-name sharegpt``, the default) or made of random tokens (``--dataset-name random``, with
``--random-input-len`` / ``--random-output-len`` as vLLM names them: no file needed), streamed over server-sent events. It reports the figures vLLM's benchmark_serving
reports, under the same names, so numbers from either tool compare directly:

- TTFT: time to first token (first non-empty text chunk), per request;
- TPOT: time per output token after the first, (latency - TTFT) / (output tokens - 1), per request;
- ITL: inter-token latency, the gaps between successive text chunks, over all requests;
- E2EL: end-to-end latency per request;
- request, output-token and total-token throughput over the benchmark's duration; failed requests.

Token counts come from the server's ``usage`` (``stream_options.include_usage``); when a server sends none, the
output tokens are counted as text chunks. Percentiles are p50/p90/p99 (and whatever ``--percentiles`` lists).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp

from deepinfer.engine_args import finite_float

__all__ = ["add_bench_serve_arguments", "run_bench_serve", "load_prompts", "default_dataset", "random_requests",
           "BenchRequest", "main"]

SHAREGPT_RELATIVE = Path("..") / "shared" / "assets" / "prompts" / "sharegpt_v3_filtered_1000.json"


def default_dataset() -> Path | None:
    """The ShareGPT prompt set beside the repository (../shared/assets/prompts), if it is there."""
    candidates = [Path.cwd() / SHAREGPT_RELATIVE, Path(__file__).resolve().parents[3] / SHAREGPT_RELATIVE]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    return None


# ----------------------------------------------------------------------------------------------- prompts


def run_provenance() -> dict[str, Any]:
    """The commit and machine a result was measured from, as the GPU benchmark scripts record them: BENCH_COMMIT when
    given (a tree copied without .git), else git's HEAD of the checkout this package runs from, else "unknown"; the
    first GPU as nvidia-smi names it, or "cpu". The commit is the load generator's; a remote server's own build is
    whatever its /version says."""
    commit = os.environ.get("BENCH_COMMIT")
    if not commit:
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                                 capture_output=True, text=True, timeout=10)
            commit = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            commit = "unknown"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
        gpu = out.stdout.strip().splitlines()[0].strip() or "cpu"
    except (OSError, subprocess.SubprocessError, IndexError):
        gpu = "cpu"
    return {"commit": commit, "gpu": gpu, "cpus": os.cpu_count()}


def _prompt_of(item: Any) -> str | None:
    """The first user turn of one dataset entry, in any of the common layouts."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("prompt"), str):
        return item["prompt"]
    for key, role_key, text_key, roles in (("conversations", "from", "value", ("human", "user")),
                                           ("conversation", "role", "content", ("user", "human")),
                                           ("messages", "role", "content", ("user", "human"))):
        turns = item.get(key)
        if isinstance(turns, list):
            for turn in turns:
                if isinstance(turn, dict) and turn.get(role_key) in roles and isinstance(turn.get(text_key), str):
                    return turn[text_key]
    return None


def load_prompts(path: str | os.PathLike) -> list[str]:
    """Prompts from a JSON file (a list of strings, of {"prompt"}, of ShareGPT {"conversations"}, or of
    {"messages"}) or a JSON-lines file of such entries. Empty prompts are dropped."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("prompts", data.get("data", [data]))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of prompts")
    prompts = [p for p in (_prompt_of(item) for item in data) if p and p.strip()]
    if not prompts:
        raise ValueError(f"{path}: no prompts found (expected strings, {{'prompt'}}, {{'conversations'}} or "
                         "{'messages'} entries)")
    return prompts


def sample_prompts(prompts: list[str], num: int, seed: int, max_chars: int | None = None) -> list[str]:
    pool = [p for p in prompts if max_chars is None or len(p) <= max_chars]
    if not pool:
        raise ValueError(f"no prompt is at most {max_chars} characters long")
    rng = random.Random(seed)
    order = pool[:]
    rng.shuffle(order)
    return [order[i % len(order)] for i in range(num)]


@dataclass
class BenchRequest:
    prompt: str
    max_tokens: int  # output tokens to ask for


def _lengths(mean: int, range_ratio: float, num: int, rng: random.Random) -> list[int]:
    """num lengths drawn uniformly from [mean * (1 - ratio), mean * (1 + ratio)], at least 1 (vLLM's random set)."""
    low = max(1, math.floor(mean * (1.0 - range_ratio)))
    high = max(low, math.ceil(mean * (1.0 + range_ratio)))
    return [rng.randint(low, high) for _ in range(num)]


def random_requests(tokenizer: Any, num: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    seed: int = 0) -> list[BenchRequest]:
    """num prompts of about input_len tokens each, drawn uniformly from the tokenizer's non-special tokens, as text.

    Decoding random ids and encoding the text again does not give back the same count (tokens merge), so each
    prompt is decoded, re-encoded, cut to its length and decoded once more: close to the length asked for; the
    report counts what the server's usage says. Each request asks for its own output length (same range).
    """
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
    if not vocab:
        raise ValueError("the tokenizer has no ordinary tokens to draw random prompts from")
    requests = []
    for in_len, out_len in zip(_lengths(input_len, range_ratio, num, rng), _lengths(output_len, range_ratio, num, rng)):
        text = tokenizer.decode([rng.choice(vocab) for _ in range(in_len)])
        ids = tokenizer.encode(text, add_special_tokens=False)[:in_len]
        requests.append(BenchRequest(prompt=tokenizer.decode(ids), max_tokens=out_len))
    return requests


# ----------------------------------------------------------------------------------------------- one request


@dataclass
class RequestResult:
    success: bool = False
    prompt_len: int = 0          # tokens, from the server's usage (0 if it sent none)
    output_len: int = 0          # tokens (usage) or text chunks
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    generated_text: str = ""
    error: str = ""
    start_time: float = 0.0


def _chunk_text(data: dict[str, Any], endpoint: str) -> str:
    text = []
    for choice in data.get("choices") or []:
        if endpoint == "chat":
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "content"):
                if delta.get(key):
                    text.append(delta[key])
        elif choice.get("text"):
            text.append(choice["text"])
    return "".join(text)


def _sse_data(line: bytes) -> bytes | None:
    """The payload of a server-sent event's `data:` line (None for any other line)."""
    return line[5:].strip() if line.startswith(b"data:") else None


async def send_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any], endpoint: str,
                       headers: dict[str, str]) -> RequestResult:
    """One streamed request. The stream is read in whatever pieces arrive and split into lines here (no line-length
    limit: a chunk with many logprobs can be long); each text chunk's arrival is timed."""
    result = RequestResult()
    start = time.perf_counter()
    result.start_time = start
    last = start
    chunks = 0
    usage = None
    try:
        async with session.post(url, json=payload, headers=headers) as response:
            if response.status != 200:
                body = (await response.read()).decode("utf-8", errors="replace")
                result.error = f"HTTP {response.status}: {body[:300]}"
                return result
            pending, done = b"", False
            async for piece in response.content.iter_any():
                pending += piece
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    data_text = _sse_data(line)
                    if data_text is None:
                        continue
                    if data_text == b"[DONE]":
                        done = True
                        break
                    data = json.loads(data_text)
                    if "error" in data:
                        result.error = json.dumps(data["error"])[:300]
                        return result
                    if data.get("usage"):
                        usage = data["usage"]
                    text = _chunk_text(data, endpoint)
                    if not text:
                        continue
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
                    result.generated_text += text
                if done:
                    break
        result.latency = time.perf_counter() - start
        if usage:
            result.prompt_len = int(usage.get("prompt_tokens") or 0)
            result.output_len = int(usage.get("completion_tokens") or 0)
        else:
            result.output_len = chunks
        result.success = chunks > 0 or result.output_len > 0
        if not result.success:
            result.error = "the response carried no text"
    except Exception as e:  # connection refused, reset, timeout, bad JSON
        result.error = f"{type(e).__name__}: {e}"
    return result


# ----------------------------------------------------------------------------------------------- the benchmark


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    n = len(ms)
    mean = sum(ms) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in ms) / n) if n else 0.0
    out = {f"mean_{name}_ms": mean, f"median_{name}_ms": _percentile(ms, 50), f"std_{name}_ms": std}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = _percentile(ms, p)
    return out


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: Poisson (burstiness 1) or gamma-distributed gaps, all
    at 0 with an infinite rate. One schedule for any number of workers, so splitting the load changes nothing else."""
    if math.isinf(rate):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    theta = 1.0 / (rate * burstiness)
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out


async def _discover_model(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> str:
    async with session.get(f"{base_url}/v1/models", headers=headers) as response:
        response.raise_for_status()
        models = (await response.json()).get("data") or []
    if not models:
        raise ValueError("the server lists no models; pass --model")
    return models[0]["id"]


@dataclass
class _Target:
    """Where and how every worker sends: the endpoint's URL, the model, the request body's fixed fields."""
    url: str
    endpoint: str
    model: str
    headers: dict[str, str]
    timeout: float
    temperature: float
    top_p: float | None
    ignore_eos: bool

    def payload(self, request: BenchRequest, max_tokens: int | None = None) -> dict[str, Any]:
        tokens = request.max_tokens if max_tokens is None else max_tokens
        body: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                                "temperature": self.temperature}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
            body["max_completion_tokens"] = tokens
        else:
            body["prompt"] = request.prompt
            body["max_tokens"] = tokens
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.top_p is not None:
            body["top_p"] = self.top_p
        return body


def _client(timeout: float) -> aiohttp.ClientSession:
    """aiohttp (C-accelerated HTTP parsing): a streamed token costs the client a few times less than through httpx,
    which at tens of thousands of tokens a second decides whether the client or the server is measured."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 30.0)))


async def _send_scheduled(target: _Target, items: list[tuple[int, BenchRequest, float]], start_at: float,
                          max_concurrency: int | None, bar: Any = None) -> tuple[list[tuple[int, RequestResult]], float]:
    """Sends each (index, request, offset) at start_at + offset (time.perf_counter: the system's monotonic clock, the
    same in every process); returns the results by index and when the last one ended."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    async with _client(target.timeout) as client:

        async def one(index: int, request: BenchRequest) -> tuple[int, RequestResult]:
            async with slots:
                r = await send_request(client, target.url, target.payload(request), target.endpoint, target.headers)
            if bar is not None:
                bar.update(1)
            return index, r

        tasks = []
        for index, request, offset in items:
            delay = start_at + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index, request)))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter()


def _worker_main(conn: Any, target: _Target, items: list[tuple[int, BenchRequest, float]],
                 max_concurrency: int | None) -> None:
    """One load-generating process: says it is ready (its imports done), takes the common start time, sends its share
    of the schedule on its own event loop (and its own GIL), and sends back its results, or the error that ended it."""
    try:
        conn.send("ready")
        start_at = conn.recv()
        conn.send(("ok", asyncio.run(_send_scheduled(target, items, start_at, max_concurrency))))
    except BaseException as e:  # reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


async def _run_workers(target: _Target, schedule: list[tuple[int, BenchRequest, float]], workers: int,
                       max_concurrency: int | None) -> tuple[list[tuple[int, RequestResult]], float, float]:
    """The schedule dealt round-robin to `workers` processes (no more than --max-concurrency: benchmark() sees to
    it), which share the cap exactly; every one is ready before the common start time is chosen. Returns the results,
    the start and when the last request ended."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    caps = ([max_concurrency // workers + (w < max_concurrency % workers) for w in range(workers)] if max_concurrency
            else [None] * workers)
    loop = asyncio.get_running_loop()
    procs, conns = [], []
    try:
        for w in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, target, schedule[w::workers], caps[w]), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for conn in conns:
            if await loop.run_in_executor(None, conn.recv) != "ready":
                raise RuntimeError("a load-generating worker did not start")
        start = time.perf_counter() + 0.05
        for conn in conns:
            conn.send(start)
        replies = await asyncio.gather(*(loop.run_in_executor(None, conn.recv) for conn in conns))
    except EOFError as e:
        raise RuntimeError("a load-generating worker exited without its results") from e
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [detail for status, detail in replies if status != "ok"]
    if errors:
        raise RuntimeError(f"a load-generating worker failed: {errors[0]}")
    results = [pair for _, (share, _) in replies for pair in share]
    return results, start, max(end for _, (_, end) in replies)


async def benchmark(args: argparse.Namespace, requests: list[BenchRequest] | list[str]) -> dict[str, Any]:
    """Runs the load test. ``requests``: BenchRequests, or prompts that each ask for ``args.max_tokens``.

    With ``args.num_workers`` > 1 the requests are dealt round-robin to that many processes, each with its own event
    loop and HTTP client, on the one arrival schedule: at high token rates a single Python client spends more time
    parsing server-sent events than the server takes to send them, and then measures itself."""
    requests = [r if isinstance(r, BenchRequest) else BenchRequest(prompt=r, max_tokens=args.max_tokens)
                for r in requests]
    base_url = args.base_url.rstrip("/")
    if base_url.endswith("/v1"):
        base_url = base_url[:-3]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with _client(args.timeout) as client:
        model = args.model or await _discover_model(client, base_url, headers)
        url = f"{base_url}/v1/chat/completions" if args.endpoint == "chat" else f"{base_url}/v1/completions"
        target = _Target(url, args.endpoint, model, headers, args.timeout, args.temperature, args.top_p,
                         args.ignore_eos)
        if args.warmup:
            warm = await send_request(client, url, target.payload(requests[0], max_tokens=1), args.endpoint, headers)
            if not warm.success:
                raise RuntimeError(f"the warm-up request failed: {warm.error}")

    offsets = arrival_offsets(len(requests), args.request_rate, args.burstiness, args.seed)
    schedule = [(i, r, t) for i, (r, t) in enumerate(zip(requests, offsets))]
    # No more workers than requests, nor than the concurrency cap allows (each needs one slot of it).
    workers = max(1, min(getattr(args, "num_workers", 1), len(schedule), args.max_concurrency or len(schedule)))
    if workers == 1:
        bar = None
        if not args.disable_tqdm:
            try:
                from tqdm import tqdm

                bar = tqdm(total=len(requests), desc="requests", unit="req", file=sys.stderr)
            except ImportError:  # pragma: no cover
                bar = None
        start = time.perf_counter()
        results, end = await _send_scheduled(target, schedule, start, args.max_concurrency, bar)
        if bar is not None:
            bar.close()
    else:
        results, start, end = await _run_workers(target, schedule, workers, args.max_concurrency)
    results.sort(key=lambda pair: pair[0])
    out = summarize(args, model, [r for _, r in results], end - start)
    out["num_workers"] = workers
    return out


def summarize(args: argparse.Namespace, model: str, results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    percentiles = sorted(set([50.0, 90.0, 99.0] + [float(p) for p in args.percentiles]))
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(r.output_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    errors = [r.error for r in results if not r.success]
    out: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": "openai-chat" if args.endpoint == "chat" else "openai",
        "endpoint": args.endpoint,
        "base_url": args.base_url,
        "model_id": model,
        "num_prompts": len(results),
        "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "max_tokens": args.max_tokens,
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "input_throughput": total_input / duration if duration > 0 else 0.0,
        "output_throughput": total_output / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration if duration > 0 else 0.0,
    }
    out.update(_stats("ttft", [r.ttft for r in ok], percentiles))
    out.update(_stats("tpot", tpots, percentiles))
    out.update(_stats("itl", [x for r in ok for x in r.itl], percentiles))
    out.update(_stats("e2el", [r.latency for r in ok], percentiles))
    out["input_lens"] = [r.prompt_len for r in results]
    out["output_lens"] = [r.output_len for r in results]
    out["ttfts"] = [r.ttft for r in results]
    out["errors"] = errors
    if args.save_detailed:  # large: every gap of every request, and the texts
        out["itls"] = [r.itl for r in results]
        out["generated_texts"] = [r.generated_text for r in results]
    return out


def format_report(result: dict[str, Any], percentiles: list[float]) -> str:
    ps = sorted(set([50.0, 90.0, 99.0] + [float(p) for p in percentiles]))
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label: str, value: Any) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<48}{text:>12}")

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"])
    row("Input token throughput (tok/s):", result["input_throughput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Total Token throughput (tok/s):", result["total_token_throughput"])
    for key, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append("{s:{c}^60}".format(s=f" {title} ", c="-"))
        row(f"Mean {key.upper()} (ms):", result[f"mean_{key}_ms"])
        row(f"Median {key.upper()} (ms):", result[f"median_{key}_ms"])
        for p in ps:
            row(f"P{p:g} {key.upper()} (ms):", result[f"p{p:g}_{key}_ms"])
    lines.append("=" * 60)
    if result["errors"]:
        lines.append(f"first error: {result['errors'][0]}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- CLI


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:  # also refuses NaN (every comparison with it is false); inf means all at once
        raise argparse.ArgumentTypeError(f"the request rate must be > 0 (or inf), got {text}")
    return value


def add_bench_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000",
                        help="the server's root URL (a trailing /v1 is accepted); default %(default)s")
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                        help="/v1/completions or /v1/chat/completions (default %(default)s)")
    parser.add_argument("--model", default=None, help="model name to request (default: the first of /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--dataset-name", choices=["sharegpt", "random"], default="sharegpt",
                        help="sharegpt: prompts from a JSON file (--dataset); random: prompts of random tokens "
                             "(--random-input-len, --random-output-len), no file needed (default %(default)s)")
    parser.add_argument("--dataset", "--dataset-path", dest="dataset", default=None,
                        help="JSON prompt set for --dataset-name sharegpt (default: ShareGPT from "
                             "../shared/assets/prompts when present)")
    parser.add_argument("--random-input-len", type=int, default=1024,
                        help="--dataset-name random: prompt tokens per request (default %(default)s)")
    parser.add_argument("--random-output-len", type=int, default=None,
                        help="--dataset-name random: output tokens per request (default: --max-tokens)")
    parser.add_argument("--random-range-ratio", type=finite_float, default=0.0,
                        help="--dataset-name random: lengths drawn uniformly from len x [1 - r, 1 + r], "
                             "0 <= r < 1 (default %(default)s: every request the same)")
    parser.add_argument("--tokenizer", default=None, metavar="PATH",
                        help="--dataset-name random: the served model's directory (its tokenizer.json makes the "
                             "prompts, so --random-input-len counts its tokens); default: DeepSeek-V3's tokenizer")
    parser.add_argument("--num-prompts", type=int, default=200, help="requests to send (default %(default)s)")
    parser.add_argument("--request-rate", type=_rate, default=math.inf,
                        help="mean requests per second, Poisson arrivals; inf sends all at once (default inf)")
    parser.add_argument("--burstiness", type=finite_float, default=1.0,
                        help="gamma shape of the inter-arrival times: 1 = Poisson, <1 burstier (default 1)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    parser.add_argument("--num-workers", type=int, default=1,
                        help="load-generating processes, the requests dealt among them on one arrival schedule: a "
                             "single Python client tops out at some tens of thousands of streamed tokens a second "
                             "(default %(default)s; no progress bar above 1); --max-concurrency is shared among them")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default %(default)s)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="send ignore_eos (a vLLM/SGLang/DeepInfer extension) so every output is --max-tokens long")
    parser.add_argument("--temperature", type=finite_float, default=0.0, help="(default 0: greedy)")
    parser.add_argument("--top-p", type=finite_float, default=None)
    parser.add_argument("--max-prompt-chars", type=int, default=None,
                        help="skip prompts longer than this many characters (keeps prompts within a short context)")
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling and arrival times (default 0)")
    parser.add_argument("--timeout", type=finite_float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--percentiles", type=finite_float, nargs="*", default=[],
                        help="extra percentiles to report beside 50, 90 and 99")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the one-token warm-up request")
    parser.add_argument("--save-result", metavar="FILE.json", default=None, help="write every figure as JSON")
    parser.add_argument("--save-detailed", action="store_true",
                        help="also save every request's inter-token gaps and generated text")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return parser


def run_bench_serve(args: argparse.Namespace) -> int:
    prog = "deepinfer bench serve"
    if args.num_prompts < 1 or args.max_tokens < 1 or args.num_workers < 1:
        print(f"{prog}: error: --num-prompts, --max-tokens and --num-workers must be >= 1", file=sys.stderr)
        return 2
    try:
        requests, source = _bench_requests(args)
    except (OSError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
    print(f"{len(requests)} prompts from {source}, request rate {rate}/s, {args.endpoint} at {args.base_url}",
          file=sys.stderr)
    try:
        result = asyncio.run(benchmark(args, requests))
    except (aiohttp.ClientError, ValueError, RuntimeError, OSError) as e:
        print(f"{prog}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    result["dataset_name"] = args.dataset_name
    if args.dataset_name == "random":
        result["dataset"] = source
        result["random_input_len"] = args.random_input_len
        result["random_output_len"] = args.random_output_len or args.max_tokens
        result["random_range_ratio"] = args.random_range_ratio
    else:
        result["dataset"] = args.dataset or str(SHAREGPT_RELATIVE)
    result["command"] = _command_line(args)
    result.update(run_provenance())
    print(format_report(result, args.percentiles))
    if args.save_result:
        path = Path(args.save_result)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved {path}", file=sys.stderr)
    return 0 if result["completed"] > 0 else 1


def _bench_requests(args: argparse.Namespace) -> tuple[list[BenchRequest], str]:
    """The requests to send and where their prompts come from. Raises ValueError naming the option at fault."""
    if args.dataset_name == "random":
        if args.dataset:
            raise ValueError("--dataset is a prompt file for --dataset-name sharegpt; --dataset-name random makes "
                             "its prompts (drop one of the two)")
        output_len = args.random_output_len if args.random_output_len is not None else args.max_tokens
        if args.random_input_len < 1 or output_len < 1:
            raise ValueError(f"--random-input-len and --random-output-len must be >= 1, got {args.random_input_len} "
                             f"and {output_len}")
        if not 0.0 <= args.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
        from deepinfer.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(args.tokenizer) if args.tokenizer else Tokenizer.default_deepseek_v3()
        requests = random_requests(tokenizer, args.num_prompts, args.random_input_len, output_len,
                                   args.random_range_ratio, args.seed)
        return requests, f"random tokens (~{args.random_input_len} in, {output_len} out)"
    dataset = Path(args.dataset) if args.dataset else default_dataset()
    if dataset is None:
        raise ValueError(f"no --dataset given and the ShareGPT prompts ({SHAREGPT_RELATIVE}) are not there; "
                         "give --dataset FILE, or --dataset-name random")
    prompts = sample_prompts(load_prompts(dataset), args.num_prompts, args.seed, args.max_prompt_chars)
    return [BenchRequest(prompt=p, max_tokens=args.max_tokens) for p in prompts], str(dataset)


def _command_line(args: argparse.Namespace) -> str:
    argv = getattr(args, "_argv", None)
    if argv is None:
        argv = sys.argv[1:]
        if argv[:2] == ["bench", "serve"]:
            argv = argv[2:]
    return shlex.join(["deepinfer", "bench", "serve", *argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deepinfer bench serve", description=__doc__.split("\n\n")[0])
    add_bench_serve_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args._argv = argv
    return run_bench_serve(args)


if __name__ == "__main__":
    sys.exit(main())
