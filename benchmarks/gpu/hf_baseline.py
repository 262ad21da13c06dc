"""Hugging Face transformers as the baseline: DeepseekV3ForCausalLM in bf16 on the GPU, random weights.

    python benchmarks/gpu/hf_baseline.py --out OUT_DIR                                   # v2-lite and v3-slice
    python benchmarks/gpu/hf_baseline.py --shapes smoke --device cpu --contexts 64 128 --batches 1 4 --out DIR

Shapes (benchmarks/gpu/bench_common.py): `v2-lite` (DeepSeek-V2-Lite's dims, 27 layers, mapped into a
DeepseekV3Config: q_lora_rank None, one expert group; V3's sigmoid router instead of V2's softmax, which costs the
same) and `v3-slice` (DeepSeek-V3's layer dims with --v3-layers layers, the first 3 dense). The model is built on
the meta device and materialized on the GPU (weights ~ N(0, 0.02), norms 1, routing bias 0, rope buffers
recomputed), so no time goes into CPU initialization. transformers' defaults otherwise: sdpa attention, the
`grouped_mm` experts implementation when available (--experts-impl to pick another), the dynamic cache.

Measured, with CUDA events after warm-up:
- TTFT: the prefill forward of a batch-1 prompt of each --ttft-contexts length (random tokens, logits of the last
  position only), repeated --ttft-repeats times; the minimum and all values are recorded.
- Decode: for each context in --contexts, one batch-1 prefill fills the cache, which is then repeated to each
  --batches size (the cache's own batch_repeat_interleave); then --warmup untimed and up to --steps timed
  single-token steps (greedy argmax fed back), stopping early after --case-s seconds. ms/step is the median step,
  tok/s = batch / mean step time. A case that runs out of memory is recorded as "oom" and the run goes on.
The whole script stops starting new cases after --budget-s seconds (recorded as skipped). Writes
OUT/hf_baseline.json after every case.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (SHAPE_NAMES, V3_SLICE_LAYERS, parameter_count, run_metadata,  # noqa: E402
                          shape_config, write_json)

# config.json fields of the shapes that DeepseekV3Config does not take (V2's names, or V3 fields it derives).
NOT_V3_CONFIG = ("architectures", "model_type", "topk_method", "scoring_func", "moe_layer_freq")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=SHAPE_NAMES, default=["v2-lite", "v3-slice"])
    ap.add_argument("--v3-layers", type=int, default=V3_SLICE_LAYERS, help="layers of v3-slice (first 3 dense)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192], help="decode context lengths")
    ap.add_argument("--ttft-contexts", type=int, nargs="+", default=[1024, 8192], help="TTFT prompt lengths")
    ap.add_argument("--ttft-repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed decode steps per case at most")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decode steps per case")
    ap.add_argument("--case-s", type=float, default=15.0, help="stop a decode case's timed steps after this long")
    ap.add_argument("--budget-s", type=float, default=180.0, help="start no new case after this long (0: no limit)")
    ap.add_argument("--experts-impl", default=None, help="transformers experts implementation (default: its own)")
    ap.add_argument("--attn-impl", default="sdpa", help="transformers attention implementation")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for hf_baseline.json")
    return ap.parse_args(argv)


def build_model(name: str, args, device: torch.device, dtype: torch.dtype):
    """DeepseekV3ForCausalLM of the shape, built on the meta device and materialized on `device`."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    c = shape_config(name, args.v3_layers)
    kwargs = {k: v for k, v in c.items() if k not in NOT_V3_CONFIG}
    if c["model_type"] == "deepseek_v2":  # V2's dense-q attention and ungrouped routing in V3's classes
        kwargs.update(q_lora_rank=None, n_group=1, topk_group=1)
    config = DeepseekV3Config(**kwargs)
    config._attn_implementation = args.attn_impl
    if args.experts_impl:
        config._experts_implementation = args.experts_impl
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=g)
            else:
                p.fill_(1.0)  # RMSNorm weights
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.zero_()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config).to(device)  # inv_freq buffers
    model.eval()
    impl = {"attention": model.config._attn_implementation,
            "experts": getattr(model.config, "_experts_implementation_internal", None)
            or model.config._experts_implementation}
    return model, c, impl


