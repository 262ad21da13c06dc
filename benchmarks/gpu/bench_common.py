"""What the GPU benchmark scripts share: the benchmark shapes, the bytes a decode step must read, and the
metadata every result file records (GPU, commit, date, command).

Imports nothing heavy (no torch, no deepinfer), so both the engine's and transformers' processes can use it.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# DeepSeek-V2-Lite's config.json fields (15.7B parameters, 2.4B active).
V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
           "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
           "num_attention_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "n_shared_experts": 2, "n_routed_experts": 64,
           "num_experts_per_tok": 6, "first_k_dense_replace": 1, "topk_method": "greedy", "n_group": 1,
           "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": False, "max_position_embeddings": 163840,
           "rope_theta": 10000.0,
           "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                            "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
           "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}

# DeepSeek-V3's layer dimensions (671B, 37B active); a slice keeps the first `num_hidden_layers` layers, of which the
# first 3 are dense as in V3. 7 layers (3 dense + 4 MoE = 49.6B parameters, 99 GB in bf16) is as many as fit one
# H200 with room left for the latent cache of batch 256 at 8k context (about 17 GB at 0.9 memory utilization).
V3_SLICE_LAYERS = 7
V3_SLICE = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
            "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": V3_SLICE_LAYERS, "num_attention_heads": 128, "num_key_value_heads": 128,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
            "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
            "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "num_nextn_predict_layers": 0, "max_position_embeddings": 163840, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}

# For checking the scripts on a CPU: V2-Lite's attention dims, small everything else.
SMOKE = {**V2_LITE, "num_hidden_layers": 2, "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512,
         "moe_intermediate_size": 128, "n_routed_experts": 8}


def add_decode_case_args(ap, default_v3_layers: int = 3) -> None:
    """The arguments that pick one decode case of a DeepSeek shape: --shape, --v3-layers, --batch, --context."""
    ap.add_argument("--shape", default="v2-lite", choices=["v2-lite", "v3-slice", "smoke"])
    ap.add_argument("--v3-layers", type=int, default=default_v3_layers)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)


def shape_config(name: str, v3_layers: int = V3_SLICE_LAYERS) -> dict:
    """config.json of a benchmark shape: v2-lite, v3-slice (with `v3_layers` layers) or smoke."""
    if name == "v2-lite":
        return dict(V2_LITE)
    if name == "v3-slice":
        if v3_layers < 1:
            raise ValueError(f"v3-slice needs at least 1 layer, got {v3_layers}")
        return {**V3_SLICE, "num_hidden_layers": v3_layers,
                "first_k_dense_replace": min(V3_SLICE["first_k_dense_replace"], v3_layers)}
    if name == "smoke":
        return dict(SMOKE)
    raise ValueError(f"unknown shape {name!r}: v2-lite, v3-slice or smoke")


SHAPE_NAMES = ("v2-lite", "v3-slice", "smoke")


def step_bytes(c: dict, batch: int, context: int, weights: str = "bf16",
               fp8_cache: bool = False) -> tuple[float, float]:
    """(weight bytes, latent-cache bytes) one decode step of `batch` sequences of `context` tokens must read.

    Weights: every layer's MLA projections (q or q_a/q_b, kv_a, kv_b, o), the dense MLPs of the first layers,
    per MoE layer the router, the shared experts and min(E, batch x top_k) routed experts (an upper bound on the
    distinct experts a step touches), and lm_head. Not counted: the embedding rows (batch x hidden) and the norms.
    Cache: batch x context tokens x (kv_lora_rank + qk_rope_head_dim) bf16 values per layer, or with `fp8_cache` the
    FP8 layout's row (latent_fp8_row_bytes: 656 bytes at DeepSeek's dims).
    `weights` (BYTES_PER_WEIGHT) is what the linear layers are: bf16, or "fp8" e4m3 codes and float32 scales (one per
    128 x 128 block): every projection but kv_b_proj (which, with the router and lm_head, stays bf16); "int4" the
    same projections' 4-bit codes with a float32 scale and a 4-bit zero point per 128 inputs; "nvfp4" their e2m1
    codes with a float32 scale per 16 (as the GPU holds them).
    """
    return _step_bytes(c, batch, context, min(c["n_routed_experts"], batch * c["num_experts_per_tok"]), weights,
                       fp8_cache)


def expected_active_experts(c: dict, batch: int) -> float:
    """Distinct routed experts `batch` tokens hit when each picks top_k of E uniformly at random (random weights
    route close to that): E * (1 - C(E-1, k) / C(E, k))^batch = E * (1 - (1 - k/E)^batch)."""
    e, k = c["n_routed_experts"], c["num_experts_per_tok"]
    return e * (1.0 - (1.0 - k / e) ** batch)


def step_bytes_expected(c: dict, batch: int, context: int, weights: str = "bf16",
                        fp8_cache: bool = False) -> tuple[float, float]:
    """step_bytes with the expected number of distinct experts instead of the upper bound min(E, batch x k)."""
    return _step_bytes(c, batch, context, expected_active_experts(c, batch), weights, fp8_cache)


def latent_fp8_row_bytes(rank: int, rope: int) -> int:
    """A token's row of one layer in the FP8 latent cache: e4m3 codes, a float32 scale per 128, bf16 rope values,
    padded to 16 bytes (csrc/backend/ops/latent_fp8.h), as the engine computes it."""
    from deepinfer import _deepinfer

    return _deepinfer.latent_fp8_row_bytes(rank, rope)


FP8_BYTES_PER_WEIGHT = 1.0 + 4.0 / (128 * 128)  # a code, and a share of its block's float32 scale
INT4_BYTES_PER_WEIGHT = 0.5 + (4.0 + 0.5) / 128  # half a byte, and a share of its group's scale and zero point
NVFP4_BYTES_PER_WEIGHT = 0.5 + 4.0 / 16          # half a byte, and a share of its group's float32 scale
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8": FP8_BYTES_PER_WEIGHT, "int4": INT4_BYTES_PER_WEIGHT,
                    "nvfp4": NVFP4_BYTES_PER_WEIGHT}


def _step_bytes(c: dict, batch: int, context: int, experts: float, weights: str = "bf16",
                fp8_cache: bool = False) -> tuple[float, float]:
    d, layers = c["hidden_size"], c["num_hidden_layers"]
    h, rank, rope, nope, v = (c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"],
                              c["qk_nope_head_dim"], c["v_head_dim"])
    q = d * h * (nope + rope) if c.get("q_lora_rank") is None else (
        d * c["q_lora_rank"] + c["q_lora_rank"] * h * (nope + rope))
    linear_attn = q + d * (rank + rope) + h * v * d
    kv_b = rank * h * (nope + v)
    dense_mlp = 3 * d * c["intermediate_size"]
    experts_ffn = 3 * d * c["moe_intermediate_size"] * (experts + c["n_shared_experts"])
    router = d * c["n_routed_experts"]
    dense_layers = min(c["first_k_dense_replace"], layers)
    moe_layers = layers - dense_layers
    linear = layers * linear_attn + dense_layers * dense_mlp + moe_layers * experts_ffn
    wide = layers * kv_b + moe_layers * router + c["vocab_size"] * d
    row = latent_fp8_row_bytes(rank, rope) if fp8_cache else 2 * (rank + rope)
    return BYTES_PER_WEIGHT[weights] * linear + 2.0 * wide, float(batch * context * row * layers)


def parameter_count(c: dict) -> int:
    """Parameters of the model (embedding and lm_head included, norms left out)."""
    weights, _ = _step_bytes(c, 1, 0, c["n_routed_experts"])
    return int(weights / 2 + c["vocab_size"] * c["hidden_size"])


# ---------------------------------------------------------------------------------------------------- metadata


def gpu_info() -> dict:
    """The first GPU as nvidia-smi names it (no CUDA context is created), or the CPU when there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
        name, driver, memory = (s.strip() for s in out[0].split(","))
        return {"gpu": name, "driver": driver, "gpu_memory": memory}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        import platform
        return {"gpu": None, "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}


def commit_id() -> str:
    """BENCH_COMMIT when given (the GPU machine gets the tree without .git), else git's HEAD, else 'unknown'."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def run_metadata() -> dict:
    """GPU, commit, date and command, for the top of every result file."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_name = str(script.relative_to(REPO))
    except ValueError:
        script_name = script.name
    meta = {**gpu_info(), "commit": commit_id(),
            "date": os.environ.get("BENCH_DATE")
            or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": shlex.join(["python3", script_name, *sys.argv[1:]])}
    if os.environ.get("BENCH_COMMAND"):
        meta["driver_command"] = os.environ["BENCH_COMMAND"]
    return meta


def write_json(path: Path, data: dict) -> None:
    """Writes atomically (a result file is rewritten after every case, so a killed run leaves a valid file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_floors(path: Path | None) -> dict:
    """floors.json from floors.py, or {} when it is missing or unreadable."""
    if path is None or not Path(path).is_file():
        return {}
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def measure_copy_gbps(gib: float = 1.0) -> float | None:
    """The GPU's device-to-device copy bandwidth (bytes read + written a second, in GB/s, the best of 5 timed
    batches of 5 copies) as floors.py measures it, for a run without floors.json; None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = int(gib * (1 << 30))
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = max(best, 2.0 * n * 5 / (start.elapsed_time(end) / 1e3) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return best


def sharegpt_prompt_budget(c: dict, ttft_contexts: list[int], output_tokens: int) -> int:
    """The prompt tokens a ShareGPT request keeps: what fits the longest TTFT context with its output (the engine's
    max_model_len is sized from those)."""
    return min(c["max_position_embeddings"], max(ttft_contexts) + 8) - output_tokens - 1


def sharegpt_conversations(path: Path, num: int, vocab: int, budget: int, max_turns: int,
                           min_turns: int = 2) -> tuple[list[list[list[int]]], dict]:
    """The user turns of the first `num` ShareGPT conversations with at least `min_turns` of them (at most
    `max_turns` kept), each as DeepSeek-V3 token ids folded into the vocabulary and truncated to `budget` tokens. A
    file of first turns only (sharegpt_v3_filtered_1000.json) has no such conversations: then each conversation is
    `max_turns` consecutive first-turn prompts, one a turn (what a cache sees depends on the prefixes a replay
    resends, not on what the turns say)."""
    from deepinfer.tokenizer import Tokenizer

    data = json.loads(path.read_text(encoding="utf-8"))
    humans = [[t["value"] for t in item.get("conversations") or [] if t.get("from") == "human" and t.get("value")]
              for item in data]
    chats = [turns[:max_turns] for turns in humans if len(turns) >= min_turns][:num]
    source = "conversations"
    if not chats:
        firsts = [turns[0] for turns in humans if turns]
        chats = [firsts[i:i + max_turns] for i in range(0, len(firsts) - max_turns + 1, max_turns)][:num]
        source = "consecutive first-turn prompts"
    tok = Tokenizer.default_deepseek_v3()
    flat = tok.encode_batch([t for chat in chats for t in chat], add_special_tokens=False)
    out, at = [], 0
    for chat in chats:
        out.append([[t % vocab for t in ids[:budget]] for ids in flat[at:at + len(chat)]])
        at += len(chat)
    turns = [len(c) for c in out]
    return out, {"conversations": len(out), "turns_from": source, "turns_total": sum(turns),
                 "turns_mean": statistics.mean(turns) if out else 0,
                 "user_tokens_total": sum(len(t) for c in out for t in c)}


def sharegpt_prompts(path: Path, num: int, vocab: int, budget: int) -> tuple[list[list[int]], dict]:
    """The first `num` ShareGPT first-turn prompts as DeepSeek-V3 token ids (BOS first), folded into the vocabulary
    and truncated to `budget` tokens."""
    from deepinfer.tokenizer import Tokenizer

    data = json.loads(path.read_text(encoding="utf-8"))
    texts = []
    for item in data:
        turns = item.get("conversations") or []
        if turns and turns[0].get("value"):
            texts.append(turns[0]["value"])
        if len(texts) >= num:
            break
    tok = Tokenizer.default_deepseek_v3()
    ids = tok.encode_batch(texts)
    folded = sum(1 for p in ids for t in p if t >= vocab)
    truncated = sum(1 for p in ids if len(p) > budget)
    ids = [[t % vocab for t in p[:budget]] for p in ids]
    lens = [len(p) for p in ids]
    return ids, {"prompts": len(ids), "prompt_tokens_total": sum(lens), "prompt_tokens_mean": statistics.mean(lens),
                 "prompt_tokens_max": max(lens), "truncated_prompts": truncated, "ids_folded_into_vocab": folded}
