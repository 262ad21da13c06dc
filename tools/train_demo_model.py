#!/usr/bin/env python3
"""Train DeepInfer's embedded demo model: a small DeepSeek-V3-architecture model with one MTP layer.

Architecture: transformers' DeepseekV3ForCausalLM (MLA with q_lora, dense first layer, then MoE layers
with a shared expert and 16 sigmoid-routed experts in 4 groups, YaRN rope) plus one multi-token
prediction layer (tools/mtp.py). Data: tinyshakespeare; the last 5% of the text is the held-out test
set, the 2.5% before it a validation set used only to pick the checkpoint; the rest is training text.
A byte-level BPE tokenizer (HF `tokenizers`) is trained on the training text.

Routing is balanced the DeepSeek-V3 way: no auxiliary loss on the main objective except a very small
sequence-wise balance loss; after every optimizer step each MoE layer's `e_score_correction_bias`
moves by `gamma * sign(mean_load - load)` (auxiliary-loss-free balancing).

Outputs: the checkpoint directory in DeepSeek's layout (config.json, generation_config.json,
model.safetensors in bf16, tokenizer.json, tokenizer_config.json), and a JSON + Markdown report with
the held-out loss / perplexity, MTP next-next-token accuracy, greedy samples and the load checks.

    python tools/train_demo_model.py --device cuda          # the shipped run (see tools/README.md)
    python tools/train_demo_model.py --device cpu --smoke   # a minute-long pipeline check
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mtp import (
    MTPLayer,
    forward_with_mtp,
    load_mtp_layer,
    mtp_losses,
    save_deepseek_checkpoint,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(REPO, "..", "shared", "assets", "corpora", "tinyshakespeare.txt")

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SPECIAL_TOKENS = [BOS, EOS, PAD, USER, ASSISTANT]  # ids 0..4

# A simple DeepSeek-V3-like chat template (system text after BOS, then User/Assistant turns).
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{{ message['content'] }}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)

SAMPLE_PROMPTS = [
    "ROMEO:\n",
    "JULIET:\nO Romeo, Romeo,",
    "First Citizen:\nBefore we proceed any further,",
    "KING RICHARD III:\nNow is the",
    "To be, or not to be",
    "The king is dead",
]
CHAT_PROMPT = "Who art thou, and whence comest thou?"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA, help="training text (default: tinyshakespeare from ../shared)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--steps", type=int, default=600, help="planned optimizer steps (the LR schedule's length)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context", type=int, default=512, help="training context in tokens (BOS included)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=1e-4, help="final learning rate of the cosine decay")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.2, help="residual/embedding dropout while training")
    p.add_argument("--mtp-lambda", type=float, default=0.3, help="weight of the MTP loss")
    p.add_argument("--bias-update-speed", type=float, default=1e-3, help="gamma of aux-loss-free balancing")
    p.add_argument("--seq-aux-alpha", type=float, default=1e-4, help="sequence-wise balance loss weight")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--patience", type=int, default=50, help="stop after this many evals without improvement")
    p.add_argument("--max-train-minutes", type=float, default=0.0, help="stop training after this long (0: no limit)")
    p.add_argument("--eval-max-tokens", type=int, default=0, help="cap held-out tokens per eval (0: all)")
    p.add_argument("--val-fraction", type=float, default=0.025)
    p.add_argument("--test-fraction", type=float, default=0.05)
    p.add_argument("--sample-tokens", type=int, default=60)
    # Model shape.
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--moe-intermediate-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dense-layers", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-lora-rank", type=int, default=128)
    p.add_argument("--kv-lora-rank", type=int, default=128)
    p.add_argument("--qk-nope-head-dim", type=int, default=32)
    p.add_argument("--qk-rope-head-dim", type=int, default=32)
    p.add_argument("--v-head-dim", type=int, default=32)
    p.add_argument("--routed-experts", type=int, default=16)
    p.add_argument("--shared-experts", type=int, default=1)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--topk-groups", type=int, default=2)
    p.add_argument("--routed-scaling-factor", type=float, default=2.5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--yarn-factor", type=float, default=4.0, help="YaRN factor; max positions = factor * context")
    # Outputs.
    p.add_argument("--output-dir", default=os.path.join(REPO, "python", "deepinfer", "default_model"))
    p.add_argument("--results-json", default=os.path.join(REPO, "benchmarks", "results", "demo_model_training.json"))
    p.add_argument("--results-md", default=os.path.join(REPO, "benchmarks", "results", "demo_model_training.md"))
    p.add_argument("--smoke", action="store_true", help="tiny, fast settings to check the whole pipeline")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.context, args.eval_every = 6, 4, 64, 3
        args.eval_max_tokens, args.sample_tokens, args.warmup = 1500, 12, 2
    return args


# ---------------------------------------------------------------------------------------------
# Data and tokenizer


def split_corpus(text: str, val_fraction: float, test_fraction: float):
    """train | val | test, cut at line starts: test is the last `test_fraction` of the characters."""

    def line_start(pos: int) -> int:
        nl = text.find("\n", pos)
        return len(text) if nl < 0 else nl + 1

    test_start = line_start(int(len(text) * (1.0 - test_fraction)))
    val_start = line_start(int(len(text) * (1.0 - test_fraction - val_fraction)))
    return text[:val_start], text[val_start:test_start], text[test_start:]


def train_tokenizer(train_text: str, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Digits in runs of at most 3 (as DeepSeek's tokenizer does), then GPT-2 style byte-level pieces.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train_text], trainer=trainer)
    # Every encode starts with BOS (what `add_bos_token` asks for), in `tokenizers` and transformers alike.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, 0)]),
        ]
    )
    return tok


def write_tokenizer_files(tok, out_dir: str, model_max_length: int):
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    # As in DeepSeek-V3's tokenizer, the chat-role markers are added tokens but not "special"
    # (skip_special_tokens keeps them); BOS/EOS/pad are special.
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    for added in spec["added_tokens"]:
        if added["content"] in (USER, ASSISTANT):
            added["special"] = False
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Model


def model_config_dict(args) -> dict:
    """config.json in DeepSeek-V3's own field names (transformers reads it as-is)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": args.seq_aux_alpha,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": args.dense_layers,
        "hidden_act": "silu",
        "hidden_size": args.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": args.intermediate_size,
        "kv_lora_rank": args.kv_lora_rank,
        "max_position_embeddings": int(args.context * args.yarn_factor),
        "moe_intermediate_size": args.moe_intermediate_size,
        "moe_layer_freq": 1,
        "n_group": args.groups,
        "n_routed_experts": args.routed_experts,
        "n_shared_experts": args.shared_experts,
        "norm_topk_prob": True,
        "num_attention_heads": args.heads,
        "num_experts_per_tok": args.top_k,
        "num_hidden_layers": args.layers,
        "num_key_value_heads": args.heads,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": args.q_lora_rank,
        "qk_nope_head_dim": args.qk_nope_head_dim,
        "qk_rope_head_dim": args.qk_rope_head_dim,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": args.yarn_factor,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": args.context,
            "type": "yarn",
        },
        "rope_theta": args.rope_theta,
        "routed_scaling_factor": args.routed_scaling_factor,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": args.topk_groups,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": args.v_head_dim,
        "vocab_size": args.vocab_size,
    }


