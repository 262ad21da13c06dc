#!/usr/bin/env python3
"""Perplexity of the embedded demo model on its held-out text in four configurations (CONFIGURATIONS: the weights'
quantization and the latent cache's dtype): its own weights; FP8 weights; FP8 weights with the FP8 latent cache; its
own weights with the FP8 latent cache. Each is measured twice: by the engine's prompt_logprobs, and by
lm-evaluation-harness (loglikelihood_rolling) through `deepinfer serve`.

    pip install -r benchmarks/accuracy/requirements.txt     # lm-eval, for the second measurement
    python benchmarks/accuracy/perplexity.py --out benchmarks/results --name fp8_perplexity_cpu

Both measurements score the same token stream with the same windows (heldout.py: lm-eval's rolling definition, every
held-out token predicted once, windows of --window tokens, the first after BOS, each later one after the token before
it). The default window, 512, is the context the demo model was trained at; its config allows 2048 positions (YaRN
x4), where it was never trained (the training report's 2048-token row: perplexity 225). Also reported, from the engine:
the training report's own window cut (each window after its own BOS), which must reproduce its figure, 108.24.

The targets (COMPARISONS): FP8 weights at most +1% perplexity over the own weights; the FP8 cache at most +1% more
over the same weights with the compute-dtype cache; the two measurements within 0.1% of each other.

Writes NAME.json and NAME.md under --out. --no-lm-eval runs the engine measurement alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import heldout  # noqa: E402
from report import render_markdown  # noqa: E402


@dataclass(frozen=True)
class Configuration:
    """What one row measures: the weights (``quantization``: None = the checkpoint's own) and the latent cache
    (``kv_cache_dtype``: "auto" = the model's compute dtype, "fp8")."""

    quantization: str | None
    kv_cache_dtype: str = "auto"

    @property
    def key(self) -> str:
        """The result's key: "own" or "fp8" (the weights), "+fp8_cache" after it for the FP8 cache."""
        return (self.quantization or "own") + ("" if self.kv_cache_dtype == "auto" else f"+{self.kv_cache_dtype}_cache")

    def engine_config(self, max_model_len: int):
        from deepinfer import EngineConfig

        return EngineConfig(quantization=self.quantization, kv_cache_dtype=self.kv_cache_dtype, device="cpu",
                            max_model_len=max_model_len)

    def serve_args(self) -> list[str]:
        """The same configuration as `deepinfer serve` flags (none for the defaults)."""
        return ((["--quantization", self.quantization] if self.quantization else [])
                + ([] if self.kv_cache_dtype == "auto" else ["--kv-cache-dtype", self.kv_cache_dtype]))


OWN = Configuration(None)
FP8_WEIGHTS = Configuration("fp8")
FP8_WEIGHTS_FP8_CACHE = Configuration("fp8", kv_cache_dtype="fp8")
OWN_FP8_CACHE = Configuration(None, kv_cache_dtype="fp8")
CONFIGURATIONS = (OWN, FP8_WEIGHTS, FP8_WEIGHTS_FP8_CACHE, OWN_FP8_CACHE)  # the first is every table's baseline

# (what changes, the configuration, the one it is compared with, the target: at most this many percent more
# perplexity than that one, or None for a figure without a target)
COMPARISONS = (
    ("FP8 weights", FP8_WEIGHTS, OWN, 1.0),
    ("FP8 cache, on FP8 weights", FP8_WEIGHTS_FP8_CACHE, FP8_WEIGHTS, 1.0),
    ("FP8 cache, on own weights", OWN_FP8_CACHE, OWN, 1.0),
    ("FP8 weights and FP8 cache", FP8_WEIGHTS_FP8_CACHE, OWN, None),
)
AGREEMENT_TARGET_PERCENT = 0.1  # the two measurements of one configuration: within 0.1% of each other


def score_windows(engine, windows: list[heldout.Window]) -> tuple[float, int]:
    """Sum of -log p over the scored tokens of every window (the engine's prompt_logprobs), and their count."""
    from deepinfer import SamplingParams

    params = SamplingParams(max_tokens=0, prompt_logprobs=0, temperature=0.0)
    outputs = engine.generate([{"prompt_token_ids": w.tokens} for w in windows], params, use_tqdm=False)
    nll, count = 0.0, 0
    for window, out in zip(windows, outputs):
        for position in range(len(window.tokens) - window.scored, len(window.tokens)):
            nll -= out.prompt_logprobs[position][window.tokens[position]].logprob
            count += 1
    return nll, count


def engine_measurement(configuration: Configuration, ids: list[int], window: int) -> dict:
    from deepinfer import DeepInferenceEngine

    engine = DeepInferenceEngine(configuration.engine_config(max_model_len=window + 1))
    try:
        start = time.perf_counter()
        nll, tokens = score_windows(engine, heldout.rolling_windows(ids, window))
        seconds = time.perf_counter() - start
        report_nll, report_tokens = score_windows(engine, heldout.report_windows(ids, window))
        weight_bytes = dict(engine.weight_bytes)
        cache_pages = engine.stats().num_cache_pages
    finally:
        engine.shutdown()
    assert tokens == len(ids) == report_tokens, (tokens, len(ids), report_tokens)
    return {"quantization": configuration.quantization, "kv_cache_dtype": configuration.kv_cache_dtype,
            "tokens": tokens, "nll": nll, "nats_per_token": nll / tokens,
            "perplexity": math.exp(nll / tokens), "seconds": round(seconds, 1),
            "report_windows_perplexity": math.exp(report_nll / report_tokens), "weight_bytes": weight_bytes,
            "cache_pages": cache_pages}


def delta_percent(value: float, base: float) -> float:
    return 100.0 * (value / base - 1.0)


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=heldout.REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=heldout.REPO,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+uncommitted changes" if dirty else "")


def recorded_command(argv: list[str]) -> str:
    """The command line as the report shows it: --corpus left out (its sha256 is recorded), the lm-eval interpreter
    named, other absolute paths made relative to the repository."""
    shown, previous = [], None
    for arg in argv:
        if arg.startswith("--corpus") or previous == "--corpus":
            pass
        elif previous == "--lm-eval-python":
            shown.append("PYTHON_WITH_LM_EVAL")
        else:
            shown.append(os.path.relpath(arg, heldout.REPO) if os.path.isabs(arg) else arg)
        previous = arg
    return " ".join(["python benchmarks/accuracy/perplexity.py"] + shown)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=None,
                    help="tinyshakespeare.txt (default: ../shared/assets/corpora beside the repository, else .data/)")
    ap.add_argument("--window", type=int, default=512, help="tokens per scored window (the model's input length)")
    ap.add_argument("--out", type=Path, required=True, help="folder for NAME.json and NAME.md")
    ap.add_argument("--name", default="fp8_perplexity_cpu")
    ap.add_argument("--no-lm-eval", action="store_true", help="the engine measurement only")
    ap.add_argument("--lm-eval-python", default=sys.executable, help="the interpreter that has lm-eval installed")
    ap.add_argument("--lm-eval-timeout", type=float, default=1800.0, help="seconds one lm_eval run may take")
    ap.add_argument("--work", type=Path, default=heldout.REPO / "build" / "perplexity_work",
                    help="lm-eval's files and the server logs (default: build/perplexity_work in the repository)")
    ap.add_argument("--machine", default=f"{os.cpu_count()}-core CPU", help="the machine, in words, for the report")
    args = ap.parse_args(argv)

    from deepinfer.default_model import TRAINED_MODEL_DIR

    corpus = args.corpus or heldout.default_corpus()
    if not corpus.is_file():
        ap.error(f"corpus not found: {corpus} (pass --corpus)")
    text = heldout.heldout_text(corpus.read_text(encoding="utf-8"))
    ids = heldout.tokenize(text, TRAINED_MODEL_DIR)
    print(f"held-out text: {len(text):,} characters, {len(ids):,} tokens; windows of {args.window}", flush=True)

    result = {
        "what": "perplexity of the embedded demo model on its held-out text: its own weights vs FP8 weights, "
                "and the compute-dtype latent cache vs the FP8 latent cache",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
        "machine": args.machine,
        "platform": platform.platform(),
        "command": recorded_command(argv if argv is not None else sys.argv[1:]),
        "data": {"corpus": corpus.name, "corpus_sha256": heldout.sha256_text(corpus.read_text(encoding="utf-8")),
                 "heldout_characters": len(text), "heldout_bytes": len(text.encode("utf-8")),
                 "heldout_sha256": heldout.sha256_text(text), "tokens": len(ids)},
        "window": args.window,
        "windows": len(heldout.rolling_windows(ids, args.window)),
        "configurations": {c.key: {"quantization": c.quantization, "kv_cache_dtype": c.kv_cache_dtype}
                           for c in CONFIGURATIONS},
        "engine": {},
        "lm_eval": {},
    }
    for c in CONFIGURATIONS:
        r = engine_measurement(c, ids, args.window)
        result["engine"][c.key] = r
        print(f"engine   {c.key:>13}: perplexity {r['perplexity']:.4f} ({r['seconds']} s); report windows "
              f"{r['report_windows_perplexity']:.4f}", flush=True)

    if not args.no_lm_eval:
        import lm_eval_server

        for c in CONFIGURATIONS:
            r = lm_eval_server.measure(c.key, c.serve_args(), text, len(ids), args.window, TRAINED_MODEL_DIR,
                                       args.work.resolve(), args.lm_eval_python, args.lm_eval_timeout)
            r.update(quantization=c.quantization, kv_cache_dtype=c.kv_cache_dtype)
            result["lm_eval"][c.key] = r
            print(f"lm-eval  {c.key:>13}: perplexity {r['perplexity']:.4f} ({r['seconds']} s)", flush=True)
        result["lm_eval_version"] = subprocess.run(
            [args.lm_eval_python, "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
            capture_output=True, text=True).stdout.strip()

    result["comparisons"] = [
        {"what": what, "configuration": c.key, "baseline": base.key, "target_percent": target,
         **{f"{source}_delta_percent": delta_percent(result[source][c.key]["perplexity"],
                                                     result[source][base.key]["perplexity"])
            for source in ("engine", "lm_eval") if result[source]}}
        for what, c, base, target in COMPARISONS]
    if result["lm_eval"]:
        result["agreement_target_percent"] = AGREEMENT_TARGET_PERCENT
        result["agreement_percent"] = {key: delta_percent(result["lm_eval"][key]["perplexity"],
                                                          result["engine"][key]["perplexity"])
                                       for key in result["lm_eval"]}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render_markdown(result))
    print(f"wrote {args.out / (args.name + '.json')} and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
