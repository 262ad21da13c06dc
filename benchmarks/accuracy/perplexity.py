#!/usr/bin/env python3
"""Perplexity of the embedded demo model on its held-out text, with its own weights and with FP8 weights, measured
twice: by the engine's prompt_logprobs, and by lm-evaluation-harness (loglikelihood_rolling) through `deepinfer serve`.

    pip install -r benchmarks/accuracy/requirements.txt     # lm-eval, for the second measurement
    python benchmarks/accuracy/perplexity.py --out benchmarks/results --name fp8_perplexity_cpu

Both measurements score the same token stream with the same windows (heldout.py: lm-eval's rolling definition, every
held-out token predicted once, windows of --window tokens, the first after BOS, each later one after the token before
it). The default window, 512, is the context the demo model was trained at; its config allows 2048 positions (YaRN
x4), where it was never trained (the training report's 2048-token row: perplexity 225). Also reported, from the engine:
the training report's own window cut (each window after its own BOS), which must reproduce its figure, 108.24.

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
from pathlib import Path

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import heldout  # noqa: E402
from report import render_markdown  # noqa: E402

QUANTIZATIONS = (None, "fp8")


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


def engine_measurement(quantization: str | None, ids: list[int], window: int) -> dict:
    from deepinfer import DeepInferenceEngine, EngineConfig

    engine = DeepInferenceEngine(EngineConfig(quantization=quantization, device="cpu", max_model_len=window + 1))
    try:
        start = time.perf_counter()
        nll, tokens = score_windows(engine, heldout.rolling_windows(ids, window))
        seconds = time.perf_counter() - start
        report_nll, report_tokens = score_windows(engine, heldout.report_windows(ids, window))
        weight_bytes = dict(engine.weight_bytes)
    finally:
        engine.shutdown()
    assert tokens == len(ids) == report_tokens, (tokens, len(ids), report_tokens)
    return {"quantization": quantization, "tokens": tokens, "nll": nll, "nats_per_token": nll / tokens,
            "perplexity": math.exp(nll / tokens), "seconds": round(seconds, 1),
            "report_windows_perplexity": math.exp(report_nll / report_tokens), "weight_bytes": weight_bytes}


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
        "what": "perplexity of the embedded demo model on its held-out text: its own weights vs FP8 weights",
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
        "engine": {},
        "lm_eval": {},
    }
    for q in QUANTIZATIONS:
        r = engine_measurement(q, ids, args.window)
        result["engine"][q or "none"] = r
        print(f"engine   {q or 'none':>4}: perplexity {r['perplexity']:.4f} ({r['seconds']} s); report windows "
              f"{r['report_windows_perplexity']:.4f}", flush=True)

    if not args.no_lm_eval:
        import lm_eval_server

        work = args.work
        for q in QUANTIZATIONS:
            r = lm_eval_server.measure(q, text, len(ids), args.window, TRAINED_MODEL_DIR, work.resolve(),
                                       args.lm_eval_python, args.lm_eval_timeout)
            result["lm_eval"][q or "none"] = r
            print(f"lm-eval  {q or 'none':>4}: perplexity {r['perplexity']:.4f} ({r['seconds']} s)", flush=True)
        result["lm_eval_version"] = subprocess.run(
            [args.lm_eval_python, "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
            capture_output=True, text=True).stdout.strip()

    for source in ("engine", "lm_eval"):
        runs = result[source]
        if "fp8" in runs and "none" in runs:
            result[f"{source}_fp8_delta_percent"] = delta_percent(runs["fp8"]["perplexity"], runs["none"]["perplexity"])
    if result["lm_eval"]:
        result["agreement_percent"] = {q: delta_percent(result["lm_eval"][q]["perplexity"],
                                                        result["engine"][q]["perplexity"]) for q in result["lm_eval"]}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render_markdown(result))
    print(f"wrote {args.out / (args.name + '.json')} and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
