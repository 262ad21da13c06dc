"""Greedy tokens of hf_parity.py's trained checkpoints, one sequence at a time (a prefill alone, then decode at batch
1), written to one JSON file: an A/B of two kernel paths that must give the same bits runs this under each path's
environment and compares the files byte for byte.

    python benchmarks/gpu/greedy_tokens_b1.py --work PARITY_WORK --out tokens.json [--max-tokens 48] [--device cpu]

PARITY_WORK is hf_parity.py's --work folder after its prepare phase (one checkpoint folder per arch, each with
hf_reference.json holding the prompts' token ids).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="hf_parity.py's work folder (after --phase prepare)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file: arch -> tokens per prompt")
    ap.add_argument("--archs", nargs="+", default=["v3", "v2"])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)

    from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams

    result = {}
    for arch in args.archs:
        ref_path = args.work / arch / "hf_reference.json"
        if not ref_path.is_file():
            raise SystemExit(f"{ref_path} is missing: run hf_parity.py --phase prepare --work {args.work} first")
        ref = json.loads(ref_path.read_text())
        cfg = EngineConfig(model_name_or_path=str(args.work / arch), device=args.device, max_model_len=512,
                           max_num_seqs=1, seed=0, gpu_memory_utilization=0.3)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        with DeepInferenceEngine(cfg) as engine:
            outs = engine.generate([{"prompt_token_ids": p} for p in ref["prompt_ids"]], params, use_tqdm=False)
        result[arch] = [list(o.token_ids) for o in outs]
        fp32 = ref["hf_fp32"]
        same = sum(1 for mine, theirs in zip(result[arch], fp32) if mine[:len(theirs)] == theirs)
        print(f"{arch}: {len(outs)} prompts; the first {len(fp32[0])} tokens equal transformers' fp32 ones on {same}",
              flush=True)
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
