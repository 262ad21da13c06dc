"""Where a decode step's time goes when it runs as it does in serving: CUDA-graph replay with programmatic dependent
launch, caches warm, kernels overlapping. Nsight Compute (decode_step_kernels.py) serializes kernels and flushes the
caches, so its per-kernel figures add up to more than a step; this traces the graph replays with the CUDA activity
tracer (PyTorch's profiler, which records every kernel of the process, the engine's own graphs included) and charges
each stretch of the step to the kernel that finishes it.

    python benchmarks/gpu/decode_step_timeline.py --out OUT [--shape v2-lite] [--batch 1] [--context 1024]

For each kernel of a step, in launch order: its span (first start to end; under PDL a kernel starts early and waits,
so the span includes the wait), and its exposed time, end - max(start, end of every earlier kernel): how far it
pushes the step's end. Exposed times plus idle gaps add up to the step. Writes OUT/decode_step_timeline.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import add_decode_case_args  # noqa: E402  (this folder, on the path above)


@dataclass(frozen=True)
class Kernel:
    name: str
    grid: str
    start_us: float
    end_us: float


def split_steps(kernels: list[Kernel], step_end_marker: str = "sample_kernel") -> list[list[Kernel]]:
    """Kernels in start order, cut after each kernel whose name holds the marker; the pieces before the first marker
    and after the last (possibly partial steps) are dropped."""
    ordered = sorted(kernels, key=lambda k: k.start_us)
    ends = [i for i, k in enumerate(ordered) if step_end_marker in k.name]
    return [ordered[a + 1:b + 1] for a, b in zip(ends, ends[1:])]


def attribute(step: list[Kernel]) -> tuple[list[float], float, float]:
    """Exposed time of each kernel (end beyond every earlier kernel's end, counted from its own start or that end,
    whichever is later), the idle time inside the step, and the step's span from its first start to its last end."""
    exposed: list[float] = []
    idle = 0.0
    frontier = step[0].start_us
    for k in step:
        if k.start_us > frontier:
            idle += k.start_us - frontier
        exposed.append(max(0.0, k.end_us - max(k.start_us, frontier)))
        frontier = max(frontier, k.end_us)
    return exposed, idle, frontier - step[0].start_us


def short_name(name: str) -> str:
    for prefix in ("(anonymous namespace)::", "void ", "deepinfer::cuda::", "moe_detail::", "mla_detail::", "deepinfer::",
                   "<unnamed>::"):
        name = name.replace(prefix, "")
    return name.split("(")[0][:64]


def decode_steps(steps: list[list[Kernel]], count: int) -> list[list[Kernel]]:
    """The last `count` steps that launch as many kernels as most of the trace's last 2 * count steps do: decode steps
    of one batch bucket, without the prefill steps, which launch other kernels."""
    tail = steps[-2 * count:]
    if not tail:
        return []
    sizes = [len(s) for s in tail]
    common = max(set(sizes), key=sizes.count)
    return [s for s in steps if len(s) == common][-count:]


def summarize(steps: list[list[Kernel]]) -> dict:
    """Per kernel (name, grid): calls a step, mean span and mean exposed time a step, averaged over the steps."""
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    walls, idles = [], []
    for step in steps:
        exposed, idle, wall = attribute(step)
        walls.append(wall)
        idles.append(idle)
        for k, x in zip(step, exposed):
            r = rows.setdefault((short_name(k.name), k.grid),
                                {"kernel": short_name(k.name), "grid": k.grid, "calls": 0, "span_us": 0.0,
                                 "exposed_us": 0.0})
            r["calls"] += 1
            r["span_us"] += k.end_us - k.start_us
            r["exposed_us"] += x
    n = max(len(steps), 1)
    table = []
    for r in rows.values():
        table.append({"kernel": r["kernel"], "grid": r["grid"], "calls_per_step": r["calls"] / n,
                      "span_us_per_call": r["span_us"] / max(r["calls"], 1), "exposed_us_per_step": r["exposed_us"] / n})
    table.sort(key=lambda r: -r["exposed_us_per_step"])
    return {"steps": len(steps), "step_us": sum(walls) / n, "idle_us": sum(idles) / n,
            "kernels_per_step": sum(len(s) for s in steps) / n, "kernels": table}


