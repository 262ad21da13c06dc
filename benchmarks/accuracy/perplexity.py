#!/usr/bin/env python3
"""Perplexity of the embedded demo model on its held-out text in every configuration of its weights and latent cache
(CONFIGURATIONS): its own weights; FP8 weights, with and without the FP8 latent cache; its own weights with the FP8
cache; INT4 rounded at load (groups of 128, with and without zero points); INT4 calibrated by GPTQ (llm-compressor's
oneshot, calibrate_gptq.py); NVFP4 and MXFP4 checkpoints (written by compressed-tensors, quantized_checkpoints.py).
Each is measured twice: by the engine's prompt_logprobs, and by lm-evaluation-harness (loglikelihood_rolling) through
`deepinfer serve`.

    pip install -r benchmarks/accuracy/requirements.txt     # lm-eval, for the second measurement
    python benchmarks/accuracy/calibrate_gptq.py build/gptq_demo  # in llm-compressor's environment (its docstring)
    python benchmarks/accuracy/perplexity.py --out benchmarks/results --name perplexity_cpu --gptq-checkpoint build/gptq_demo

Both measurements score the same token stream with the same windows (heldout.py: lm-eval's rolling definition, every
held-out token predicted once, windows of --window tokens, the first after BOS, each later one after the token before
it). The default window, 512, is the context the demo model was trained at; its config allows 2048 positions (YaRN
x4), where it was never trained (the training report's 2048-token row: perplexity 225). Also reported, from the engine:
the training report's own window cut (each window after its own BOS), which must reproduce its figure, 108.24.

The targets (COMPARISONS): FP8 weights at most +1% perplexity over the own weights; the FP8 cache at most +1% more
over the same weights with the compute-dtype cache; INT4 rounded at load (g128) at most +3%; the GPTQ checkpoint no
worse than rounding with the same scheme (symmetric g128); the two measurements within 0.1% of each other.

Writes NAME.json and NAME.md under --out. --no-lm-eval runs the engine measurement alone; without --gptq-checkpoint
the GPTQ row is left out (and the report says so).
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
import quantized_checkpoints  # noqa: E402
from report import render_markdown  # noqa: E402


@dataclass(frozen=True)
class Configuration:
    """What one row measures: the weights and the latent cache (``kv_cache_dtype``: "auto" = the model's compute dtype,
    "fp8"). The weights are the demo model's with ``quantization`` applied at load (None: as stored), or a checkpoint
    made from it (``checkpoint``: a quantized_checkpoints.py preset, or "gptq": --gptq-checkpoint)."""

    key: str           # the result's key
    short: str         # in the deltas' words: "FP8 weights, fp32 cache"
    weights: str       # the weights, in words
    quantization: str | dict | None = None
    kv_cache_dtype: str = "auto"
    checkpoint: str = ""

    def engine_config(self, model_dir: Path, max_model_len: int):
        from deepinfer import EngineConfig

        return EngineConfig(model_name_or_path=str(model_dir), quantization=self.quantization,
                            kv_cache_dtype=self.kv_cache_dtype, device="cpu", max_model_len=max_model_len)

    def serve_args(self, model_dir: Path) -> list[str]:
        """The same configuration as `deepinfer serve` flags."""
        args = ["--model", str(model_dir)]
        if isinstance(self.quantization, dict):
            args += ["--quantization-config", json.dumps(self.quantization)]
        elif self.quantization:
            args += ["--quantization", self.quantization]
        return args + ([] if self.kv_cache_dtype == "auto" else ["--kv-cache-dtype", self.kv_cache_dtype])


OWN = Configuration("own", "own weights, fp32 cache", "own (bf16 file, fp32 compute)")
FP8_WEIGHTS = Configuration("fp8", "FP8 weights, fp32 cache", "FP8 (block-scaled e4m3, 128x128)", "fp8")
FP8_WEIGHTS_FP8_CACHE = Configuration("fp8+fp8_cache", "FP8 weights, FP8 cache", FP8_WEIGHTS.weights, "fp8", "fp8")
OWN_FP8_CACHE = Configuration("own+fp8_cache", "own weights, FP8 cache", OWN.weights, None, "fp8")
INT4_RTN = Configuration("int4", "INT4 RTN weights", "INT4 rounded at load (g128, zero points)", "int4")
INT4_RTN_SYMMETRIC = Configuration("int4_symmetric", "INT4 RTN symmetric weights",
                                   "INT4 rounded at load (g128, symmetric)", {"method": "int4", "symmetric": True})
INT4_GPTQ = Configuration("gptq", "INT4 GPTQ weights",
                          "INT4 GPTQ (llm-compressor W4A16: g128, symmetric; compressed-tensors file)", checkpoint="gptq")
NVFP4 = Configuration("nvfp4", "NVFP4 weights", "NVFP4 (e2m1, e4m3 scale per 16 + tensor scale; compressed-tensors file)",
                      checkpoint="nvfp4")
MXFP4 = Configuration("mxfp4", "MXFP4 weights", "MXFP4 (e2m1, E8M0 scale per 32; compressed-tensors file)",
                      checkpoint="mxfp4")
CONFIGURATIONS = (OWN, FP8_WEIGHTS, FP8_WEIGHTS_FP8_CACHE, OWN_FP8_CACHE, INT4_RTN, INT4_RTN_SYMMETRIC, INT4_GPTQ,
                  NVFP4, MXFP4)  # the first is every table's baseline

# (what changes, the configuration, the one it is compared with, the target: at most this many percent more
# perplexity than that one, or None for a figure without a target)
COMPARISONS = (
    ("FP8 weights", FP8_WEIGHTS, OWN, 1.0),
    ("FP8 cache, on FP8 weights", FP8_WEIGHTS_FP8_CACHE, FP8_WEIGHTS, 1.0),
    ("FP8 cache, on own weights", OWN_FP8_CACHE, OWN, 1.0),
    ("FP8 weights and FP8 cache", FP8_WEIGHTS_FP8_CACHE, OWN, None),
    ("INT4 weights rounded at load, g128", INT4_RTN, OWN, 3.0),
    ("INT4 weights rounded at load, g128 symmetric", INT4_RTN_SYMMETRIC, OWN, None),
    ("INT4 weights calibrated by GPTQ", INT4_GPTQ, OWN, None),
    ("GPTQ against rounding, the same scheme", INT4_GPTQ, INT4_RTN_SYMMETRIC, 0.0),
    ("NVFP4 weights", NVFP4, OWN, None),
    ("MXFP4 weights", MXFP4, OWN, None),
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


def engine_measurement(configuration: Configuration, model_dir: Path, ids: list[int], window: int) -> dict:
    from deepinfer import DeepInferenceEngine

    engine = DeepInferenceEngine(configuration.engine_config(model_dir, max_model_len=window + 1))
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
    ap.add_argument("--name", default="perplexity_cpu")
    ap.add_argument("--gptq-checkpoint", type=Path, default=None,
                    help="the GPTQ-calibrated demo checkpoint calibrate_gptq.py wrote (without it: no GPTQ row)")
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

    work = args.work.resolve()
    model_dirs = {"": Path(TRAINED_MODEL_DIR)}
    for preset in quantized_checkpoints.PRESETS:
        model_dirs[preset] = quantized_checkpoints.write_fp4_checkpoint(Path(TRAINED_MODEL_DIR),
                                                                        work / "checkpoints" / preset, preset)
    if args.gptq_checkpoint is not None:
        model_dirs["gptq"] = args.gptq_checkpoint.resolve()
    configurations = [c for c in CONFIGURATIONS if c.checkpoint in model_dirs]
    left_out = [c.key for c in CONFIGURATIONS if c.checkpoint not in model_dirs]

    result = {
        "what": "perplexity of the embedded demo model on its held-out text: its own weights against FP8, INT4 and "
                "FP4 weights, and the compute-dtype latent cache against the FP8 latent cache",
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
        "configurations": {c.key: {"quantization": c.quantization, "kv_cache_dtype": c.kv_cache_dtype,
                                   "checkpoint": c.checkpoint, "weights": c.weights, "short": c.short}
                           for c in configurations},
        "left_out": left_out,
        "engine": {},
        "lm_eval": {},
    }
    for c in configurations:
        r = engine_measurement(c, model_dirs[c.checkpoint], ids, args.window)
        result["engine"][c.key] = r
        print(f"engine   {c.key:>13}: perplexity {r['perplexity']:.4f} ({r['seconds']} s); report windows "
              f"{r['report_windows_perplexity']:.4f}", flush=True)

    if not args.no_lm_eval:
        import lm_eval_server

        for c in configurations:
            r = lm_eval_server.measure(c.key, c.serve_args(model_dirs[c.checkpoint]), text, len(ids), args.window,
                                       TRAINED_MODEL_DIR, work, args.lm_eval_python, args.lm_eval_timeout)
            r.update(quantization=c.quantization, kv_cache_dtype=c.kv_cache_dtype)
            if c.checkpoint:  # the checkpoint's place on this machine, by name
                for command in ("server_command", "lm_eval_command"):
                    r[command] = r[command].replace(str(model_dirs[c.checkpoint]),
                                                    f"{c.checkpoint.upper()}_CHECKPOINT_DIR")
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
        for what, c, base, target in COMPARISONS if c.key in result["engine"] and base.key in result["engine"]]
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
