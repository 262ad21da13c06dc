#!/usr/bin/env python3
"""Train a small checkpoint with DeepSeek's real attention dimensions, for greedy parity runs on a GPU.

Random weights give near-uniform logits, where bf16 rounding flips greedy choices at almost every step; a model
that has learned some text has clear top choices, so a parity run can tell a bug from rounding. This script trains
one quickly (about a minute on one H200) on tinyshakespeare with the demo model's pieces (tools/train_demo_model.py:
its corpus split, BPE tokenizer, dense training MoE and dropout hooks) and writes it in DeepSeek's layout
(config.json with DeepSeek's field names, model.safetensors in bf16 with one tensor per expert, tokenizer files).

Dimensions: what the CUDA attention kernels take (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128, 16 heads), hidden 512, vocab 4096, 3 layers (1 dense + 2 MoE), 16 routed experts top-4 + 1 shared
of 256; every width a multiple of 32. Two architectures:
  v3  DeepseekV3ForCausalLM: q_lora_rank 384, sigmoid routing with e_score_correction_bias (balanced the V3 way,
      the bias moves after every step), 4 groups / top-2 groups, norm_topk_prob, routed scaling 2.5, YaRN (mscale 1)
  v2  DeepseekV2ForCausalLM: no q_lora, softmax routing with group_limited_greedy (4 groups / top-2), routed
      scaling 2.0, YaRN with mscale 0.707 (as V2-Lite)
No MTP layer. Training: AdamW, bf16 autocast on a GPU, batch x context random windows of the training split, a
cosine schedule over --steps; the validation split's loss every --eval-every steps, and the weights of the best one
are kept (training stops after --patience evaluations without a better one): a model that has memorized the
training text is confidently wrong on held-out text, where a parity run then meets near-ties it did not need to.

Reproducible: the same arguments, torch version and GPU model train the same weights bit for bit (deterministic
algorithms, eager attention, a seeded sampler and dropout, a schedule by steps, never by time), so a failed parity
run can be re-run on the very checkpoint that failed; model.safetensors' sha256 is in the report. --max-train-s
(off by default) bounds the time instead, and the report then says the run is not reproducible.
A JSON report (loss curve, validation and held-out loss, the weights' sha256) is written beside the checkpoint as
train_report.json.

    python tools/train_parity_model.py --arch v3 --output-dir /tmp/parity/v3 --device cuda
    python tools/train_parity_model.py --arch v2 --output-dir /tmp/parity/v2 --device cpu --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mtp import save_deepseek_checkpoint  # noqa: E402
from train_demo_model import (  # noqa: E402
    DEFAULT_DATA,
    add_dropout_hooks,
    set_dense_moe,
    sha256_file,
    split_corpus,
    train_tokenizer,
    write_tokenizer_files,
)

COMMON = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
    "hidden_size": 512, "initializer_range": 0.02, "intermediate_size": 1024, "moe_intermediate_size": 256,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 16,
    "num_key_value_heads": 16, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 4,
    "topk_group": 2, "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 4096,
}
ARCH = {
    "v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": 384,
           "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
           "yarn_mscale": 1.0},
    "v2": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "q_lora_rank": None,
           "scoring_func": "softmax", "topk_method": "group_limited_greedy", "norm_topk_prob": False,
           "routed_scaling_factor": 2.0, "yarn_mscale": 0.707},
}


def config_dict(arch: str, context: int, yarn_factor: float = 4.0) -> dict:
    """config.json in DeepSeek's own field names (transformers and DeepInfer both read it)."""
    spec = dict(ARCH[arch])
    mscale = spec.pop("yarn_mscale")
    return {**COMMON, **spec, "max_position_embeddings": int(context * yarn_factor),
            "rope_scaling": {"type": "yarn", "factor": yarn_factor, "original_max_position_embeddings": context,
                             "beta_fast": 32, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(ARCH), required=True)
    p.add_argument("--output-dir", required=True, help="checkpoint folder (created)")
    p.add_argument("--data", default=DEFAULT_DATA, help="training text (default: tinyshakespeare from ../shared)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps at most (the schedule's length)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between validation losses")
    p.add_argument("--patience", type=int, default=4, help="validation losses without a better one before stopping")
    p.add_argument("--val-tokens", type=int, default=16384, help="validation tokens per evaluation")
    p.add_argument("--max-train-s", type=float, default=0.0,
                   help="training seconds at most (0: no limit; a limit makes the weights depend on the machine)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context", type=int, default=256, help="training context (YaRN's original length)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--bias-update-speed", type=float, default=1e-3, help="V3 aux-loss-free balancing speed")
    p.add_argument("--eval-tokens", type=int, default=32768, help="held-out tokens for the final loss")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--smoke", action="store_true", help="a few tiny steps: checks the pipeline on a CPU")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.context, args.warmup, args.eval_tokens = 30, 4, 64, 3, 2048
        args.eval_every, args.val_tokens = 10, 1024
    return args


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, context: int, device, bf16: bool) -> float:
    """Mean next-token loss over windows of context-1 tokens after BOS (the training MoE: same function)."""
    model.eval()
    span, total, count = context - 1, 0.0, 0
    for start in range(0, len(ids) - 1, span):
        chunk = ids[start: start + span]
        if len(chunk) < 2:
            break
        x = torch.cat([torch.zeros(1, dtype=torch.long), chunk])[None].to(device)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x).logits.float()
        total += F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum").item()
        count += x.shape[1] - 1
    return total / max(1, count)