def to_markdown(summary: dict, header: str) -> str:
    lines = [header, "",
             f"- {summary['steps']} steps traced; a step {summary['step_us']:,.1f} us from its first kernel's start to "
             f"its last kernel's end, {summary['kernels_per_step']:.0f} kernels, idle {summary['idle_us']:,.1f} us",
             "- exposed: how far a kernel pushes the step's end past every earlier kernel (exposed + idle = step)", "",
             "| kernel | grid | calls/step | span us/call | exposed us/step | share |", "|---|---|---:|---:|---:|---:|"]
    for r in summary["kernels"]:
        lines.append(f"| {r['kernel']} | {r['grid']} | {r['calls_per_step']:g} | {r['span_us_per_call']:,.2f} | "
                     f"{r['exposed_us_per_step']:,.1f} | {100 * r['exposed_us_per_step'] / summary['step_us']:.1f}% |")
    return "\n".join(lines) + "\n"


def kernels_from_chrome_trace(trace: dict) -> list[Kernel]:
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        grid = e.get("args", {}).get("grid", "")
        out.append(Kernel(e["name"], str(tuple(grid)) if isinstance(grid, list) else str(grid), float(e["ts"]),
                          float(e["ts"]) + float(e["dur"])))
    return out


def trace_decode(args) -> list[Kernel]:
    """Serve `batch` requests of `context` tokens with CUDA graphs for `steps` + 8 tokens, tracing every kernel."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_common import shape_config
    from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
    from engine_bench import write_model_dir

    c = shape_config(args.shape, args.v3_layers)
    rng = np.random.default_rng(0)
    torch.zeros(1, device="cuda")  # the tracer needs a CUDA context in this process before it starts
    # The tracer sees a graph's kernels only when it was on before the graph was made, so it runs from before the
    # engine starts (and captures its graphs) to the end; the decode steps are picked out of the trace afterwards.
    with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CUDA]) as prof:
        model_dir, _ = write_model_dir(Path(tmp), args.shape, c)
        cfg = EngineConfig(model_name_or_path=str(model_dir), load_format="dummy", device="cuda", seed=0,
                           max_model_len=args.context + args.steps + 64, max_num_seqs=max(8, args.batch),
                           gpu_memory_utilization=0.85, enforce_eager=False)
        engine = DeepInferenceEngine(cfg)
        try:
            prompts = [{"prompt_token_ids": rng.integers(2, c["vocab_size"], args.context).tolist()}
                       for _ in range(args.batch)]
            params = SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True)
            engine.generate(prompts, params, use_tqdm=False)
        finally:
            engine.shutdown()
    path = args.out / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = kernels_from_chrome_trace(json.loads(path.read_text()))
    path.unlink()
    return kernels


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decode_case_args(ap)
    ap.add_argument("--steps", type=int, default=12, help="decode steps traced (whole ones are averaged)")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")
    kernels = trace_decode(args)
    steps = decode_steps(split_steps(kernels), args.steps)
    if not steps:
        print(f"{len(kernels)} kernels traced and no whole step among them (graph kernels not traced?)", flush=True)
        return 1
    summary = summarize(steps)
    summary.update({"shape": args.shape, "batch": args.batch, "context": args.context,
                    "env": {k: v for k, v in os.environ.items() if k.startswith("DEEPINFER_DISABLE")}})
    header = (f"# A decode step in CUDA-graph replay, kernel by kernel: shape {args.shape}, batch {args.batch}, "
              f"context {args.context}")
    md = to_markdown(summary, header)
    (args.out / "decode_step_timeline.md").write_text(md)
    (args.out / "decode_step_timeline.json").write_text(json.dumps(summary, indent=1))
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
