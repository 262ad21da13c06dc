"""Decode throughput of the engine against the HBM roofline, on random weights of a DeepSeek shape.

    python benchmarks/gpu/decode_bench.py --shape v2-lite-2l --batch 1 8 32 --context 1024 --out OUT_DIR

Each case submits `batch` requests of `context` random prompt tokens that generate --output-tokens tokens each
(ignore_eos), and reports decode tokens/s (generated tokens after the first, over the time from the last first token
to the end), ms per step, and the roofline floor of a step: (bytes of the weights a step touches + bytes of latent
cache it reads) / the copy bandwidth given with --copy-gbps (measure it in the same run with floors.py).
Weights a decode step touches: everything but the embedding table, with routed experts counted as
min(E, batch x top_k) experts per MoE layer (an upper bound on what distinct experts cost).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams  # noqa: E402
from deepinfer.default_model import TRAINED_MODEL_DIR  # noqa: E402

from bench_common import V2_LITE, step_bytes  # noqa: E402  (the shapes and the roofline bytes live there)

SHAPES = {"v2-lite": V2_LITE, "v2-lite-2l": {**V2_LITE, "num_hidden_layers": 2},
          "v2-lite-8l": {**V2_LITE, "num_hidden_layers": 8},
          # For checking this script on a CPU: V2-Lite's attention dims, small everything else.
          "smoke": {**V2_LITE, "num_hidden_layers": 2, "vocab_size": 4096, "hidden_size": 256,
                    "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 8}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="v2-lite-2l")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--copy-gbps", type=float, default=4270.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    c = SHAPES[args.shape]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / args.shape
        path.mkdir()
        (path / "config.json").write_text(json.dumps(c))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TRAINED_MODEL_DIR / f, path / f)
        t0 = time.perf_counter()
        cfg = EngineConfig(model_name_or_path=str(path), load_format="dummy", device=args.device,
                           max_model_len=args.context + args.output_tokens + 8, max_num_seqs=max(args.batch),
                           max_num_batched_tokens=16384, gpu_memory_utilization=0.85)
        with DeepInferenceEngine(cfg) as engine:
            load_s = time.perf_counter() - t0
            rng = np.random.default_rng(0)
            params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
            engine.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))  # warm-up
            for batch in args.batch:
                prompts = [{"prompt_token_ids": rng.integers(2, 4096, args.context).tolist()} for _ in range(batch)]
                outs = engine.generate(prompts, params, use_tqdm=False)
                first = max(o.metrics.first_token_time for o in outs)
                end = max(o.metrics.finish_time for o in outs)
                steps = args.output_tokens - 1
                decode_s = end - first
                weight_b, cache_b = step_bytes(c, batch, args.context + args.output_tokens // 2)
                floor_ms = (weight_b + cache_b) / (args.copy_gbps * 1e9) * 1e3
                step_ms = decode_s / steps * 1e3
                row = {"batch": batch, "context": args.context, "output_tokens": args.output_tokens,
                       "ttft_s_mean": statistics.mean(o.ttft_s for o in outs),
                       "decode_tokens_per_s": batch * steps / decode_s, "ms_per_step": step_ms,
                       "floor_ms_per_step": floor_ms, "fraction_of_roofline": floor_ms / step_ms,
                       "weight_bytes_per_step": weight_b, "cache_bytes_per_step": cache_b}
                rows.append(row)
                print(f"{args.shape} batch {batch:4d} ctx {args.context}: {row['decode_tokens_per_s']:9.1f} tok/s, "
                      f"{step_ms:7.3f} ms/step, floor {floor_ms:6.3f} ms ({100 * row['fraction_of_roofline']:.1f}%), "
                      f"TTFT {row['ttft_s_mean']:.3f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"decode_{args.shape}.json").write_text(json.dumps(
        {"shape": args.shape, "config": c, "device": args.device, "load_s": load_s, "copy_gbps": args.copy_gbps,
         "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