def make_deterministic() -> None:
    """Bit-reproducible training on one GPU model: cuBLAS with a fixed workspace (set before its first handle) and
    torch's deterministic kernels; an op without one raises instead of training different weights."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    make_deterministic()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    use_cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False

    import transformers
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                              DeepseekV3ForCausalLM)

    transformers.logging.set_verbosity_error()
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    train_text, val_text, test_text = split_corpus(text, 0.025, 0.05)
    tok = train_tokenizer(train_text, COMMON["vocab_size"])

    def ids_of(t: str, limit: int | None = None) -> torch.Tensor:
        return torch.tensor(tok.encode(t, add_special_tokens=False).ids, dtype=torch.long)[:limit]

    train_ids, val_ids, test_ids = ids_of(train_text), ids_of(val_text, args.val_tokens), ids_of(test_text,
                                                                                               args.eval_tokens)
    cfg = config_dict(args.arch, args.context)
    config_cls, model_cls = ((DeepseekV3Config, DeepseekV3ForCausalLM) if args.arch == "v3"
                             else (DeepseekV2Config, DeepseekV2ForCausalLM))
    config = config_cls(**json.loads(json.dumps(cfg)))  # a copy: transformers edits rope_scaling in place
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"  # SDPA's fused backward kernels are not deterministic
    model = model_cls(config).to(device)
    moes = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {n_params / 1e6:.1f}M parameters, {len(train_ids):,} training tokens", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "gate.weight" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "gate.weight" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=use_cuda)
    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train_ids.to(device)
    span = args.context - 1
    offsets = torch.arange(span, device=device)
    bos = torch.zeros(args.batch_size, 1, dtype=torch.long, device=device)
    hooks = add_dropout_hooks(model, None, args.dropout)
    set_dense_moe(moes, True)
    curve, evals, step, timed_out = [], [], 0, False
    best = {"val_loss": math.inf, "step": 0, "state": None}
    if use_cuda:
        torch.cuda.synchronize()
    t_train = time.time()
    for step in range(1, args.steps + 1):
        elapsed = time.time() - t_train
        if args.max_train_s > 0 and elapsed >= args.max_train_s and step > 1:
            step, timed_out = step - 1, True
            break
        progress = (step - 1) / args.steps
        lr = (args.lr * step / args.warmup if step <= args.warmup
              else args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress))))
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        starts = torch.randint(0, len(train_ids) - span, (args.batch_size,), generator=gen).to(device)
        x = torch.cat([bos, train_dev[starts[:, None] + offsets]], dim=1)  # [B, context]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_cuda):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if args.arch == "v3":  # DeepSeek-V3's auxiliary-loss-free balancing
            with torch.no_grad():
                for moe in moes:
                    load = moe._load
                    moe.gate.e_score_correction_bias += args.bias_update_speed * torch.sign(load.mean() - load)
        if step == 1 or step % 50 == 0:
            curve.append({"step": step, "seconds": round(time.time() - t_train, 1), "loss": round(loss.item(), 4),
                          "lr": lr})
            print(f"{args.arch} step {step:5d} loss {loss.item():.4f} lr {lr:.2e} {time.time() - t_train:6.1f}s",
                  flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            val = held_out_loss(model, val_ids, args.context, device, use_cuda)
            evals.append({"step": step, "val_loss": round(val, 4)})
            if val < best["val_loss"]:
                best = {"val_loss": val, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            elif step - best["step"] >= args.patience * args.eval_every:
                print(f"{args.arch} step {step:5d}: validation loss {val:.4f}, best {best['val_loss']:.4f} at step "
                      f"{best['step']}: stopping", flush=True)
                break
    if use_cuda:
        torch.cuda.synchronize()
    train_s = time.time() - t_train
    for h in hooks:
        h.remove()
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    with torch.no_grad():  # the stored weights are bf16: evaluate those
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    test_loss = held_out_loss(model, test_ids, args.context, device, use_cuda)
    set_dense_moe(moes, False)

    out = args.output_dir
    os.makedirs(out, exist_ok=True)
    save_deepseek_checkpoint(model.eval(), None, out, dtype=torch.bfloat16)
    cfg["transformers_version"] = transformers.__version__
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_tokenizer_files(tok, out, cfg["max_position_embeddings"])
    report = {
        "arch": args.arch, "architecture": cfg["architectures"][0], "parameters": n_params,
        "data": {"path_name": os.path.basename(args.data), "sha256": sha256_file(args.data),
                 "train_tokens": len(train_ids), "val_tokens": len(val_ids), "held_out_tokens": len(test_ids)},
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if use_cuda else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "seed": args.seed,
        "steps": step, "best_step": best["step"], "val_loss": round(best["val_loss"], 4),
        "batch_size": args.batch_size, "context": args.context, "reproducible": not timed_out,
        "train_seconds": round(train_s, 1), "held_out_loss": round(test_loss, 4),
        "held_out_perplexity": round(math.exp(test_loss), 2), "curve": curve, "evals": evals,
        "weights_sha256": sha256_file(os.path.join(out, "model.safetensors")),
        "wall_seconds": round(time.time() - t_start, 1), "smoke": args.smoke,
    }
    with open(os.path.join(out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"{args.arch}: {step} steps in {train_s:.1f}s, best at step {best['step']} (validation loss "
          f"{best['val_loss']:.3f}), held-out loss {test_loss:.3f} (perplexity {math.exp(test_loss):.1f}); weights "
          f"sha256 {report['weights_sha256'][:16]}; saved {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
