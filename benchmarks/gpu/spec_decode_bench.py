"""MTP speculative decoding on a GPU: decode speed with k draft tokens a step against no drafts, at several batches.

Two models:
  demo      the embedded demo model with its trained MTP layer: the acceptance is the model's own (greedy).
  v3-slice  DeepSeek-V3's dimensions with random weights (load_format dummy) and an MTP layer of V3's shape: random
            drafts are never accepted, so a benchmark-only forced acceptance rate (0, 0.5, 0.85, 1.0) stands in for
            the model's, which measures the speed at the paper's 85%.

Each case decodes `--output-tokens` tokens (ignore_eos) for `batch` distinct prompts submitted at once (the first
ShareGPT prompts with --sharegpt, else numbered variants of one line: identical prompts would route every sequence to
the same experts and share their prefix); its decode tok/s counts output tokens after the first over the time from the
last first token to the last finish.

  python3 benchmarks/gpu/spec_decode_bench.py --model demo --batches 1,8,32 --ks 0,1,3 --out OUT
  python3 benchmarks/gpu/spec_decode_bench.py --model v3-slice --v3-layers 6 --batches 1,32 --ks 0,1,3 \
      --forced 0,0.5,0.85,1 --out OUT

With --disable-by-batch-size N, in a batch of more than N the first N requests admitted draft and the rest do not (a
case's requests arrive together): what that setting keeps of the speed at large batches.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import run_metadata, shape_config, write_json  # noqa: E402
from engine_bench import write_model_dir  # noqa: E402

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun."


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["demo", "v3-slice"], default="demo")
    ap.add_argument("--v3-layers", type=int, default=6, help="main layers of the v3-slice (the MTP layer is one more)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ks", default="0,1,3", help="draft tokens a step; 0 = no speculative decoding")
    ap.add_argument("--forced", default="", help="forced acceptance rates (v3-slice); empty: the model's own")
    ap.add_argument("--disable-by-batch-size", type=int, default=None,
                    help="speculative_config.disable_by_batch_size: requests past this many in the engine do not draft")
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--sharegpt", type=Path, default=None, help="sharegpt_v3_filtered_1000.json: distinct prompts")
    ap.add_argument("--out", type=Path, default=Path("."))
    return ap.parse_args(argv)


def model_dir(args, root: Path) -> tuple[str | None, str]:
    if args.model == "demo":
        return None, "auto"
    config = {**shape_config("v3-slice", args.v3_layers), "num_nextn_predict_layers": 1}
    path, _ = write_model_dir(root, f"v3-slice-{args.v3_layers}l-mtp", config)
    return str(path), "dummy"


def distinct_prompts(engine, batch: int, sharegpt: Path | None) -> list[list[int]]:
    if sharegpt is not None and sharegpt.is_file():
        from bench_common import sharegpt_prompts

        ids, _ = sharegpt_prompts(sharegpt, batch, engine.model_config.vocab_size, 256)
        return ids
    return [engine.tokenizer.encode(f"{PROMPT} ({i})") for i in range(batch)]


def decode_case(engine, batch: int, output_tokens: int, prompts: list[list[int]]) -> dict:
    from deepinfer import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    before = engine.stats()
    spec_before = engine.speculative_stats()
    streams = [engine.submit({"prompt_token_ids": p}, params) for p in prompts[:batch]]
    outs = [s.result(timeout=600) for s in streams]
    after = engine.stats()
    first = max(o.metrics.first_token_time for o in outs)
    last = max(o.metrics.finish_time for o in outs)
    tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    case = {"batch": batch, "output_tokens": output_tokens, "decode_tok_s": tokens / (last - first),
            "steps": after.num_steps - before.num_steps,
            "graph_replays": after.num_graph_replays - before.num_graph_replays}
    spec = engine.speculative_stats()
    if spec is not None:
        drafts = spec["num_drafts"] - spec_before["num_drafts"]
        checked = spec["num_draft_tokens"] - spec_before["num_draft_tokens"]
        accepted = spec["num_accepted_tokens"] - spec_before["num_accepted_tokens"]
        case.update(acceptance_rate=accepted / checked if checked else 0.0,
                    mean_accepted_length=1 + accepted / drafts if drafts else 0.0)
    return case


def main(argv=None) -> int:
    args = parse_args(argv)
    from deepinfer import DeepInferenceEngine, EngineConfig

    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    forced = [float(f) for f in args.forced.split(",")] if args.forced else [None]
    out = args.out / f"spec_decode_{args.model}.json"
    result = {"meta": run_metadata(), "model": args.model, "v3_layers": args.v3_layers if args.model != "demo" else None,
              "disable_by_batch_size": args.disable_by_batch_size, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        path, load_format = model_dir(args, Path(tmp))
        for k in ks:
            spec = {"method": "mtp", "num_speculative_tokens": k,
                    "disable_by_batch_size": args.disable_by_batch_size} if k else None
            t0 = time.perf_counter()
            engine = DeepInferenceEngine(EngineConfig(
                model_name_or_path=path, load_format=load_format, device=args.device, seed=0,
                max_model_len=1024, max_num_seqs=max(batches), enforce_eager=args.enforce_eager,
                speculative_config=spec))
            load_s = time.perf_counter() - t0
            try:
                prompts = distinct_prompts(engine, max(batches), args.sharegpt)
                engine.generate({"prompt_token_ids": prompts[0]}, max_tokens=8, temperature=0.0)  # warm-up
                for rate in (forced if k else [None]):
                    if k:
                        engine._core.set_speculative_forced_acceptance(-1.0 if rate is None else rate)
                    for batch in batches:
                        case = {"k": k, "forced_acceptance": rate, "load_s": round(load_s, 1),
                                **decode_case(engine, batch, args.output_tokens, prompts)}
                        base = next((c for c in result["cases"] if c["k"] == 0 and c["batch"] == batch), None)
                        if base is not None:
                            case["speedup"] = case["decode_tok_s"] / base["decode_tok_s"]
                        result["cases"].append(case)
                        write_json(out, result)
                        print(f"k={k} forced={rate} batch={batch}: {case['decode_tok_s']:.1f} tok/s"
                              + (f" x{case['speedup']:.2f}" if "speedup" in case else "")
                              + (f" accept {case['acceptance_rate']:.3f} len {case['mean_accepted_length']:.2f}"
                                 if "acceptance_rate" in case else ""), flush=True)
            finally:
                engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
