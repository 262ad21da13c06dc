"""Decode steps on a GPU: CUDA graph replays give the tokens eager steps give, and are actually used.

Needs a CUDA device and a build with the CUDA backend; skipped otherwise. The model has DeepSeek's real MLA
dimensions (what the CUDA attention kernels take) with random weights.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams, _deepinfer
from deepinfer.default_model import TRAINED_MODEL_DIR

pytestmark = pytest.mark.skipif(_deepinfer.cuda_device_count() == 0, reason="needs a CUDA device")

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 4096, "hidden_size": 512,
    "intermediate_size": 1024, "moe_intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 16,
    "q_lora_rank": 384, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla512")
    (d / "config.json").write_text(json.dumps(CONFIG))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED_MODEL_DIR / f, d / f)
    return d


def run(model_dir, prompts, params, enforce_eager):
    cfg = EngineConfig(model_name_or_path=str(model_dir), load_format="dummy", seed=7, device="cuda",
                       max_model_len=2048, gpu_memory_utilization=0.3, enforce_eager=enforce_eager)
    with DeepInferenceEngine(cfg) as engine:
        outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
        stats = engine.stats()
    return outs, stats


# Largest top-2 logprob gap at which two runs of the same model in bf16 may still pick different greedy tokens: a
# graph records the same kernels as an eager step of its shape, but the GEMM and MoE kernels need not accumulate in
# the same order from one launch to the next, and random weights give near-uniform logits full of near-ties.
NEAR_TIE = 0.05


def expect_same_greedy_tokens(eager_out, graph_tokens, what):
    """The graph run's greedy tokens equal the eager run's at every position up to the first difference, and that
    difference (if any) is at a genuine near-tie of the eager run: its top-2 logprobs within NEAR_TIE, the graph's
    token its runner-up. After such a flip the two continuations are different texts and are not compared further.
    Returns whether the two are identical."""
    a, b = eager_out.token_ids, graph_tokens
    assert len(a) == len(b), f"{what}: {len(a)} eager tokens, {len(b)} with graphs"
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return True
    top = eager_out.outputs[0].logprobs[i].top
    ranked = sorted(top, key=lambda t: -t.logprob)[:2]
    assert b[i] in [t.token_id for t in ranked], f"{what}, step {i}: graph token {b[i]} not in eager's top 2 {ranked}"
    assert ranked[0].logprob - ranked[1].logprob <= NEAR_TIE, f"{what}, step {i}: divergence at a gap of {ranked}"
    return False


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_graph_replay_gives_the_eager_tokens(model_dir, batch):
    # Batch sizes that are graph buckets and prompts of one length: no padded rows, so both modes run the same
    # kernels on the same shapes. Each greedy continuation must equal the eager one, or leave it only at a near-tie
    # of the eager run (its top-2 logprobs within NEAR_TIE, the graph's token being the eager runner-up).
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(3, 4096, 40).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2)
    eager, eager_stats = run(model_dir, prompts, params, enforce_eager=True)
    graphs, graph_stats = run(model_dir, prompts, params, enforce_eager=False)
    assert eager_stats.num_graph_replays == 0
    assert graph_stats.num_graph_replays >= 40, "decode steps did not replay graphs"
    identical = 0
    for n, (e, g) in enumerate(zip(eager, graphs)):
        assert len(e.token_ids) == 48
        identical += expect_same_greedy_tokens(e, g.token_ids, f"sequence {n}")
    assert identical >= (batch + 1) // 2, f"only {identical} of {batch} continuations identical"


def test_padded_batches_and_growing_contexts(model_dir):
    # 5 sequences of different lengths: padded to the bucket of 8, contexts crossing page-table buckets, requests
    # finishing at different steps (the batch shrinks through buckets). Every request must still produce its own
    # continuation: compared against the eager run of the same batch, every token up to the first difference, which
    # may only be at a genuine near-tie of the eager run (padding changes the MoE's and GEMMs' row counts, which may
    # change their kernels' rounding; with random weights that flips near-tie argmaxes and nothing else).
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 4096, n).tolist() for n in (5, 300, 17, 64, 130)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=2)
              for m in (200, 40, 120, 90, 10)]
    cfg = dict(model_name_or_path=str(model_dir), load_format="dummy", seed=7, device="cuda", max_model_len=2048,
               gpu_memory_utilization=0.3)
    with DeepInferenceEngine(EngineConfig(**cfg, enforce_eager=False)) as engine:
        outs = [engine.submit({"prompt_token_ids": p}, sp) for p, sp in zip(prompts, params)]
        graph_tokens = [s.result().outputs[0].token_ids for s in outs]
        stats = engine.stats()
    assert stats.num_graphs >= 3 and stats.num_graph_replays > 100
    assert [len(t) for t in graph_tokens] == [200, 40, 120, 90, 10]
    with DeepInferenceEngine(EngineConfig(**cfg, enforce_eager=True)) as engine:
        outs = [engine.submit({"prompt_token_ids": p}, sp) for p, sp in zip(prompts, params)]
        eager = [s.result() for s in outs]
    for n, (e, g) in enumerate(zip(eager, graph_tokens)):
        expect_same_greedy_tokens(e, g, f"sequence {n} (prompt {len(prompts[n])} tokens)")
