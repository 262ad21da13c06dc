"""Where a decode step's time goes, kernel by kernel: Nsight Compute's duration and DRAM bytes of every kernel of one
eager decode step of a DeepSeek shape (random weights), against the step's time and the bytes floor.

    python benchmarks/gpu/decode_step_kernels.py --out OUT [--shape v2-lite] [--batch 1] [--context 1024]

runs itself under `ncu --profile-from-start off` (the engine's load, warm-up and the request's prefill are not
profiled; the profiler starts before the measured decode steps), then writes OUT/decode_step_kernels.{csv,md}.
Nsight Compute serializes the kernels and flushes the caches before each one, so a kernel's figure is its time alone
with cold caches: launch gaps and programmatic-dependent-launch overlap are not in it. The sum over a step against the
step's time in a graph (engine_bench.py) says how much of the step is kernels and how much the gaps between them.

    python benchmarks/gpu/decode_step_kernels.py --out OUT --kernel-regex moe_small_gemm [--launch-count 4]

profiles only the decode-step kernels whose names match (ncu's regex) with every section (`--set full`: warp stall
reasons, occupancy, memory workload, source counters) and writes OUT/kernel_details.ncu-rep and its text report
OUT/kernel_details.txt: why a kernel runs below the bandwidth it should reach.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import add_decode_case_args  # noqa: E402  (this folder, on the path above)

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decode_case_args(ap)
    ap.add_argument("--steps", type=int, default=3, help="decode steps profiled (the last whole one is reported)")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--report-only", type=Path, default=None, help="summarize this ncu CSV log again")
    ap.add_argument("--kernel-regex", default=None,
                    help="instead of the step's table: every Nsight Compute section of the matching kernels")
    ap.add_argument("--launch-count", type=int, default=4, help="with --kernel-regex: launches profiled")
    return ap.parse_args(argv)


def run_child(args) -> int:
    """Inside ncu: load the engine, prefill `batch` requests, then profile `steps` decode steps."""
    import numpy as np
    import torch  # only for cudaProfilerStart/Stop

    from bench_common import shape_config
    from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
    from engine_bench import write_model_dir

    c = shape_config(args.shape, args.v3_layers)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = write_model_dir(Path(tmp), args.shape, c)
        cfg = EngineConfig(model_name_or_path=str(model_dir), load_format="dummy", device="cuda", seed=0,
                           max_model_len=args.context + 64, max_num_seqs=max(8, args.batch),
                           gpu_memory_utilization=0.85, enforce_eager=True)
        engine = DeepInferenceEngine(cfg)
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
            engine.generate([{"prompt_token_ids": rng.integers(2, c["vocab_size"], 16).tolist()}], greedy,
                            use_tqdm=False)  # warm-up
            # The profiler starts once every request has its first token (prefill done) and stops after `steps`
            # more engine steps; the first and the last profiled forward may be cut, the report takes a whole one.
            prompts = [{"prompt_token_ids": rng.integers(2, c["vocab_size"], args.context).tolist()}
                       for _ in range(args.batch)]
            params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
            streams = [engine.submit(p, params) for p in prompts]
            for s in streams:
                next(iter(s))
            begin = engine.stats().num_steps
            torch.cuda.profiler.start()
            while engine.stats().num_steps < begin + args.steps + 1 and not all(s.finished for s in streams):
                time.sleep(0.01)
            torch.cuda.profiler.stop()
            for s in streams:
                s.abort()
        finally:
            engine.shutdown()
    return 0


def read_ncu_csv(text: str) -> list[dict]:
    """ncu --csv --print-units base --page raw: one row per kernel."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    return [r for r in rows if r.get("ID", "").isdigit()]


def number(text: str) -> float:
    """ncu prints thousands separators ("2,912")."""
    return float(text.replace(",", ""))


def short_name(name: str) -> str:
    name = name.split("(")[0]
    for prefix in ("void ", "deepinfer::cuda::", "moe_detail::", "(anonymous namespace)::"):
        name = name.replace(prefix, "")
    return name[:60]


def profiled_window(rows: list[dict]) -> tuple[list[dict], str]:
    """The rows of one whole step (each ends with the sampling kernel) when two steps' ends were profiled; otherwise
    every row (a run cut short: the per-layer averages still hold)."""
    ends = [i for i, r in enumerate(rows) if "sample_kernel" in r["Kernel Name"]]
    if len(ends) >= 2:
        return rows[ends[-2] + 1:ends[-1] + 1], "one whole step"
    return rows, "every profiled kernel (no whole step between two sampling kernels)"