def moe_modules(model, mtp):
    layers = list(model.model.layers) + ([mtp.block] if mtp is not None else [])
    return [layer.mlp for layer in layers if hasattr(layer.mlp, "gate")]


def dense_moe_forward(self, hidden_states):
    """Training forward of a DeepseekV3MoE: the same function as transformers' sparse one (same router,
    same experts, same weights), computed densely over all experts (two large GEMMs, a zero combine
    weight for unselected experts), which is much faster for a model this small. Records the expert
    load and the sequence-wise balance loss for the training loop."""
    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)  # [N, H]
    with torch.autocast(device_type=x.device.type, enabled=False):
        router_logits, topk_weights, topk_idx = self.gate(x.float())  # [N, E], [N, K], [N, K]
    experts = self.experts
    num_experts, inter = experts.num_experts, experts.intermediate_dim
    combine = torch.zeros_like(router_logits).scatter(1, topk_idx, topk_weights)  # [N, E]
    gate_up = x @ experts.gate_up_proj.reshape(num_experts * 2 * inter, hidden).t()  # [N, E*2I]
    gate_up = gate_up.view(-1, num_experts, 2 * inter)
    act = experts.act_fn(gate_up[..., :inter]) * gate_up[..., inter:]  # [N, E, I]
    act = act * combine.unsqueeze(-1).to(act.dtype)
    down = experts.down_proj.transpose(1, 2).reshape(num_experts * inter, hidden)  # [E*I, H]
    out = (act.reshape(-1, num_experts * inter) @ down).view(batch, seq, hidden)
    out = out + self.shared_experts(hidden_states)

    with torch.no_grad():
        self._load = torch.bincount(topk_idx.reshape(-1), minlength=num_experts).float()
    if self.training and getattr(self, "_seq_aux_alpha", 0.0) > 0:
        # DeepSeek-V3 eq. 17-20: f_i = E/(K*T) * count_i per sequence, P_i = mean_t normalized score.
        top_k = topk_idx.shape[-1]
        scores = router_logits.sigmoid()
        probs = (scores / scores.sum(-1, keepdim=True)).view(batch, seq, num_experts).mean(1)  # [B, E]
        counts = torch.zeros(batch, num_experts, device=x.device).scatter_add_(
            1, topk_idx.view(batch, seq * top_k), torch.ones(batch, seq * top_k, device=x.device)
        )
        frac = counts * (num_experts / (top_k * seq))
        self._aux = (frac * probs).sum(-1).mean()
    else:
        self._aux = None
    return out


def set_dense_moe(moes, enabled: bool, seq_aux_alpha: float = 0.0):
    for moe in moes:
        if enabled:
            moe.forward = types.MethodType(dense_moe_forward, moe)
            moe._seq_aux_alpha = seq_aux_alpha
        elif "forward" in moe.__dict__:
            del moe.forward  # back to transformers' own DeepseekV3MoE.forward


def add_dropout_hooks(model, mtp, p: float):
    """Dropout on the embedding output and on each attention / MLP branch, in training mode only."""
    if p <= 0:
        return []

    def hook(module, inputs, output):
        if not module.training:
            return None
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, True),) + tuple(output[1:])
        return F.dropout(output, p, True)

    targets = [model.model.embed_tokens]
    for layer in list(model.model.layers) + ([mtp.block] if mtp is not None else []):
        targets += [layer.self_attn, layer.mlp]
    return [m.register_forward_hook(hook) for m in targets]


