"""CPU decode throughput of a model (default: the embedded demo model) at a few batch sizes.

    python benchmarks/cpu_throughput.py --batch-sizes 1 16 --output-tokens 64 --save benchmarks/results/cpu_throughput.json

Each batch submits `batch` requests together (same-length prompts from the real ShareGPT prompt set when present),
all with ignore_eos so every request generates exactly --output-tokens tokens. Reported: generated tokens per second
over the wall time of the batch, the mean time to first token, and the per-request decode rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO.parent / "shared" / "assets" / "prompts" / "sharegpt_v3_filtered_1000.json"


def prompts(n: int, tokenizer, prompt_tokens: int) -> list[list[int]]:
    texts = []
    if SHAREGPT.is_file():
        data = json.loads(SHAREGPT.read_text())
        texts = [d if isinstance(d, str) else d.get("prompt") or d.get("text") or json.dumps(d) for d in data]
    texts = texts or ["To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"]
    out = []
    i = 0
    while len(out) < n:
        ids = tokenizer.encode(texts[i % len(texts)] * 8)[:prompt_tokens]
        if len(ids) == prompt_tokens:
            out.append(ids)
        i += 1
    return out


def run(engine: DeepInferenceEngine, batch: int, prompt_tokens: int, output_tokens: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    reqs = [{"prompt_token_ids": p} for p in prompts(batch, engine.tokenizer, prompt_tokens)]
    engine.generate(reqs[:1], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = engine.generate(reqs, params, use_tqdm=False)
    wall = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outs)
    return {
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "wall_s": round(wall, 4),
        "generated_tokens": generated,
        "output_tokens_per_s": round(generated / wall, 2),
        "mean_ttft_s": round(statistics.mean(o.ttft_s for o in outs), 4),
        "mean_request_decode_tokens_per_s": round(statistics.mean(o.decode_tokens_per_s for o in outs), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--save", type=Path, default=None, help="write the results as JSON (and a .md beside it)")
    args = ap.parse_args()

    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=args.model, max_model_len=1024))
    try:
        rows = [run(engine, b, args.prompt_tokens, args.output_tokens) for b in args.batch_sizes]
    finally:
        engine.shutdown()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    result = {
        "benchmark": "cpu_throughput",
        "model": args.model or ("embedded demo model" if not engine.is_random_model else "embedded random model"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "command": "python benchmarks/cpu_throughput.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if v is not None and k != "save"),
        "results": rows,
    }
    print(json.dumps(result, indent=2))
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")
        lines = [f"# CPU throughput — {result['model']}", "",
                 f"{result['date']}, commit {commit}, {result['cores']} cores, `{result['command']}`", "",
                 "| batch | prompt tok | output tok | wall s | output tok/s | mean TTFT s | per-request decode tok/s |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['batch']} | {r['prompt_tokens']} | {r['output_tokens']} | {r['wall_s']} | "
                         f"{r['output_tokens_per_s']} | {r['mean_ttft_s']} | {r['mean_request_decode_tokens_per_s']} |")
        args.save.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