def summarize(rows: list[dict], args) -> str:
    window, what = profiled_window(rows)
    layers = sum(1 for r in window if "mla_prepare" in r["Kernel Name"]) or 1
    per_kernel: "OrderedDict[tuple, dict]" = OrderedDict()
    total_us = total_mb = 0.0
    for r in window:
        us = number(r["gpu__time_duration.sum"]) / 1e3
        mb = (number(r["dram__bytes_read.sum"]) + number(r["dram__bytes_write.sum"])) / 1e6
        key = (short_name(r["Kernel Name"]), r["Grid Size"])
        k = per_kernel.setdefault(key, {"kernel": key[0], "grid": key[1], "calls": 0, "us": 0.0, "mb": 0.0})
        k["calls"] += 1
        k["us"] += us
        k["mb"] += mb
        total_us += us
        total_mb += mb
    table = sorted(per_kernel.values(), key=lambda k: -k["us"])
    lines = ["# A decode step kernel by kernel (Nsight Compute; serialized, caches flushed before each kernel)", "",
             f"- shape {args.shape}, batch {args.batch}, context {args.context}, eager; reported: {what}, "
             f"{len(window)} kernels, {layers} layers (mla_prepare calls)",
             f"- sum of kernel times {total_us:,.1f} us ({total_us / layers:,.1f} us a layer); DRAM bytes "
             f"{total_mb:,.1f} MB ({total_mb / max(total_us, 1e-9):,.2f} TB/s over the kernels' time)", "",
             "| kernel | grid | calls | us/call | us a layer | MB/call | GB/s |", "|---|---|---:|---:|---:|---:|---:|"]
    for k in table:
        lines.append(f"| {k['kernel']} | {k['grid']} | {k['calls']} | {k['us'] / k['calls']:,.2f} | "
                     f"{k['us'] / layers:,.2f} | {k['mb'] / k['calls']:,.2f} | "
                     f"{k['mb'] / max(k['us'], 1e-9) * 1e3:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only is not None:
        return report(args.report_only, args)
    child = [sys.executable, __file__, "--child", "--shape", args.shape, "--v3-layers", str(args.v3_layers), "--batch",
             str(args.batch), "--context", str(args.context), "--steps", str(args.steps), "--out", str(args.out)]
    env = {**os.environ, "DEEPINFER_NO_PROGRESS": "1"}
    if args.kernel_regex is not None:
        return kernel_details(args, child, env)
    raw = args.out / "decode_step_kernels_raw.csv"
    cmd = [args.ncu, "--profile-from-start", "off", "--clock-control", "none", "--metrics", METRICS, "--csv",
           "--print-units", "base", "--page", "raw", "--log-file", str(raw), *child]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        print(f"ncu exited with {rc}; summarizing what it wrote", flush=True)
    return report(raw, args) or rc


def kernel_details(args, child: list[str], env: dict) -> int:
    """Every section of --launch-count launches of the kernels matching --kernel-regex, as a report file and its
    text (the stall reasons of WarpStateStats, the occupancy limiters, the memory tables)."""
    rep = args.out / "kernel_details.ncu-rep"
    cmd = [args.ncu, "--profile-from-start", "off", "--clock-control", "none", "--set", "full", "--kernel-name",
           f"regex:{args.kernel_regex}", "--launch-count", str(args.launch_count), "--force-overwrite", "--export",
           str(rep), *child]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if not rep.exists():
        print(f"ncu exited with {rc} and wrote no report", flush=True)
        return rc or 1
    text = args.out / "kernel_details.txt"
    with text.open("w") as f:
        shown = subprocess.run([args.ncu, "--import", str(rep), "--page", "details", "--print-details", "all"],
                               stdout=f, stderr=subprocess.STDOUT).returncode
    if shown != 0:  # an ncu without --print-details: the default details
        with text.open("w") as f:
            shown = subprocess.run([args.ncu, "--import", str(rep), "--page", "details"], stdout=f,
                                   stderr=subprocess.STDOUT).returncode
    print(f"{text}: {sum(1 for _ in text.open())} lines (ncu {rc}, report {shown})", flush=True)
    return rc or shown


def report(raw: Path, args) -> int:
    rows = read_ncu_csv(raw.read_text()) if raw.exists() else []
    if not rows:
        print(f"no kernel rows in {raw}", flush=True)
        return 1
    md = summarize(rows, args)
    (args.out / "decode_step_kernels.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
