"""Greedy parity on a trained checkpoint: DeepInfer on the GPU and on the CPU against Hugging Face transformers.

    python benchmarks/gpu/hf_parity.py --out OUT_DIR                      # on a GPU machine
    python benchmarks/gpu/hf_parity.py --smoke --out OUT_DIR              # the whole pipeline on a CPU
    python benchmarks/gpu/hf_parity.py --phase prepare --work W ...       # train + HF references only (no deepinfer)
    python benchmarks/gpu/hf_parity.py --phase compare --work W --out O   # DeepInfer runs + verdict (no torch)

1. Models (tools/train_parity_model.py, both trained at once in two processes): a DeepseekV3ForCausalLM and a
   DeepseekV2ForCausalLM with DeepSeek's real attention dims (kv_lora_rank 512, rope 64, nope 128, v 128, 16 heads:
   what the CUDA kernels take), trained for about a minute on tinyshakespeare so that greedy choices are clear, and
   stored in bf16 safetensors with config.json and tokenizer.
2. Prompts: --prompts stretches of the held-out text (the last 5% of the corpus, never trained on), 10 to 120
   tokens, tokenized with the model's tokenizer (BOS first). Everything below runs on these token ids.
3. References (transformers, on the GPU; on the CPU with --smoke): the checkpoint loaded in fp32 and in bf16
   (experts_implementation="eager"), --new-tokens greedy steps each (argmax of the last position's logits, the whole
   sequence recomputed per step, EOS never stops it). The fp32 run keeps every step's logits.
4. DeepInfer: device="cpu" (fp32) and device="cuda" (bf16), all prompts submitted together, temperature 0,
   max_tokens --new-tokens, ignore_eos.

Pass criterion (printed as PASS/FAIL; the exit status is 1 on FAIL):
- DeepInfer-CPU == HF-fp32 token for token on every prompt: two fp32 implementations of the same math differ by
  ~1e-6 in the logits, far below any greedy gap of a trained model (--cpu-tie-margin relaxes this, default 0).
- DeepInfer-CUDA == HF-bf16 or == HF-fp32 on every prompt, except a divergence that is a bf16 near-tie: at the first
  step where DeepInfer-CUDA leaves the fp32 trajectory, the fp32 top-2 logit gap is below the margin AND the token
  DeepInfer chose is the fp32 runner-up. The margin: a bf16 forward can only flip a choice whose gap is smaller than
  its own error on that gap; transformers' bf16 forward measures that error on the same model and text (teacher-
  forced along the fp32 trajectory: |gap_bf16 - gap_fp32| for the fp32 top-2 tokens at every step). The margin is
  twice the largest such error seen, and at least 0.05 nats (--margin sets a fixed value instead). A real bug
  (a wrong routing, scale or rope) moves logits by far more and shows as divergences at large gaps or to tokens
  that are not the runner-up.
The number of prompts where DeepInfer-CUDA is fully identical to each reference is reported beside the verdict.
Writes OUT/hf_parity.json (per prompt: tokens of all four runs, first divergence, gap and rank there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from bench_common import run_metadata, write_json  # noqa: E402

ARCHS = ("v3", "v2")
PROMPT_CHARS = (40, 200, 80, 400, 20, 120, 300, 60, 160, 240)  # target lengths, cycled


def default_corpus() -> Path:
    for p in (REPO.parent / "shared" / "assets" / "corpora" / "tinyshakespeare.txt",
              REPO / ".data" / "tinyshakespeare.txt"):
        if p.is_file():
            return p
    return REPO / ".data" / "tinyshakespeare.txt"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=["all", "prepare", "compare"], default="all",
                    help="prepare: train + HF references (torch, transformers); compare: DeepInfer runs + verdict")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for hf_parity.json")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for checkpoints and references (default OUT/parity_work)")
    ap.add_argument("--data", type=Path, default=None,
                    help="tinyshakespeare.txt (default ../shared/assets, else .data/)")
    ap.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS))
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per model")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy steps per prompt")
    ap.add_argument("--train-s", type=float, default=60.0, help="training seconds per model (both train at once)")
    ap.add_argument("--train-steps", type=int, default=1500, help="training steps at most per model")
    ap.add_argument("--margin", type=float, default=None, help="fixed near-tie margin in nats (default: measured)")
    ap.add_argument("--min-margin", type=float, default=0.05, help="the measured margin's floor (nats)")
    ap.add_argument("--cpu-tie-margin", type=float, default=0.0,
                    help="accept a DeepInfer-CPU vs HF-fp32 divergence at an fp32 gap below this (default 0: exact)")
    ap.add_argument("--hf-device", default=None,
                    help="device of the transformers runs (default cuda; cpu with --smoke)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU only: tiny training, HF on the CPU, DeepInfer device='cpu' only")
    args = ap.parse_args(argv)
    args.work = args.work or args.out / "parity_work"
    args.data = args.data or default_corpus()
    args.hf_device = args.hf_device or ("cpu" if args.smoke else "cuda")
    return args


# ------------------------------------------------------------------------------------------------- prepare phase


def train_models(args) -> dict:
    """Trains every arch at once (one process each) with tools/train_parity_model.py; returns their reports."""
    procs = {}
    args.work.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 2) // (2 * len(args.archs)))
    for arch in args.archs:
        cmd = [sys.executable, str(REPO / "tools" / "train_parity_model.py"), "--arch", arch,
               "--output-dir", str(args.work / arch), "--data", str(args.data), "--device", args.hf_device,
               "--max-train-s", str(args.train_s), "--steps", str(args.train_steps), "--threads", str(threads)]
        if args.smoke:
            cmd.append("--smoke")
        log = open(args.work / f"train_{arch}.log", "w")
        print("+ " + " ".join(cmd[1:]), flush=True)
        procs[arch] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log)
    reports = {}
    for arch, (proc, log) in procs.items():
        rc = proc.wait()
        log.close()
        text = (args.work / f"train_{arch}.log").read_text()
        print(f"--- training {arch} (exit {rc}), last lines:\n" + "\n".join(text.splitlines()[-3:]), flush=True)
        if rc != 0:
            log_path = args.work / f"train_{arch}.log"
            raise RuntimeError(f"training {arch} failed (exit {rc}); see {log_path}:\n{text[-3000:]}")
        reports[arch] = json.loads((args.work / arch / "train_report.json").read_text())
    return reports


def held_out_prompts(data: Path, count: int) -> list[str]:
    """`count` stretches of the held-out text (the split train_demo_model.py uses), whole lines, varied lengths."""
    sys.path.insert(0, str(REPO / "tools"))
    from train_demo_model import split_corpus

    _, _, test = split_corpus(data.read_text(encoding="utf-8"), 0.025, 0.05)
    starts = [0] + [i + 1 for i, ch in enumerate(test) if ch == "\n"]
    prompts = []
    for i in range(count):
        begin = starts[(len(starts) * i) // count]
        want = PROMPT_CHARS[i % len(PROMPT_CHARS)]
        end = test.find("\n", begin + want)
        text = test[begin: len(test) if end < 0 else end + 1]
        prompts.append(text if text.strip() else test[begin: begin + want])
    return prompts


def hf_references(args, arch: str, prompts: list[str]) -> None:
    """transformers' greedy tokens in fp32 and bf16, the fp32 logits of every step, and bf16's error on the top-2
    gap. Writes WORK/arch/hf_reference.json and hf_fp32_logits.npy."""
    import torch
    from tokenizers import Tokenizer
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    path = args.work / arch
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = [tok.encode(p).ids for p in prompts]  # the post-processor puts BOS first
    device = torch.device(args.hf_device)
    n = args.new_tokens
    ref: dict = {"prompts": prompts, "prompt_ids": ids, "hf_device": str(device)}
    fp32_logits = np.zeros((len(ids), n, 0), dtype=np.float32)
    teacher: dict[str, list[np.ndarray]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation="eager")
        model = model.to(device).eval()
        ref["hf_class"] = type(model).__name__
        tokens, step_logits = [], []
        with torch.no_grad():
            for p in ids:
                seq, out, rows = list(p), [], []
                for _ in range(n):  # greedy: argmax of the raw logits, EOS included, the sequence recomputed
                    logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1].float()
                    t = int(torch.argmax(logits))
                    out.append(t)
                    seq.append(t)
                    rows.append(logits.cpu().numpy())
                tokens.append(out)
                step_logits.append(np.stack(rows))
            ref[f"hf_{name}"] = tokens
            if name == "fp32":
                fp32_logits = np.stack(step_logits)
            # Teacher-forced along the fp32 trajectory: logits of every step in one forward.
            teacher[name] = []
            for p, t in zip(ids, ref["hf_fp32"]):
                full = model(input_ids=torch.tensor([p + t[:-1]], device=device)).logits[0].float()
                teacher[name].append(full[len(p) - 1: len(p) - 1 + n].cpu().numpy())
        ref[f"hf_{name}_seconds"] = round(time.perf_counter() - t0, 2)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # bf16's error on the fp32 top-2 gap, per prompt (max over steps), and the teacher-forced logit error.
    noise, logit_err = [], []
    for l32, l16 in zip(teacher["fp32"], teacher["bf16"]):
        top2 = np.argsort(-l32, axis=1)[:, :2]
        rows = np.arange(len(l32))
        g32 = l32[rows, top2[:, 0]] - l32[rows, top2[:, 1]]
        g16 = l16[rows, top2[:, 0]] - l16[rows, top2[:, 1]]
        noise.append(float(np.abs(g16 - g32).max()))
        logit_err.append(float(np.abs(l16 - l32).max()))
    ref["bf16_gap_error_max_per_prompt"] = noise
    ref["bf16_logit_abs_error_max_per_prompt"] = logit_err
    ref["fp32_logit_abs_max"] = float(np.abs(fp32_logits).max())
    np.save(path / "hf_fp32_logits.npy", fp32_logits)
    (path / "hf_reference.json").write_text(json.dumps(ref))
    print(f"{arch}: HF references done (fp32 {ref['hf_fp32_seconds']} s, bf16 {ref['hf_bf16_seconds']} s); "
          f"bf16 gap error max {max(noise):.4f}, bf16 logit error max {max(logit_err):.4f}", flush=True)


def prepare(args) -> None:
    t0 = time.perf_counter()
    reports = train_models(args)
    prompts = held_out_prompts(args.data, args.prompts)
    for arch in args.archs:
        hf_references(args, arch, prompts)
    (args.work / "prepare_done.json").write_text(json.dumps({"train": reports, "seconds": time.perf_counter() - t0}))
    print(f"prepare: {time.perf_counter() - t0:.1f} s", flush=True)


# ------------------------------------------------------------------------------------------------- compare phase


def deepinfer_tokens(path: Path, device: str, prompt_ids: list[list[int]], n: int) -> tuple[list[list[int]], float]:
    from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams

    cfg = EngineConfig(model_name_or_path=str(path), device=device, max_model_len=512, max_num_seqs=16, seed=0,
                       gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    with DeepInferenceEngine(cfg) as engine:
        t = time.perf_counter()
        outs = engine.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        return [list(o.token_ids) for o in outs], time.perf_counter() - t


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def at_step(logits: np.ndarray, step: int, token: int) -> dict:
    """The fp32 reference at one step: its top-2 gap, and the rank of `token` (0 = the fp32 choice)."""
    row = logits[step]
    top = np.argsort(-row)[:2]
    return {"fp32_top2_gap": float(row[top[0]] - row[top[1]]), "rank_in_fp32": int((row > row[token]).sum()),
            "fp32_top2": [int(top[0]), int(top[1])]}


def compare_model(args, arch: str, cuda: bool) -> dict:
    path = args.work / arch
    ref = json.loads((path / "hf_reference.json").read_text())
    logits = np.load(path / "hf_fp32_logits.npy")
    prompt_ids, n = ref["prompt_ids"], args.new_tokens
    runs, seconds = {}, {}
    runs["cpu"], seconds["deepinfer_cpu"] = deepinfer_tokens(path, "cpu", prompt_ids, n)
    if cuda:
        runs["cuda"], seconds["deepinfer_cuda"] = deepinfer_tokens(path, "cuda", prompt_ids, n)
    noise = max(ref["bf16_gap_error_max_per_prompt"])
    margin = args.margin if args.margin is not None else max(args.min_margin, 2.0 * noise)
    rows = []
    for i, ids in enumerate(prompt_ids):
        f32, b16 = ref["hf_fp32"][i], ref["hf_bf16"][i]
        row: dict = {"prompt": ref["prompts"][i], "prompt_tokens": len(ids), "hf_fp32": f32, "hf_bf16": b16,
                     "deepinfer_cpu": runs["cpu"][i]}
        d = first_divergence(f32, b16)
        row["hf_bf16_vs_fp32"] = {"identical": d is None, "first_divergence": d,
                                  **(at_step(logits[i], d, b16[d]) if d is not None else {})}
        d = first_divergence(f32, runs["cpu"][i])
        cpu = {"identical": d is None, "first_divergence": d}
        if d is not None and d < min(n, len(runs["cpu"][i])):
            cpu.update(at_step(logits[i], d, runs["cpu"][i][d]))
        cpu["ok"] = d is None or (cpu.get("fp32_top2_gap", 1e9) < args.cpu_tie_margin and cpu.get("rank_in_fp32") == 1)
        row["cpu_vs_hf_fp32"] = cpu
        if cuda:
            got = runs["cuda"][i]
            row["deepinfer_cuda"] = got
            d32, d16 = first_divergence(f32, got), first_divergence(b16, got)
            c: dict = {"identical_to_hf_fp32": d32 is None, "identical_to_hf_bf16": d16 is None,
                       "first_divergence_from_fp32": d32, "first_divergence_from_bf16": d16}
            if d32 is not None and d32 < min(n, len(got)):
                c.update(at_step(logits[i], d32, got[d32]))
            c["near_tie"] = d32 is not None and c.get("fp32_top2_gap", 1e9) < margin and c.get("rank_in_fp32") == 1
            c["ok"] = d32 is None or d16 is None or c["near_tie"]
            row["cuda_vs_hf"] = c
        rows.append(row)
    summary = {
        "hf_class": ref["hf_class"], "hf_device": ref["hf_device"], "prompts": len(rows),
        "bf16_gap_error_max": noise, "bf16_logit_abs_error_max": max(ref["bf16_logit_abs_error_max_per_prompt"]),
        "fp32_logit_abs_max": ref["fp32_logit_abs_max"], "margin_nats": margin,
        "margin_source": "fixed (--margin)" if args.margin is not None else
        f"max({args.min_margin}, 2 x the largest HF bf16 error on the fp32 top-2 gap)",
        "hf_bf16_identical_to_fp32": sum(r["hf_bf16_vs_fp32"]["identical"] for r in rows),
        "cpu_identical_to_hf_fp32": sum(r["cpu_vs_hf_fp32"]["identical"] for r in rows),
        "cpu_ok": all(r["cpu_vs_hf_fp32"]["ok"] for r in rows),
        "seconds": {**seconds, "hf_fp32": ref["hf_fp32_seconds"], "hf_bf16": ref["hf_bf16_seconds"]},
    }
    if cuda:
        summary.update({
            "cuda_identical_to_hf_bf16": sum(r["cuda_vs_hf"]["identical_to_hf_bf16"] for r in rows),
            "cuda_identical_to_hf_fp32": sum(r["cuda_vs_hf"]["identical_to_hf_fp32"] for r in rows),
            "cuda_identical_to_either": sum(r["cuda_vs_hf"]["identical_to_hf_bf16"]
                                            or r["cuda_vs_hf"]["identical_to_hf_fp32"] for r in rows),
            "cuda_near_tie_divergences": sum(r["cuda_vs_hf"]["near_tie"] and not (
                r["cuda_vs_hf"]["identical_to_hf_bf16"] or r["cuda_vs_hf"]["identical_to_hf_fp32"]) for r in rows),
            "cuda_ok": all(r["cuda_vs_hf"]["ok"] for r in rows),
        })
    summary["ok"] = summary["cpu_ok"] and summary.get("cuda_ok", True)
    print_table(arch, summary, rows, cuda)
    return {"summary": summary, "prompts": rows}


def fmt_div(d: dict, key: str) -> str:
    if d.get(key) is None:
        return "identical"
    s = f"step {d[key]}"
    if "fp32_top2_gap" in d:
        s += f" gap {d['fp32_top2_gap']:.3f} rank {d['rank_in_fp32']}"
    return s


def print_table(arch: str, s: dict, rows: list[dict], cuda: bool) -> None:
    print(f"\n== {arch} ({s['hf_class']}), margin {s['margin_nats']:.3f} nats "
          f"(HF bf16 gap error max {s['bf16_gap_error_max']:.4f}, logit error max {s['bf16_logit_abs_error_max']:.4f})")
    print(f"{'#':>2} {'len':>4}  {'CPU vs HF-fp32':<28} {'CUDA vs HF-fp32':<30} {'CUDA vs HF-bf16':<12} "
          f"{'HF-bf16 vs fp32':<28} ok")
    for i, r in enumerate(rows):
        c = r.get("cuda_vs_hf", {})
        ok = r["cpu_vs_hf_fp32"]["ok"] and c.get("ok", True)
        cuda32 = fmt_div(c, "first_divergence_from_fp32") if cuda else "-"
        cuda16 = ("identical" if c.get("first_divergence_from_bf16") is None else
                  f"step {c['first_divergence_from_bf16']}") if cuda else "-"
        print(f"{i:>2} {r['prompt_tokens']:>4}  {fmt_div(r['cpu_vs_hf_fp32'], 'first_divergence'):<28} {cuda32:<30} "
              f"{cuda16:<12} {fmt_div(r['hf_bf16_vs_fp32'], 'first_divergence'):<28} {'yes' if ok else 'NO'}")
    line = f"{arch}: CPU == HF-fp32 on {s['cpu_identical_to_hf_fp32']}/{s['prompts']}"
    if cuda:
        line += (f"; CUDA identical to HF-bf16 {s['cuda_identical_to_hf_bf16']}/{s['prompts']}, to HF-fp32 "
                 f"{s['cuda_identical_to_hf_fp32']}/{s['prompts']}, to either {s['cuda_identical_to_either']}/"
                 f"{s['prompts']}, near-tie divergences {s['cuda_near_tie_divergences']}")
    print(line + f"; HF-bf16 == HF-fp32 on {s['hf_bf16_identical_to_fp32']}/{s['prompts']}", flush=True)


def compare(args) -> int:
    done = args.work / "prepare_done.json"
    if not done.is_file():
        print(f"compare: {done} is missing: the prepare phase did not finish", file=sys.stderr)
        return 1
    prep = json.loads(done.read_text())
    from deepinfer import _deepinfer

    gpus = _deepinfer.cuda_device_count()
    cuda = not args.smoke
    result: dict = {"what": "greedy parity of trained DeepSeek-dim checkpoints: DeepInfer (CUDA bf16, CPU fp32) vs "
                            "HF transformers (fp32, bf16)", **run_metadata(), "smoke": args.smoke,
                    "new_tokens": args.new_tokens, "models": {}}
    try:
        import transformers  # noqa: F401  (recorded only; this phase does not run it)
        result["transformers"] = transformers.__version__
    except ImportError:
        pass
    if cuda and gpus == 0:
        result["verdict"] = "FAIL"
        result["error"] = "no CUDA device visible to DeepInfer (or a build without the CUDA backend)"
        write_json(args.out / "hf_parity.json", result)
        print("FAIL: " + result["error"], flush=True)
        return 1
    ok = True
    for arch in args.archs:
        res = compare_model(args, arch, cuda)
        res["train"] = prep["train"].get(arch)
        result["models"][arch] = res
        ok = ok and res["summary"]["ok"]
        write_json(args.out / "hf_parity.json", result)
    result["criterion"] = ("DeepInfer-CPU == HF-fp32 on every prompt (exact); DeepInfer-CUDA == HF-bf16 or HF-fp32 "
                           "on every prompt, or first leaves the fp32 trajectory at an fp32 top-2 gap below the margin "
                           "choosing the fp32 runner-up" + (" (smoke: no CUDA run)" if args.smoke else ""))
    result["verdict"] = "PASS" if ok else "FAIL"
    write_json(args.out / "hf_parity.json", result)
    print(f"\n{result['verdict']}" + (" (smoke: CPU only)" if args.smoke else ""), flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")
    if not args.data.is_file() and args.phase != "compare":
        print(f"corpus not found: {args.data} (pass --data)", file=sys.stderr)
        return 2
    if args.phase in ("all", "prepare"):
        prepare(args)
    if args.phase in ("all", "compare"):
        return compare(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
