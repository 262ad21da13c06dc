"""The model against Hugging Face transformers on tiny random checkpoints of both architectures (fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import VOCAB, load_reference
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams, _deepinfer

ARCHS = ["v3", "v3_no_qlora", "v3_yarn", "v3_ungrouped", "v2", "v2_two_shared", "v2_group_limited"]


def scorer(path, page_size=8):
    options = _deepinfer.EngineOptions()
    options.model_path = str(path)
    options.page_size = page_size
    return _deepinfer.SequenceScorer(options)


def reference_last_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].numpy()


@pytest.mark.parametrize("name", ARCHS)
def test_last_position_logits_match_transformers(checkpoints, name):
    model = load_reference(checkpoints[name])
    s = scorer(checkpoints[name])
    rng = np.random.default_rng(1)
    for length in (1, 6, 23, 77):  # 77 tokens spans 10 pages of 8; YaRN's original context is 64
        tokens = rng.integers(3, VOCAB, length).tolist()
        ref = reference_last_logits(model, tokens)
        # One prefill; chunked prefill over a cached prefix; prefill then absorbed decode steps.
        for chunk, tail in ((0, 0), (5, 0), (0, min(4, length - 1))):
            got = s.last_logits(tokens, chunk, tail)
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            assert err <= 1e-4, f"{name} length={length} chunk={chunk} decode_tail={tail}: rel err {err:.2e}"


def test_routing_is_exercised(checkpoints):
    """The grouped V3 model's MoE must route tokens to different experts, or parity proves little."""
    model = load_reference(checkpoints["v3"])
    seen = set()

    def hook(_module, _inputs, outputs):
        seen.update(outputs[2].flatten().tolist())

    handle = model.model.layers[1].mlp.gate.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.arange(3, 60).unsqueeze(0))
    handle.remove()
    assert len(seen) >= 6


def hf_greedy(model, prompt, max_new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=2)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", ["v3", "v2_group_limited"])
def test_greedy_batch_with_preemption_matches_transformers(checkpoints, name):
    """8 prompts of mixed lengths together, a cache too small for all of them: preemption must not change tokens."""
    path = checkpoints[name]
    model = load_reference(path)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, VOCAB, n).tolist() for n in (3, 17, 9, 40, 1, 25, 12, 33)]
    expected = [hf_greedy(model, p, 32) for p in prompts]

    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(path),
                                              page_size=4, num_cache_pages=30, max_model_len=96,
                                              max_num_batched_tokens=64))
    try:
        outs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=32, min_tokens=32))
        assert engine.stats().num_preemptions > 0, "the cache was meant to be too small for all 8 requests"
        for i, (out, exp) in enumerate(zip(outs, expected)):
            assert out.token_ids == exp, f"prompt {i} (length {len(prompts[i])}) diverged"
            assert out.finish_reason == "length"
        stats = engine.stats()
        assert stats.num_free_cache_pages == stats.num_cache_pages
    finally:
        engine.shutdown()