class Timer:
    """Seconds between start() and stop(): CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / 1e3
        return time.perf_counter() - self.t


def run_shape(name: str, args, device, result: dict, t_begin: float, save) -> None:
    from transformers import DynamicCache

    dtype = torch.bfloat16
    entry: dict = {"ttft": [], "decode": []}
    result["shapes"][name] = entry
    t0 = time.perf_counter()
    try:
        model, c, impl = build_model(name, args, device, dtype)
    except torch.OutOfMemoryError as e:
        entry["status"] = f"oom building the model: {str(e)[:200]}"
        save()
        return
    if device.type == "cuda":
        torch.cuda.synchronize()
    entry.update({"config": c, "parameters": parameter_count(c), "build_s": round(time.perf_counter() - t0, 2),
                  "implementation": impl})
    print(f"{name}: built in {entry['build_s']} s ({entry['parameters'] / 1e9:.2f}B parameters, {impl})", flush=True)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    vocab = c["vocab_size"]
    gen = torch.Generator(device=device).manual_seed(args.seed)
    timer = Timer(device)

    def forward(ids: torch.Tensor, cache) -> torch.Tensor:
        return model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kw: cache}).logits[:, -1]

    def prefill(context: int):
        cache = DynamicCache(config=model.config)
        ids = torch.randint(2, vocab, (1, context), device=device, generator=gen)
        timer.start()
        logits = forward(ids, cache)
        logits.argmax(-1)
        return timer.stop(), cache

    def over_budget() -> bool:
        return args.budget_s > 0 and time.perf_counter() - t_begin > args.budget_s

    with torch.no_grad():
        prefill(128)  # warm-up: kernels, cuBLAS handles, the grouped_mm path
        contexts = sorted(set(args.ttft_contexts) | set(args.contexts))
        for context in contexts:
            if over_budget():
                entry["ttft"].append({"context": context, "status": "skipped: time budget"})
                for batch in args.batches if context in args.contexts else []:
                    entry["decode"].append({"batch": batch, "context": context, "status": "skipped: time budget"})
                save()
                continue
            try:
                times, cache = [], None
                for _ in range(max(1, args.ttft_repeats)):
                    cache = None
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    s, cache = prefill(context)
                    times.append(s)
                if context in args.ttft_contexts:
                    entry["ttft"].append({"context": context, "batch": 1, "ttft_ms_min": 1e3 * min(times),
                                          "ttft_ms": [1e3 * s for s in times], "status": "ok"})
                    print(f"{name} TTFT {context:6d}: {1e3 * min(times):9.1f} ms", flush=True)
            except torch.OutOfMemoryError as e:
                cache = None
                if context in args.ttft_contexts:
                    entry["ttft"].append({"context": context, "status": f"oom: {str(e)[:160]}"})
                print(f"{name} TTFT {context}: out of memory", flush=True)
            save()
            if context not in args.contexts:
                continue
            for batch in args.batches:
                row: dict = {"batch": batch, "context": context}
                entry["decode"].append(row)
                if cache is None:
                    row["status"] = "skipped: the prefill ran out of memory"
                    continue
                if over_budget():
                    row["status"] = "skipped: time budget"
                    save()
                    continue
                work = None
                try:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    work = copy.deepcopy(cache)
                    if batch > 1:
                        work.batch_repeat_interleave(batch)
                    tok = torch.randint(2, vocab, (batch, 1), device=device, generator=gen)
                    steps, wall0, t_case = [], None, time.perf_counter()
                    for i in range(args.warmup + args.steps):
                        if i == args.warmup:
                            if device.type == "cuda":
                                torch.cuda.synchronize()
                            wall0 = time.perf_counter()
                        timer.start()
                        tok = forward(tok, work).argmax(-1, keepdim=True)
                        s = timer.stop()
                        if i >= args.warmup:
                            steps.append(s)
                            if len(steps) >= 3 and time.perf_counter() - t_case > args.case_s:
                                break
                    wall = time.perf_counter() - wall0
                    ms = 1e3 * statistics.median(steps)
                    row.update({"status": "ok", "timed_steps": len(steps), "ms_per_step": ms,
                                "ms_per_step_all": [1e3 * s for s in steps],
                                "tokens_per_s": batch * len(steps) / sum(steps),
                                "tokens_per_s_wall": batch * len(steps) / wall})
                    if device.type == "cuda":
                        row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
                    print(f"{name} decode batch {batch:4d} ctx {context:6d}: {ms:9.2f} ms/step, "
                          f"{row['tokens_per_s']:9.1f} tok/s", flush=True)
                except torch.OutOfMemoryError as e:
                    row["status"] = f"oom: {str(e)[:160]}"
                    print(f"{name} decode batch {batch} ctx {context}: out of memory", flush=True)
                finally:
                    work = None
                save()
            cache = None
    model = None  # free the weights before the next shape
    if device.type == "cuda":
        torch.cuda.empty_cache()
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    save()


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("hf_baseline: no CUDA device visible to torch", file=sys.stderr)
        return 1
    torch.manual_seed(args.seed)
    result: dict = {"what": "HF transformers DeepseekV3ForCausalLM, bf16, random weights: TTFT and decode",
                    **run_metadata(), "device": str(device), "torch": torch.__version__,
                    "transformers": transformers.__version__, "settings": vars(args) | {"out": None}, "shapes": {}}
    if device.type == "cuda":
        result["gpu_torch_name"] = torch.cuda.get_device_name(0)
    path = args.out / "hf_baseline.json"

    def save():
        write_json(path, result)

    t_begin = time.perf_counter()
    for name in args.shapes:
        run_shape(name, args, device, result, t_begin, save)
    result["seconds"] = round(time.perf_counter() - t_begin, 1)
    save()
    print(f"hf_baseline: {result['seconds']} s, wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