def count_params(model, mtp, cfg) -> dict:
    main = sum(p.numel() for p in model.parameters())
    mtp_n = sum(p.numel() for p in mtp.parameters())
    per_expert = 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"]
    inactive_per_moe = (cfg["n_routed_experts"] - cfg["num_experts_per_tok"]) * per_expert
    n_moe_main = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    embed = cfg["vocab_size"] * cfg["hidden_size"]
    return {
        "main_model": main,
        "mtp_layer_unique": mtp_n,
        "total_unique": main + mtp_n,
        "mtp_layer_with_shared_copies": mtp_n + 2 * embed,
        "main_activated_per_token": main - n_moe_main * inactive_per_moe - embed,
    }


# ---------------------------------------------------------------------------------------------
# Evaluation


def windows(ids: torch.Tensor, context: int, bos: int):
    """Non-overlapping windows of context-1 tokens, each prefixed with BOS."""
    step = context - 1
    out = []
    for start in range(0, len(ids), step):
        chunk = ids[start : start + step]
        if len(chunk) < 2:
            break
        out.append(torch.cat([torch.tensor([bos], dtype=ids.dtype), chunk]))
    return out


@torch.no_grad()
def evaluate(model, mtp, ids: torch.Tensor, context: int, device, batch_size: int, bf16: bool):
    """Main / MTP cross-entropy and accuracies over every predicted token of the held-out stream."""
    model.eval()
    if mtp is not None:
        mtp.eval()
    sums = dict(main_nll=0.0, main_n=0, main_correct=0, mtp_nll=0.0, mtp_n=0, mtp_correct=0, mtp_agree=0)
    wins = windows(ids, context, bos=0)
    groups = {}
    for w in wins:
        groups.setdefault(len(w), []).append(w)
    for _, group in sorted(groups.items()):
        for i in range(0, len(group), batch_size):
            x = torch.stack(group[i : i + batch_size]).to(device)
            with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits, mtp_logits = forward_with_mtp(model, mtp, x)
            logits = logits.float()
            vocab = logits.shape[-1]
            tgt = x[:, 1:]
            sums["main_nll"] += F.cross_entropy(
                logits[:, :-1].reshape(-1, vocab), tgt.reshape(-1), reduction="sum"
            ).item()
            sums["main_n"] += tgt.numel()
            main_pred = logits.argmax(-1)  # [B, T]
            sums["main_correct"] += (main_pred[:, :-1] == tgt).sum().item()
            if mtp_logits is not None:
                mtp_logits = mtp_logits.float()
                tgt2 = x[:, 2:]
                sums["mtp_nll"] += F.cross_entropy(
                    mtp_logits.reshape(-1, vocab), tgt2.reshape(-1), reduction="sum"
                ).item()
                sums["mtp_n"] += tgt2.numel()
                mtp_pred = mtp_logits.argmax(-1)  # [B, T-2]
                sums["mtp_correct"] += (mtp_pred == tgt2).sum().item()
                # Would a greedy verifier accept the draft? The main model's own prediction of t_{i+2}
                # given the true t_{i+1} is main_pred[:, i+1].
                sums["mtp_agree"] += (mtp_pred == main_pred[:, 1:-1]).sum().item()
    res = {
        "tokens": sums["main_n"],
        "windows": len(wins),
        "context": context,
        "main_loss": sums["main_nll"] / sums["main_n"],
        "main_top1_accuracy": sums["main_correct"] / sums["main_n"],
    }
    res["perplexity"] = math.exp(res["main_loss"])
    if sums["mtp_n"]:
        res["mtp_loss"] = sums["mtp_nll"] / sums["mtp_n"]
        res["mtp_next_next_token_top1_accuracy"] = sums["mtp_correct"] / sums["mtp_n"]
        res["mtp_agrees_with_main_greedy"] = sums["mtp_agree"] / sums["mtp_n"]
        res["mtp_tokens"] = sums["mtp_n"]
    return res


def greedy(model, tokenizer, prompts, max_new_tokens, device):
    outs = []
    for prompt in prompts:
        # A chat-template prompt already starts with BOS.
        enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=not prompt.startswith(BOS))
        ids = enc["input_ids"].to(device)
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=1,
            pad_token_id=2,
        )
        outs.append(gen[0, ids.shape[1] :].tolist())
    return outs


