"""What the HTTP server costs: the same prompts through the engine directly and through `deepinfer serve`.

Runs the sampled ShareGPT prompts offline (DeepInferenceEngine.generate, everything submitted at once), then starts
`deepinfer serve` with the same engine settings and sends the same prompts with `deepinfer bench serve` at an
infinite request rate (streaming, one HTTP connection per request). Both runs generate exactly --max-tokens tokens
per request (ignore_eos), so the durations compare directly. --client-workers 1 4 sends them once with one
load-generating process and once with four, against the same server: at tens of thousands of tokens a second one
Python client's parsing of the event stream is itself a limit, and the two runs tell its share from the server's.

    python benchmarks/serve/overhead.py --num-prompts 200 --max-tokens 128 --repeat 3 --save-result overhead.json

With --shape (v2-lite, v3-slice: benchmarks/gpu/bench_common.py) both sides load that shape's config with random
weights (load_format dummy) and DeepSeek-V3's tokenizer, on --device, batching up to --max-num-seqs sequences:

    python benchmarks/serve/overhead.py --shape v2-lite --device cuda --num-prompts 1000 --max-tokens 256 \
        --max-model-len 4096 --max-prompt-chars 8000 --max-num-seqs 1024 --repeat 1 --save-result overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from deepinfer import DeepInferenceEngine, EngineConfig
from deepinfer.bench.serve import default_dataset, load_prompts, main as bench_main, run_provenance, sample_prompts


def engine_settings(args: argparse.Namespace, model_dir: str | None) -> dict:
    """EngineConfig fields both sides use (the demo model by default)."""
    settings = {"max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs, "device": args.device}
    if model_dir is not None:
        settings.update(model_name_or_path=model_dir, load_format="dummy")
    return settings


def serve_flags(settings: dict) -> list[str]:
    flags = []
    for key, value in settings.items():
        flags += ["--model" if key == "model_name_or_path" else "--" + key.replace("_", "-"), str(value)]
    return flags


def offline(prompts: list[str], max_tokens: int, settings: dict) -> dict:
    engine = DeepInferenceEngine(EngineConfig(**settings))
    try:
        engine.generate(prompts[0], max_tokens=1)  # warm-up
        start = time.perf_counter()
        outs = engine.generate(prompts, max_tokens=max_tokens, ignore_eos=True, temperature=0.0, use_tqdm=False)
        duration = time.perf_counter() - start
    finally:
        engine.shutdown()
    ttfts = sorted(o.ttft_s for o in outs)
    return {"duration": duration, "output_throughput": len(prompts) * max_tokens / duration,
            "median_ttft_ms": 1000 * ttfts[len(ttfts) // 2]}


def engine_counters(base: str) -> dict[str, float]:
    """The engine's step counters from the server's /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        for name in ("deepinfer_engine_steps_total", "deepinfer_engine_step_seconds_total",
                     "deepinfer_engine_decode_steps_total", "deepinfer_engine_decode_step_seconds_total"):
            if line.startswith(name + "{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def served(prompts_file: str, num: int, max_tokens: int, settings: dict, max_chars: int,
           client_workers: list[int], api_servers: int, concurrencies: list[int], prompts_per_stream: int) -> list[dict]:
    """One server start (with `api_servers` HTTP processes), then the same requests once per load-generator process
    count in `client_workers` and concurrency cap in `concurrencies` (0: none; a cap c sends min(num, c *
    prompts_per_stream) requests). Each run also reports the engine's mean step and mean decode-step time over it
    (from /metrics): the decode step is the gap a client would see between tokens without bursts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DEEPINFER_NO_PROGRESS": "1"}
    # The queue takes the whole burst: every request waits for its first token at once.
    server = subprocess.Popen([sys.executable, "-m", "deepinfer.cli", "serve", "--port", str(port),
                               *serve_flags(settings), "--max-queue-size", str(max(1024, 2 * num)),
                               "--api-server-count", str(api_servers),
                               "--no-access-log", "--log-level", "warning"], env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(3000):  # a large shape's dummy weights take a while
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        runs = []
        for workers in client_workers:
            for cap in concurrencies:
                fd, out = tempfile.mkstemp(suffix=".json")
                os.close(fd)
                count = num if cap == 0 else min(num, cap * prompts_per_stream)
                before = engine_counters(base)
                code = bench_main(["--base-url", base, "--dataset", prompts_file, "--num-prompts", str(count),
                                   "--max-tokens", str(max_tokens), "--ignore-eos", "--max-prompt-chars",
                                   str(max_chars), "--disable-tqdm", "--num-workers", str(workers),
                                   *(["--max-concurrency", str(cap)] if cap else []), "--save-result", out])
                after = engine_counters(base)
                if code != 0:
                    raise RuntimeError("the served run failed")
                with open(out) as f:
                    result = json.load(f)
                os.unlink(out)
                run = {k: result[k] for k in ("num_workers", "duration", "output_throughput", "median_ttft_ms",
                                              "median_tpot_ms", "median_itl_ms", "p90_itl_ms", "completed",
                                              "failed") if k in result}
                steps = after["deepinfer_engine_steps_total"] - before["deepinfer_engine_steps_total"]
                seconds = (after["deepinfer_engine_step_seconds_total"]
                           - before["deepinfer_engine_step_seconds_total"])
                decode_steps = (after["deepinfer_engine_decode_steps_total"]
                                - before["deepinfer_engine_decode_steps_total"])
                decode_seconds = (after["deepinfer_engine_decode_step_seconds_total"]
                                  - before["deepinfer_engine_decode_step_seconds_total"])
                run.update(api_server_count=api_servers, max_concurrency=cap or None, num_prompts=count,
                           engine_steps=steps, engine_mean_step_ms=1000 * seconds / steps if steps else None,
                           engine_mean_decode_step_ms=1000 * decode_seconds / decode_steps if decode_steps else None)
                if run["engine_mean_decode_step_ms"]:  # the gap a client sees between tokens, without bursts
                    run["median_itl_over_decode_step"] = run["median_itl_ms"] / run["engine_mean_decode_step_ms"]
                runs.append(run)
        return runs
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=None)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-prompt-chars", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3, help="offline/served pairs to run (default 3)")
    p.add_argument("--save-result", default=None)
    p.add_argument("--shape", default=None, choices=["v2-lite", "v3-slice"],
                   help="a benchmark shape with random weights instead of the demo model")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--client-workers", type=int, nargs="+", default=[1],
                   help="load-generator processes (deepinfer bench serve --num-workers), one served run each")
    p.add_argument("--api-server-counts", type=int, nargs="+", default=[1],
                   help="deepinfer serve --api-server-count values, one server start each (default 1)")
    p.add_argument("--concurrencies", type=int, nargs="+", default=[0],
                   help="streams at once (bench serve --max-concurrency; 0: all at once), one served run each")
    p.add_argument("--prompts-per-stream", type=int, default=4,
                   help="with a concurrency cap c, min(--num-prompts, c * this) requests (default 4)")
    args = p.parse_args()
    dataset = args.dataset or str(default_dataset())
    prompts = sample_prompts(load_prompts(dataset), args.num_prompts, 0, args.max_prompt_chars)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = None
        if args.shape is not None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
            from bench_common import shape_config
            from engine_bench import write_model_dir

            # Prompts are text tokenized with DeepSeek-V3's tokenizer: the vocabulary must hold its ids (V3's size).
            config = {**shape_config(args.shape)}
            config["vocab_size"] = max(config["vocab_size"], 129280)
            model_dir = str(write_model_dir(Path(tmp), args.shape, config)[0])
        settings = engine_settings(args, model_dir)
        pairs = []
        for _ in range(args.repeat):  # alternate, so drifting machine load hits both sides alike
            pair = {"offline": offline(prompts, args.max_tokens, settings),
                    "served": [run for count in args.api_server_counts
                               for run in served(dataset, args.num_prompts, args.max_tokens, settings,
                                                 args.max_prompt_chars, args.client_workers, count,
                                                 args.concurrencies, args.prompts_per_stream)]}
            for run in pair["served"]:
                run["served_over_offline_tok_s"] = run["output_throughput"] / pair["offline"]["output_throughput"]
            pair["ratio"] = pair["served"][0]["duration"] / pair["offline"]["duration"]
            pairs.append(pair)
            print(json.dumps(pairs[-1]), flush=True)
    ratios = sorted(p["ratio"] for p in pairs)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **run_provenance(),
              "command": shlex.join(["python3", "benchmarks/serve/overhead.py", *sys.argv[1:]]),
              "shape": args.shape or "demo", "device": args.device, "max_num_seqs": args.max_num_seqs,
              "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "max_model_len": args.max_model_len,
              "max_prompt_chars": args.max_prompt_chars, "pairs": pairs,
              "median_served_over_offline_duration": ratios[len(ratios) // 2]}
    print(json.dumps(result, indent=2))
    if args.save_result:
        with open(args.save_result, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
