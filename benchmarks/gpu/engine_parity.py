"""The engine on the GPU against the engine on the CPU: same weights, same prompts.

    python benchmarks/gpu/engine_parity.py --out OUT_DIR

Models: small configs with DeepSeek's real MLA dimensions (kv_lora_rank 512, rope 64, nope 128, v 128, 16 heads —
what the CUDA attention kernels take) and DeepSeekMoE of both generations, random weights (load_format dummy,
fixed seed), the demo model's tokenizer. Checks (1) last-position logits of prompts of several lengths, through one
prefill, chunked prefill and prefill + absorbed decode steps: normalized error of the bf16 GPU path against the fp32
CPU path; (2) greedy continuations of 8 prompts submitted together on both devices: how many match token for token
and where the others first diverge (bf16 flips near-ties; the logit gap there is reported). Writes a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams, _deepinfer  # noqa: E402
from deepinfer.default_model import TRAINED_MODEL_DIR  # noqa: E402

COMMON = {
    "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256,
    "num_hidden_layers": 3, "num_attention_heads": 16, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4,
    "first_k_dense_replace": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 0,
    "eos_token_id": 1, "rope_theta": 10000.0, "tie_word_embeddings": False,
}
CONFIGS = {
    "v3-mla512": {**COMMON, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": 384,
                  "n_group": 4, "topk_group": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                   "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}},
    "v2-mla512": {**COMMON, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "q_lora_rank": None,
                  "topk_method": "greedy", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0},
}


def write_model(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIGS[name]))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED_MODEL_DIR / f, d / f)
    return d


def scorer(path: Path, device: str):
    o = _deepinfer.EngineOptions()
    o.model_path = str(path)
    o.load_format = _deepinfer.LoadFormat.dummy
    o.seed = 7
    o.device = device
    o.page_size = 64
    return _deepinfer.SequenceScorer(o)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    assert _deepinfer.cuda_device_count() > 0, "no CUDA device (or a build without the CUDA backend)"
    rng = np.random.default_rng(0)
    summary: dict = {"models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            path = write_model(Path(tmp), name)
            cpu, gpu = scorer(path, "cpu"), scorer(path, "cuda")
            logit_rows = []
            for length in (1, 17, 100, 300):
                tokens = rng.integers(3, 4096, length).tolist()
                for chunk, tail in ((0, 0), (37, 0), (0, min(5, length - 1))):
                    ref = cpu.last_logits(tokens, chunk, tail)
                    got = gpu.last_logits(tokens, chunk, tail)
                    err = float(np.abs(got - ref).max() / np.abs(ref).max())
                    logit_rows.append({"length": length, "chunk": chunk, "decode_tail": tail, "rel_err": err,
                                       "argmax_equal": int(np.argmax(got)) == int(np.argmax(ref)),
                                       "finite": bool(np.isfinite(got).all())})
                    print(f"{name} len={length:4d} chunk={chunk:3d} tail={tail}: rel err {err:.2e}")
            del cpu, gpu
            prompts = [rng.integers(3, 4096, n).tolist() for n in (5, 40, 12, 90, 1, 33, 64, 20)]
            params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
            outs, timing = {}, {}
            for device in ("cpu", "cuda"):
                cfg = EngineConfig(model_name_or_path=str(path), load_format="dummy", seed=7, device=device,
                                   max_model_len=512, gpu_memory_utilization=0.3)
                with DeepInferenceEngine(cfg) as e:
                    t = time.perf_counter()
                    outs[device] = [o.token_ids for o in e.generate([{"prompt_token_ids": p} for p in prompts], params)]
                    timing[device] = time.perf_counter() - t
            same = sum(a == b for a, b in zip(outs["cpu"], outs["cuda"]))
            first_div = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                         for a, b in zip(outs["cpu"], outs["cuda"])]
            print(f"{name}: greedy 8 x 32 tokens, {same}/8 identical; first divergence {first_div}; "
                  f"wall cpu {timing['cpu']:.2f}s cuda {timing['cuda']:.2f}s")
            summary["models"][name] = {"logits": logit_rows, "greedy_identical": same, "first_divergence": first_div,
                                       "wall_s": timing}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_parity.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
