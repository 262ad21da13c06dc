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
- Offline throughput (--sharegpt FILE): the engine benchmark's ShareGPT requests (the first --sharegpt-num first-turn
  prompts in DeepSeek-V3 tokens, truncated as engine_bench.py truncates them for the same --ttft-contexts), each
  generating exactly --sharegpt-output tokens greedily. They go through `model.generate` in static batches of
  --sharegpt-batch in submission order, left-padded: what a transformers user does offline. Requests/s, output
  tok/s and total tok/s are measured over the batches that finished within --sharegpt-s seconds; the row is
  "partial" when that limit or the budget cut it short.
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
                          shape_config, sharegpt_prompt_budget, sharegpt_prompts, write_json)

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
    ap.add_argument("--sharegpt", type=Path, default=None, help="sharegpt_v3_filtered_1000.json: offline throughput")
    ap.add_argument("--sharegpt-num", type=int, default=1000)
    ap.add_argument("--sharegpt-output", type=int, default=256, help="output tokens per ShareGPT request")
    ap.add_argument("--sharegpt-batch", type=int, default=128, help="requests per model.generate call")
    ap.add_argument("--sharegpt-s", type=float, default=240.0, help="start no batch after this many seconds")
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


def sharegpt_offline(model, c: dict, args, device, over_budget, publish) -> dict:
    """The ShareGPT requests through model.generate in static batches (see the module docstring). publish(row) is
    called after every batch, so a run cut short keeps what finished."""
    try:
        prompts, info = sharegpt_prompts(args.sharegpt, args.sharegpt_num, c["vocab_size"],
                                         sharegpt_prompt_budget(c, args.ttft_contexts, args.sharegpt_output))
    except Exception as e:  # noqa: BLE001 - no tokenizer or no prompt file: the row says why
        return {"status": f"skipped: {type(e).__name__}: {str(e)[:200]}"}
    n_out, pad = args.sharegpt_output, 2  # padding is masked out; 2 is neither BOS nor EOS
    row: dict = {**info, "output_tokens_per_request": n_out, "batch_size": args.sharegpt_batch,
                 "method": "model.generate, greedy, min_new_tokens = max_new_tokens, static batches in submission "
                           "order, left padding"}
    done = prompt_tokens = output_tokens = 0
    wall = 0.0
    t0 = time.perf_counter()
    status = "ok"
    for first in range(0, len(prompts), args.sharegpt_batch):
        if time.perf_counter() - t0 > args.sharegpt_s or over_budget():
            status = f"partial: time limit after {done} of {len(prompts)} requests"
            break
        batch = prompts[first:first + args.sharegpt_batch]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for j, p in enumerate(batch):
            ids[j, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[j, width - len(p):] = 1
        try:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=n_out,
                                 min_new_tokens=n_out, do_sample=False, pad_token_id=pad, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall += time.perf_counter() - t
        except torch.OutOfMemoryError as e:
            status = f"oom at request {first}: {str(e)[:160]}"
            break
        generated = out.shape[1] - width
        if generated != n_out:
            status = f"error: a batch generated {generated} tokens a request, not {n_out}"
            break
        done += len(batch)
        prompt_tokens += sum(len(p) for p in batch)
        output_tokens += len(batch) * generated
        print(f"sharegpt: {done} of {len(prompts)} requests, {wall:.1f} s of generate", flush=True)
        tally(row, f"partial: {done} of {len(prompts)} requests so far" if done < len(prompts) else status, done,
              prompt_tokens, output_tokens, wall)
        publish(row)
    tally(row, status, done, prompt_tokens, output_tokens, wall)
    return row


def tally(row: dict, status: str, done: int, prompt_tokens: int, output_tokens: int, wall: float) -> None:
    row.update({"status": status, "completed_requests": done, "completed_prompt_tokens": prompt_tokens,
                "output_tokens_total": output_tokens, "wall_s": wall})
    if done and wall > 0:
        row.update({"requests_per_s": done / wall, "output_tokens_per_s": output_tokens / wall,
                    "total_tokens_per_s": (prompt_tokens + output_tokens) / wall})


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
        if args.sharegpt is not None:
            if over_budget():
                entry["sharegpt"] = {"status": "skipped: time budget"}
            else:
                def publish(row: dict) -> None:
                    entry["sharegpt"] = row
                    save()

                entry["sharegpt"] = sharegpt_offline(model, c, args, device, over_budget, publish)
                sg = entry["sharegpt"]
                if sg.get("requests_per_s"):
                    print(f"{name} ShareGPT x{sg['completed_requests']}: {sg['requests_per_s']:.2f} req/s, "
                          f"{sg['output_tokens_per_s']:,.0f} output tok/s ({sg['status']})", flush=True)
            save()
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
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"out": None}
    result: dict = {"what": "HF transformers DeepseekV3ForCausalLM, bf16, random weights: TTFT, decode, offline "
                            "throughput",
                    **run_metadata(), "device": str(device), "torch": torch.__version__,
                    "transformers": transformers.__version__, "settings": settings, "shapes": {}}
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