@torch.no_grad()
def top2_margin(model, tokenizer, prompt, tokens, position):
    """fp32 logit gap between the best and second-best next token after prompt + tokens[:position]."""
    enc = tokenizer(prompt, add_special_tokens=not prompt.startswith(BOS))["input_ids"]
    ids = torch.tensor([enc + tokens[:position]])
    top = model(input_ids=ids).logits[0, -1].float().topk(2).values
    return (top[0] - top[1]).item()


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    use_cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    transformers.logging.set_verbosity_error()

    # ---- data + tokenizer
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    train_text, val_text, test_text = split_corpus(text, args.val_fraction, args.test_fraction)
    tok = train_tokenizer(train_text, args.vocab_size)
    encode = lambda s: torch.tensor(tok.encode(s, add_special_tokens=False).ids, dtype=torch.long)
    train_ids, val_ids, test_ids = encode(train_text), encode(val_text), encode(test_text)
    if args.eval_max_tokens:
        val_ids, test_ids = val_ids[: args.eval_max_tokens], test_ids[: args.eval_max_tokens]
    data_info = {
        "corpus": "tinyshakespeare.txt (shared/assets/corpora)",
        "sha256": sha256_file(args.data),
        "characters": len(text),
        "split": "train | val | test by characters, cut at line starts; test = last "
        f"{args.test_fraction:.1%}, val = the {args.val_fraction:.1%} before it (checkpoint selection only)",
        "train_characters": len(train_text),
        "val_characters": len(val_text),
        "test_characters": len(test_text),
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "test_tokens": len(test_ids),
        "tokenizer": f"byte-level BPE (HF tokenizers), vocab {tok.get_vocab_size()}, trained on the train split",
        "train_characters_per_token": len(train_text) / len(train_ids),
    }
    print(f"data: {json.dumps(data_info)}", flush=True)

    # ---- model
    cfg_dict = model_config_dict(args)
    config = DeepseekV3Config(**json.loads(json.dumps(cfg_dict)))  # a copy: transformers edits rope_scaling in place
    config._experts_implementation = "eager"  # transformers' reference MoE path for every non-training forward
    model = DeepseekV3ForCausalLM(config).to(device)
    mtp = MTPLayer(config).to(device)
    mtp.apply(model._init_weights)
    moes = moe_modules(model, mtp)
    params = count_params(model, mtp, cfg_dict)
    print(f"params: {params}", flush=True)

    # The dense training MoE must compute the same function as transformers' own forward.
    probe = torch.randint(5, args.vocab_size, (2, min(64, args.context)), device=device)
    model.eval()
    mtp.eval()
    with torch.no_grad():
        ref = forward_with_mtp(model, mtp, probe)
        set_dense_moe(moes, True)
        dense = forward_with_mtp(model, mtp, probe)
        set_dense_moe(moes, False)
    dense_check = max((a - b).abs().max().item() for a, b in zip(ref, dense))
    print(f"dense-vs-sparse MoE max |logit diff| (fp32): {dense_check:.2e}", flush=True)
    assert dense_check < 1e-3, dense_check

    # ---- optimizer
    decay, no_decay = [], []
    for module in (model, mtp):
        for name, p in module.named_parameters():
            (decay if p.ndim >= 2 and "gate.weight" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=use_cuda,
    )

    def lr_at(step):
        if step <= args.warmup:
            return args.lr * step / max(1, args.warmup)
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))

    gen = torch.Generator().manual_seed(args.seed)
    train_ids_dev = train_ids.to(device)
    span = args.context - 1
    bos_col = torch.zeros(args.batch_size, 1, dtype=torch.long, device=device)
    offsets_base = torch.arange(span, device=device)

    def get_batch():
        starts = torch.randint(0, len(train_ids) - span, (args.batch_size,), generator=gen).to(device)
        return torch.cat([bos_col, train_ids_dev[starts[:, None] + offsets_base]], dim=1)  # [B, context]

    # ---- train
    hooks = add_dropout_hooks(model, mtp, args.dropout)
    curve, best, best_val, evals_since_best = [], None, float("inf"), 0
    load_window = torch.zeros(len(moes), args.routed_experts, device=device)
    step, stop_reason = 0, "planned steps done"
    if use_cuda:
        torch.cuda.synchronize()
    t_train = time.time()
    run_main = run_mtp = 0.0
    for step in range(1, args.steps + 1):
        model.train()
        mtp.train()
        set_dense_moe(moes, True, args.seq_aux_alpha)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = get_batch()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_cuda):
            logits, mtp_logits = forward_with_mtp(model, mtp, x)
            main_loss, mtp_loss = mtp_losses(logits, mtp_logits, x)
            loss = main_loss + args.mtp_lambda * mtp_loss
            if args.seq_aux_alpha > 0:
                loss = loss + args.seq_aux_alpha * sum(m._aux for m in moes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()), args.grad_clip)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3 section 2.1.2)
            for i, moe in enumerate(moes):
                load = moe._load
                moe.gate.e_score_correction_bias += args.bias_update_speed * torch.sign(load.mean() - load)
                frac = load / load.sum()
                load_window[i] = frac if step == 1 else 0.98 * load_window[i] + 0.02 * frac
        run_main = 0.9 * run_main + 0.1 * main_loss.item() if step > 1 else main_loss.item()
        run_mtp = 0.9 * run_mtp + 0.1 * mtp_loss.item() if step > 1 else mtp_loss.item()
        elapsed = time.time() - t_train
        if step % 50 == 0 or step == 1:
            print(
                f"step {step:5d} lr {lr_at(step):.2e} main {run_main:.4f} mtp {run_mtp:.4f} {elapsed:7.1f}s", flush=True
            )
        over_time = args.max_train_minutes > 0 and elapsed > 60 * args.max_train_minutes
        if step % args.eval_every == 0 or step == args.steps or over_time:
            set_dense_moe(moes, True)
            val = evaluate(model, mtp, val_ids, args.context, device, args.batch_size, bf16=use_cuda)
            point = {
                "step": step,
                "seconds": round(time.time() - t_train, 1),
                "train_main_loss_ema": round(run_main, 4),
                "train_mtp_loss_ema": round(run_mtp, 4),
                "val_main_loss": round(val["main_loss"], 4),
                "val_mtp_loss": round(val["mtp_loss"], 4),
                "val_mtp_accuracy": round(val["mtp_next_next_token_top1_accuracy"], 4),
                "max_over_mean_expert_load": [
                    round(v, 3) for v in (load_window.max(1).values * args.routed_experts).tolist()
                ],
            }
            curve.append(point)
            print(f"eval {json.dumps(point)}", flush=True)
            if val["main_loss"] < best_val:
                best_val, evals_since_best = val["main_loss"], 0
                best = (
                    step,
                    {k: v.detach().clone() for k, v in model.state_dict().items()},
                    {k: v.detach().clone() for k, v in mtp.state_dict().items()},
                )
            else:
                evals_since_best += 1
            if evals_since_best >= args.patience:
                stop_reason = f"early stop: no validation improvement in {args.patience} evals"
                break
            if over_time:
                stop_reason = f"time limit of {args.max_train_minutes} min"
                break
    if use_cuda:
        torch.cuda.synchronize()
    train_seconds = time.time() - t_train
    steps_run = step
    for h in hooks:
        h.remove()
    set_dense_moe(moes, False)

    # ---- the shipped weights: the best validation step, rounded to bf16
    best_step, model_state, mtp_state = best
    model.load_state_dict(model_state)
    mtp.load_state_dict(mtp_state)
    with torch.no_grad():
        for module in (model, mtp):
            for name, p in module.named_parameters():
                p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    mtp.eval()

    # ---- save
    out = args.output_dir
    os.makedirs(out, exist_ok=True)
    for stale in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        if os.path.exists(os.path.join(out, stale)):
            os.remove(os.path.join(out, stale))
    saved = save_deepseek_checkpoint(model, mtp, out, dtype=torch.bfloat16)
    cfg_dict["transformers_version"] = transformers.__version__
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(
            {
                "bos_token_id": 0,
                "eos_token_id": 1,
                "pad_token_id": 2,
                "do_sample": True,
                "temperature": 0.8,
                "top_p": 0.95,
            },
            f,
            indent=2,
        )
    write_tokenizer_files(tok, out, cfg_dict["max_position_embeddings"])
    files = {name: os.path.getsize(os.path.join(out, name)) for name in sorted(os.listdir(out))}
    print(f"saved {files} total {sum(files.values())} bytes", flush=True)

    # ---- reload through transformers, check, evaluate, sample
    verification = {"dense_vs_sparse_moe_max_abs_logit_diff_fp32": dense_check}
    loaded_cpu, info = DeepseekV3ForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True, experts_implementation="eager"
    )
    loaded_cpu.eval()
    mtp_prefix = f"model.layers.{config.num_hidden_layers}."
    verification["hf_missing_keys"] = sorted(info["missing_keys"])
    verification["hf_unexpected_keys_all_mtp"] = all(k.startswith(mtp_prefix) for k in info["unexpected_keys"])
    verification["hf_mismatched_keys"] = [str(k) for k in info.get("mismatched_keys", [])]
    assert not info["missing_keys"], info["missing_keys"]
    verification["mtp_stored_tensors"] = sum(1 for k in saved if k.startswith(mtp_prefix))
    verification["mtp_embed_and_head_copies_equal_main"] = bool(
        torch.equal(saved[mtp_prefix + "embed_tokens.weight"], saved["model.embed_tokens.weight"])
        and torch.equal(saved[mtp_prefix + "shared_head.head.weight"], saved["lm_head.weight"])
    )
    mtp_cpu = load_mtp_layer(loaded_cpu.config, out, dtype=torch.float32).eval()

    hf_tok = AutoTokenizer.from_pretrained(out)
    raw_tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    chat_text = hf_tok.apply_chat_template(
        [{"role": "user", "content": CHAT_PROMPT}], tokenize=False, add_generation_prompt=True
    )
    prompts = SAMPLE_PROMPTS + [chat_text]
    tok_ok = all(hf_tok(p)["input_ids"] == raw_tok.encode(p).ids for p in SAMPLE_PROMPTS)
    chat_ids = hf_tok(chat_text, add_special_tokens=False)["input_ids"]
    verification["tokenizer_hf_equals_tokenizers_lib"] = tok_ok
    verification["tokenizer_bos_prepended"] = hf_tok("ROMEO:")["input_ids"][0] == 0
    verification["chat_template_renders"] = chat_text
    verification["chat_template_ids_start"] = chat_ids[:3]

    # In-memory (trained) model vs checkpoint loaded by transformers: same device, same dtype.
    model_cpu = model.to("cpu").float().eval()
    mtp_mem_cpu = mtp.to("cpu").float().eval()
    probe = torch.cat([torch.zeros(1, 1, dtype=torch.long), test_ids[None, : min(255, len(test_ids))]], dim=1)
    with torch.no_grad():
        a_main, a_mtp = forward_with_mtp(model_cpu, mtp_mem_cpu, probe)
        b_main, b_mtp = forward_with_mtp(loaded_cpu, mtp_cpu, probe)
    verification["inmemory_vs_loaded_cpu_fp32_max_abs_logit_diff"] = (a_main - b_main).abs().max().item()
    verification["inmemory_vs_loaded_cpu_fp32_mtp_max_abs_logit_diff"] = (a_mtp - b_mtp).abs().max().item()
    n_new = args.sample_tokens
    mem_tokens = greedy(model_cpu, hf_tok, prompts, n_new, "cpu")
    cpu_tokens = greedy(loaded_cpu, hf_tok, prompts, n_new, "cpu")
    verification["greedy_inmemory_equals_loaded_cpu_fp32"] = [m == c for m, c in zip(mem_tokens, cpu_tokens)]
    if use_cuda:
        loaded_gpu = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.bfloat16, experts_implementation="eager")
        loaded_gpu = loaded_gpu.to(device).eval()
        gpu_tokens = greedy(loaded_gpu, hf_tok, prompts, n_new, device)
        matches = []
        for prompt, c, g in zip(prompts, cpu_tokens, gpu_tokens):
            first_diff = next((i for i, (u, v) in enumerate(zip(c, g)) if u != v), None)
            match = {"identical": c == g, "first_divergence_at_token": first_diff}
            if first_diff is not None:  # how close the fp32 reference was to a tie there
                match["fp32_top2_logit_margin_at_divergence"] = top2_margin(loaded_cpu, hf_tok, prompt, c, first_diff)
            matches.append(match)
        verification["greedy_gpu_bf16_vs_cpu_fp32"] = matches
        del loaded_gpu

    # Held-out numbers, from the shipped files: fp32 compute, main model via transformers, MTP via tools/mtp.py.
    eval_device = device
    loaded_eval = loaded_cpu.to(eval_device)
    mtp_eval = mtp_cpu.to(eval_device)
    router_counts = {}

    def count_hook(name):
        def hook(module, inputs, output):
            idx = output[2].reshape(-1)
            router_counts[name] = router_counts.get(name, 0) + torch.bincount(idx, minlength=module.num_experts).cpu()

        return hook

    handles = []
    for i, layer in enumerate(list(loaded_eval.model.layers) + [mtp_eval.block]):
        if hasattr(layer.mlp, "gate"):
            name = f"layer {i}" + (" (MTP)" if i == config.num_hidden_layers else "")
            handles.append(layer.mlp.gate.register_forward_hook(count_hook(name)))
    test_res = evaluate(loaded_eval, mtp_eval, test_ids, args.context, eval_device, 8, bf16=False)
    for h in handles:
        h.remove()
    val_res = evaluate(loaded_eval, mtp_eval, val_ids, args.context, eval_device, 8, bf16=False)
    long_ctx = cfg_dict["max_position_embeddings"]
    long_res = evaluate(loaded_eval, None, test_ids, long_ctx, eval_device, 4, bf16=False)
    expert_load = {
        name: {
            "fraction_per_expert": [round(v, 4) for v in (c.float() / c.sum()).tolist()],
            "max_over_mean": round((c.float().max() / c.float().mean()).item(), 3),
        }
        for name, c in router_counts.items()
    }
    print(f"test: {json.dumps(test_res)}", flush=True)
    print(f"test @ {long_ctx}: {json.dumps(long_res)}", flush=True)

    samples = []
    for prompt, toks in zip(prompts, cpu_tokens):
        samples.append({"prompt": prompt, "completion": hf_tok.decode(toks, skip_special_tokens=False), "tokens": toks})

    # ---- report
    size_total = sum(files.values())
    gpu_name = torch.cuda.get_device_name(device) if use_cuda else None
    commit = os.environ.get("BENCH_COMMIT")  # a tree copied to the GPU machine without .git
    try:
        commit = commit or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()
        commit = commit if len(commit) >= 7 else None
    except OSError:
        commit = None
    defaults = vars(parse_args([]))
    shown = [
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if k not in ("data", "output_dir", "results_json", "results_md", "smoke") and v != defaults.get(k)
    ]
    command = " ".join(["python tools/train_demo_model.py"] + shown)
    report = {
        "what": "DeepInfer embedded demo model: DeepSeek-V3 architecture + 1 MTP layer, trained on tinyshakespeare",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "commit": commit or "unknown",
        "gpu": gpu_name or "cpu",
        "base_commit": commit,
        "environment": {
            "device": gpu_name or "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "data": data_info,
        "model": {
            "config": cfg_dict,
            "params": params,
            "stored_tensor_elements": sum(t.numel() for t in saved.values()),
            "files_bytes": files,
            "total_bytes": size_total,
            "mtp_hidden_input": "main model final hidden AFTER model.norm; eh_proj input = [enorm(Emb(t_i+1)); hnorm(h_i)]",
        },
        "training": {
            "seed": args.seed,
            "planned_steps": args.steps,
            "steps_run": steps_run,
            "stop_reason": stop_reason,
            "shipped_step": best_step,
            "batch_size": args.batch_size,
            "context": args.context,
            "tokens_per_step": args.batch_size * args.context,
            "tokens_seen": steps_run * args.batch_size * args.context,
            "epochs_over_train_tokens": steps_run * args.batch_size * (args.context - 1) / len(train_ids),
            "optimizer": f"AdamW betas (0.9, 0.95), weight decay {args.weight_decay} on matrices, grad clip {args.grad_clip}",
            "lr_schedule": f"linear warm-up {args.warmup} steps to {args.lr}, cosine to {args.min_lr} at step {args.steps}",
            "precision": "bf16 autocast, fp32 master weights" if use_cuda else "fp32",
            "dropout": args.dropout,
            "mtp_lambda": args.mtp_lambda,
            "bias_update_speed": args.bias_update_speed,
            "seq_aux_alpha": args.seq_aux_alpha,
            "train_wall_seconds": round(train_seconds, 1),
            "train_tokens_per_second": round(steps_run * args.batch_size * args.context / train_seconds),
            "script_wall_seconds": None,
            "curve": curve,
        },
        "eval": {
            "note": "from the shipped bf16 files, computed in fp32; windows of context-1 tokens after BOS; every token predicted",
            "test": test_res,
            "val": val_res,
            f"test_context_{long_ctx}_main_only": long_res,
            "test_expert_load": expert_load,
            "e_score_correction_bias_range": {
                f"layer {i}": [
                    round(m.gate.e_score_correction_bias.min().item(), 4),
                    round(m.gate.e_score_correction_bias.max().item(), 4),
                ]
                for i, m in zip(
                    [
                        j
                        for j, layer in enumerate(list(loaded_eval.model.layers) + [mtp_eval.block])
                        if hasattr(layer.mlp, "gate")
                    ],
                    moe_modules(loaded_eval, mtp_eval),
                )
            },
        },
        "samples_greedy_cpu_fp32": samples,
        "verification": verification,
    }
    report["training"]["script_wall_seconds"] = round(time.time() - t_start, 1)
    for path in (args.results_json, args.results_md):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(args.results_json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    with open(args.results_md, "w", encoding="utf-8") as f:
        f.write(render_markdown(report, long_ctx))
    print(
        f"done in {time.time() - t_start:.1f}s; test loss {test_res['main_loss']:.4f} ppl {test_res['perplexity']:.2f}",
        flush=True,
    )


def render_markdown(r: dict, long_ctx: int) -> str:
    c = r["model"]["config"]
    t = r["training"]
    test = r["eval"]["test"]
    val = r["eval"]["val"]
    long_res = r["eval"][f"test_context_{long_ctx}_main_only"]
    v = r["verification"]
    lines = [
        "# Demo model training: DeepSeek-V3 architecture + MTP on tinyshakespeare",
        "",
        f"- Date (UTC): {r['date_utc']}",
        f"- Device: {r['environment']['device']}; torch {r['environment']['torch']}, transformers {r['environment']['transformers']}",
        f"- Base commit: {r['base_commit'] or 'not recorded (run from an uncommitted working tree)'}",
        f"- Command: `{r['command']}`",
        f"- Data: {r['data']['corpus']} (sha256 {r['data']['sha256'][:12]}…), {r['data']['characters']:,} characters; "
        f"{r['data']['split']}",
        f"- Tokens: train {r['data']['train_tokens']:,}, val {r['data']['val_tokens']:,}, test {r['data']['test_tokens']:,} "
        f"({r['data']['train_characters_per_token']:.2f} characters per token); {r['data']['tokenizer']}",
        "",
        "## Model",
        "",
        f"- `DeepseekV3ForCausalLM`, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers "
        f"({c['first_k_dense_replace']} dense, MLP {c['intermediate_size']}; then MoE: {c['n_shared_experts']} shared + "
        f"{c['n_routed_experts']} routed experts of {c['moe_intermediate_size']}, top-{c['num_experts_per_tok']}, "
        f"{c['n_group']} groups / top-{c['topk_group']} groups, sigmoid + `e_score_correction_bias`, "
        f"routed scaling {c['routed_scaling_factor']})",
        f"- MLA: {c['num_attention_heads']} heads, q_lora_rank {c['q_lora_rank']}, kv_lora_rank {c['kv_lora_rank']}, "
        f"qk_nope {c['qk_nope_head_dim']}, qk_rope {c['qk_rope_head_dim']}, v {c['v_head_dim']} "
        f"(latent cache {c['kv_lora_rank'] + c['qk_rope_head_dim']} values per token per layer)",
        f"- RoPE: theta {c['rope_theta']}, YaRN factor {c['rope_scaling']['factor']} over "
        f"{c['rope_scaling']['original_max_position_embeddings']} (trained with it), max positions {c['max_position_embeddings']}",
        f"- MTP: 1 layer stored as `model.layers.{c['num_hidden_layers']}.*` ({v['mtp_stored_tensors']} tensors); "
        f"input {r['model']['mtp_hidden_input']}",
        f"- Parameters: main {r['model']['params']['main_model']:,}, MTP layer {r['model']['params']['mtp_layer_unique']:,} "
        f"(+ copies of embedding and head), stored elements {r['model']['stored_tensor_elements']:,}; "
        f"activated per token (main, without embedding) {r['model']['params']['main_activated_per_token']:,}",
        f"- Files: {', '.join(f'{k} {n / 1e6:.2f} MB' for k, n in r['model']['files_bytes'].items())}; "
        f"total {r['model']['total_bytes'] / 1e6:.2f} MB",
        "",
        "## Training",
        "",
        f"- Seed {t['seed']}; {t['steps_run']} of {t['planned_steps']} planned steps ({t['stop_reason']}); "
        f"shipped weights from step {t['shipped_step']} (best validation loss)",
        f"- Batch {t['batch_size']} x {t['context']} tokens; {t['tokens_seen']:,} tokens seen "
        f"({t['epochs_over_train_tokens']:.1f} passes over the training tokens)",
        f"- {t['optimizer']}; {t['lr_schedule']}; {t['precision']}; dropout {t['dropout']}",
        f"- Loss = main CE + {t['mtp_lambda']} x MTP CE + {t['seq_aux_alpha']} x sequence-wise balance loss; "
        f"bias update speed {t['bias_update_speed']}",
        f"- Wall time: training {t['train_wall_seconds']} s ({t['train_tokens_per_second']:,} tokens/s), "
        f"whole script {t['script_wall_seconds']} s",
        "",
        "| step | s | train main (EMA) | train MTP (EMA) | val main | val MTP | val MTP acc |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    curve = t["curve"]
    keep = curve if len(curve) <= 16 else curve[:: max(1, len(curve) // 12)] + [curve[-1]]
    seen = set()
    for p in keep:
        if p["step"] in seen:
            continue
        seen.add(p["step"])
        lines.append(
            f"| {p['step']} | {p['seconds']} | {p['train_main_loss_ema']:.3f} | {p['train_mtp_loss_ema']:.3f} | "
            f"{p['val_main_loss']:.3f} | {p['val_mtp_loss']:.3f} | {p['val_mtp_accuracy']:.3f} |"
        )
    sel = r.get("selection")
    if sel:
        lines += [
            "",
            sel["note"],
            "",
            "| run | command | steps run | best step | val main loss | test main loss | test ppl | test MTP acc |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in sel["runs"]:
            lines.append(
                f"| {row['run']}{' (shipped)' if row.get('shipped') else ''} | `{row['command']}` | {row['steps_run']} | "
                f"{row['shipped_step']} | {row['val_main_loss']:.4f} | {row['test_main_loss']:.4f} | "
                f"{row['test_perplexity']:.2f} | {row['test_mtp_accuracy']:.3f} |"
            )
    lines += [
        "",
        "## Held-out results (shipped bf16 weights, fp32 compute)",
        "",
        "| set | tokens | main loss (nats) | perplexity | next-token acc | MTP loss | MTP next-next-token acc | MTP = main greedy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, res in (("test (last 5%)", test), ("val", val)):
        lines.append(
            f"| {name} | {res['tokens']:,} | {res['main_loss']:.4f} | {res['perplexity']:.2f} | "
            f"{res['main_top1_accuracy']:.3f} | {res['mtp_loss']:.4f} | "
            f"{res['mtp_next_next_token_top1_accuracy']:.3f} | {res['mtp_agrees_with_main_greedy']:.3f} |"
        )
    lines.append(
        f"| test, windows of {long_ctx} (YaRN range) | {long_res['tokens']:,} | {long_res['main_loss']:.4f} | "
        f"{long_res['perplexity']:.2f} | {long_res['main_top1_accuracy']:.3f} | – | – | – |"
    )
    lines += [
        "",
        "Context windows: the test stream is cut into windows of context-1 tokens, each after a BOS; every token",
        "is predicted and counted. *MTP next-next-token acc*: top-1 of the MTP head for t(i+2) given h(i) and the",
        "true t(i+1). *MTP = main greedy*: how often that draft equals the main model's own greedy choice for",
        "t(i+2) (the acceptance rate of a one-token greedy speculative step, on teacher-forced text).",
        "",
        "Expert load on the test set (max/mean over the routed experts, 1.0 = even): "
        + ", ".join(f"{k} {x['max_over_mean']}" for k, x in r["eval"]["test_expert_load"].items()),
        "",
        "## Greedy samples (transformers `generate`, checkpoint loaded on CPU in fp32)",
        "",
    ]
    gpu_match = v.get("greedy_gpu_bf16_vs_cpu_fp32")
    for i, s in enumerate(r["samples_greedy_cpu_fp32"]):
        extra = ""
        if gpu_match:
            m = gpu_match[i]
            extra = (
                " (GPU bf16: identical)"
                if m["identical"]
                else f" (GPU bf16 diverges at token {m['first_divergence_at_token']})"
            )
        lines += [
            f"Prompt {json.dumps(s['prompt'], ensure_ascii=False)}{extra}:",
            "",
            "```",
            s["prompt"] + s["completion"],
            "```",
            "",
        ]
    lines += [
        "The last prompt uses the chat template; the model was trained on plain text only, so it answers in",
        "Shakespeare's manner and does not know the chat markers.",
        "",
        "## Checks",
        "",
        f"- transformers `DeepseekV3ForCausalLM.from_pretrained`: missing keys {v['hf_missing_keys'] or 'none'}; "
        f"every unexpected key is an MTP key: {v['hf_unexpected_keys_all_mtp']}",
        f"- in-memory trained model vs loaded checkpoint (CPU fp32): max |logit diff| main "
        f"{v['inmemory_vs_loaded_cpu_fp32_max_abs_logit_diff']:.3g}, MTP "
        f"{v['inmemory_vs_loaded_cpu_fp32_mtp_max_abs_logit_diff']:.3g}; greedy tokens identical for "
        f"{sum(v['greedy_inmemory_equals_loaded_cpu_fp32'])}/{len(v['greedy_inmemory_equals_loaded_cpu_fp32'])} prompts",
    ]
    if gpu_match:
        same = sum(1 for m in gpu_match if m["identical"])
        margins = [
            m["fp32_top2_logit_margin_at_divergence"] for m in gpu_match if "fp32_top2_logit_margin_at_divergence" in m
        ]
        line = f"- greedy tokens, GPU bf16 load vs CPU fp32 load: identical for {same}/{len(gpu_match)} prompts"
        if margins:
            line += (
                "; where they part, the fp32 reference's top-2 logit gap was "
                + ", ".join(f"{x:.2g}" for x in margins)
                + " (near-ties that bf16 activations flip; the sequences then continue differently)"
            )
        lines.append(line)
    lines += [
        f"- MTP copies of embedding and head equal the main tensors: {v['mtp_embed_and_head_copies_equal_main']}",
        f"- dense training MoE vs transformers' sparse MoE (fp32): max |logit diff| "
        f"{v['dense_vs_sparse_moe_max_abs_logit_diff_fp32']:.2g}",
        f"- tokenizer: transformers `AutoTokenizer` ids equal `tokenizers.Tokenizer.from_file` ids: "
        f"{v['tokenizer_hf_equals_tokenizers_lib']}; BOS prepended: {v['tokenizer_bos_prepended']}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
