"""Structured outputs' cost: output throughput of `batch` requests at once with a JSON schema (or a regex) against the
same requests unconstrained, and the host time of the grammar masks (computed while the device runs the forward pass).

Models: v2-lite (DeepSeek-V2-Lite's dimensions, random weights, DeepSeek-V3's tokenizer: 129k-token masks) on a GPU,
or the embedded demo model (4k tokens) on either. Prompts: the first `batch` ShareGPT prompts (distinct), or a
built-in list when the file is absent. Each request samples (temperature 1, its own seed) `--output-tokens` tokens at
most; a constrained one may end earlier when its grammar completes, so the figure compared is output tok/s.

  python3 benchmarks/gpu/structured_outputs_bench.py --model v2-lite --batch 64 --out OUT
  python3 benchmarks/gpu/structured_outputs_bench.py --model demo --device cpu --batch 16 --output-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import run_metadata, shape_config, sharegpt_prompts, write_json  # noqa: E402
from engine_bench import write_model_dir  # noqa: E402

# An answer record a chat application might ask for: nested object, arrays, enums, bounded strings.
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "score": {"type": "number"},
        "topics": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 8},
        "author": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name"], "additionalProperties": False},
        "answer": {"type": "string"},
    },
    "required": ["title", "sentiment", "score", "topics", "author", "answer"],
    "additionalProperties": False,
}
# Words and spaces with no end: the run is not shortened by the grammar completing.
REGEX = r"[a-z]+( [a-z]+)*"
FALLBACK_PROMPTS = ["Summarize the plot of Hamlet.", "What is multi-head latent attention?",
                    "Write a haiku about GPUs.", "List three uses of a paperclip.", "Explain mixture of experts."]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["v2-lite", "demo"], default="v2-lite")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=512, help="ShareGPT prompts are truncated to this")
    ap.add_argument("--cases", default="free,json_schema,regex")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each case; the best is kept")
    ap.add_argument("--sharegpt", type=Path, default=os.environ.get("SHAREGPT") or None,
                    help="sharegpt_v3_filtered_1000.json (default: $SHAREGPT; built-in prompts when absent)")
    ap.add_argument("--out", type=Path, default=Path("."))
    return ap.parse_args(argv)


def constraint(case: str):
    from deepinfer import StructuredOutputsParams

    if case == "free":
        return None
    if case == "json_schema":
        return StructuredOutputsParams(json=SCHEMA)
    if case == "regex":
        return StructuredOutputsParams(regex=REGEX)
    raise ValueError(f"unknown case {case!r}")


def run_case(engine, prompts: list[list[int]], case: str, output_tokens: int) -> dict:
    from deepinfer import SamplingParams

    so = constraint(case)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=output_tokens, structured_outputs=so)
              for i in range(len(prompts))]
    before = engine.stats()
    t0 = time.perf_counter()
    streams = [engine.submit({"prompt_token_ids": p}, sp) for p, sp in zip(prompts, params)]
    submitted = time.perf_counter() - t0
    outs = [s.result(timeout=900) for s in streams]
    wall = time.perf_counter() - t0
    after = engine.stats()
    errors = [o.outputs[0].error for o in outs if o.outputs[0].finish_reason == "error"]
    if errors:
        raise RuntimeError(f"{case}: {len(errors)} of {len(outs)} requests failed; the first: {errors[0]}")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    masks = after.num_grammar_masks - before.num_grammar_masks
    mask_s = after.grammar_mask_seconds - before.grammar_mask_seconds
    steps = after.num_steps - before.num_steps
    valid = None
    if case == "json_schema":
        import jsonschema

        complete = [o.outputs[0].text for o in outs if o.outputs[0].finish_reason == "stop"]
        for text in complete:
            jsonschema.validate(json.loads(text), SCHEMA)
        valid = len(complete)
    return {"case": case, "requests": len(prompts), "output_tokens": tokens, "wall_s": wall,
            "submit_s": submitted, "output_tok_s": tokens / wall, "steps": steps,
            "step_ms": 1e3 * (after.step_seconds - before.step_seconds) / max(steps, 1),
            "masks": masks, "mask_us": 1e6 * mask_s / masks if masks else 0.0,
            "mask_ms_per_step": 1e3 * mask_s / max(steps, 1),
            "finished_by_grammar": sum(1 for o in outs if o.outputs[0].finish_reason == "stop"),
            "valid_complete_json": valid}


def main(argv=None) -> int:
    args = parse_args(argv)
    from deepinfer import DeepInferenceEngine, EngineConfig

    cases = args.cases.split(",")
    out = args.out / f"structured_outputs_{args.model}_{args.device}.json"
    result = {"meta": run_metadata(), "model": args.model, "device": args.device, "batch": args.batch,
              "schema": SCHEMA, "regex": REGEX, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        path, load_format = None, "auto"
        if args.model == "v2-lite":
            path, _ = write_model_dir(Path(tmp), "v2-lite", shape_config("v2-lite"))
            path, load_format = str(path), "dummy"
        engine = DeepInferenceEngine(EngineConfig(
            model_name_or_path=path, load_format=load_format, device=args.device, seed=0,
            max_model_len=args.prompt_tokens + args.output_tokens + 8, max_num_seqs=args.batch))
        try:
            vocab = engine.model_config.vocab_size
            if args.sharegpt is not None and Path(args.sharegpt).is_file():
                prompts, info = sharegpt_prompts(Path(args.sharegpt), args.batch, vocab, args.prompt_tokens)
                result["prompts"] = info
            else:
                texts = [FALLBACK_PROMPTS[i % len(FALLBACK_PROMPTS)] + f" ({i})" for i in range(args.batch)]
                prompts = [engine.tokenizer.encode(t) for t in texts]
                result["prompts"] = {"prompts": len(prompts), "source": "built-in"}
            # Warm-up: graphs, and the grammar engine's tokenizer trie (built at the first constrained request).
            t0 = time.perf_counter()
            run_case(engine, prompts[:2], "json_schema", 8)
            result["first_constrained_request_s"] = time.perf_counter() - t0
            run_case(engine, prompts, "free", 16)
            for case in cases:
                best = max((run_case(engine, prompts, case, args.output_tokens) for _ in range(args.repeats)),
                           key=lambda c: c["output_tok_s"])
                free = next((c for c in result["cases"] if c["case"] == "free"), None)
                if free is not None and case != "free":
                    best["vs_free"] = best["output_tok_s"] / free["output_tok_s"]
                result["cases"].append(best)
                write_json(out, result)
                print(f"{case}: {best['output_tok_s']:.0f} tok/s, step {best['step_ms']:.2f} ms, "
                      f"masks {best['mask_us']:.0f} us each, {best['mask_ms_per_step']:.2f} ms a step"
                      + (f", x{best['vs_free']:.3f} of free" if "vs_free" in best else ""), flush=True)
        finally:
            engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
