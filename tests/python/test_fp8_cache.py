"""The FP8 latent cache (kv_cache_dtype="fp8") against Hugging Face transformers whose latents go through torch's
float8_e4m3fn the same way: c_kv (the kv_a_layernorm output) per 128 values with a power-of-two scale, the rotated
k_pe through bfloat16. Everything else is fp32 on both sides, so the two must agree as closely as the fp32 parity
tests do, and far more closely than either agrees with the unquantized model."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest
import torch

from conftest import VOCAB, load_reference
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams, _deepinfer
from test_model_parity import hf_greedy

E4M3_MAX = 448.0


def fp8_latent(x: torch.Tensor, margins: list[float] | None = None) -> torch.Tensor:
    """c_kv as the FP8 cache keeps it: groups of 128 along the last dim, scale the smallest 2^k >= amax / 448.
    `margins` collects how far (in e4m3 ulps) the closest scaled value sits from a rounding midpoint."""
    out = x.clone()
    for g in range(0, x.shape[-1], 128):
        part = x[..., g:g + 128]
        target = part.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
        mantissa, exponent = torch.frexp(target)  # target = mantissa * 2^exponent, mantissa in [0.5, 1)
        scale = torch.where(mantissa == 0.5, torch.ldexp(torch.ones_like(target), exponent - 1),
                            torch.ldexp(torch.ones_like(target), exponent))
        scale = torch.where(target > 0, scale, torch.ones_like(target))
        scaled = part / scale
        rounded = scaled.to(torch.float8_e4m3fn).to(torch.float32)
        out[..., g:g + 128] = rounded * scale
        if margins is not None:  # e4m3 keeps 3 mantissa bits; below 2^-6 the spacing is the subnormals' 2^-9
            ulp = torch.clamp(torch.ldexp(torch.ones_like(scaled), torch.frexp(scaled)[1] - 4), min=2.0 ** -9)
            margins.append(float(((scaled - rounded).abs() / ulp - 0.5).abs().min()))
    return out


@contextlib.contextmanager
def fp8_cache_reference(model, margins: list[float] | None = None):
    """The reference model with its latents through FP8 (c_kv) and bfloat16 (rotated k_pe), as the cache stores them."""
    arch = model.config.model_type  # deepseek_v3 or deepseek_v2
    modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    patched = {}
    names = ["apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"] if arch == "deepseek_v3" else ["apply_rotary_emb"]
    for name in names:
        original = getattr(modeling, name)

        def rounded(q, k, *args, _original=original, **kwargs):
            q_rot, k_rot = _original(q, k, *args, **kwargs)
            return q_rot, k_rot.to(torch.bfloat16).to(k_rot.dtype)

        patched[name] = original
        setattr(modeling, name, rounded)
    hooks = [layer.self_attn.kv_a_layernorm.register_forward_hook(lambda _m, _i, out: fp8_latent(out, margins))
             for layer in model.model.layers]
    try:
        yield model
    finally:
        for h in hooks:
            h.remove()
        for name, original in patched.items():
            setattr(modeling, name, original)


def scorer(path, fp8: bool, page_size=8):
    options = _deepinfer.EngineOptions()
    options.model_path = str(path)
    options.page_size = page_size
    options.kv_cache_dtype = _deepinfer.KvCacheDtype.fp8 if fp8 else _deepinfer.KvCacheDtype.auto
    return _deepinfer.SequenceScorer(options)


def last_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].numpy()


def tokens_clear_of_rounding_ties(model, rng, length):
    """Random tokens whose FP8 latents all sit clear of an e4m3 rounding midpoint, and the FP8-latent reference's
    logits for them. A value within float32 noise of a midpoint rounds either way depending on the GEMM's summation
    order (a chunked prefill sums differently from a whole one), and one flipped FP8 value can move a tiny random
    model's routing and logits far past the comparison's tolerance: such draws test the BLAS, not the cache."""
    for _ in range(50):
        tokens = rng.integers(3, VOCAB, length).tolist()
        margins: list[float] = []
        with fp8_cache_reference(model, margins):
            ref = last_logits(model, tokens)
        if min(margins) > 1e-4:  # float32 noise is ~1e-5 e4m3 ulps
            return tokens, ref
    raise AssertionError(f"no draw of {length} tokens kept its latents clear of e4m3 rounding ties")


def rel_err(got, ref) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", ["v3", "v2"])
def test_fp8_cache_logits_match_transformers_with_fp8_latents(checkpoints, name):
    model = load_reference(checkpoints[name])
    s = scorer(checkpoints[name], fp8=True)
    rng = np.random.default_rng(3)
    for length in (1, 9, 40):
        tokens, ref = tokens_clear_of_rounding_ties(model, rng, length)
        exact = last_logits(model, tokens)
        quantization_effect = rel_err(ref, exact)
        # One prefill; chunked prefill over a cached prefix; prefill then absorbed decode steps.
        for chunk, tail in ((0, 0), (5, 0), (0, min(4, length - 1))):
            err = rel_err(s.last_logits(tokens, chunk, tail), ref)
            assert err <= 1e-4, f"{name} length={length} chunk={chunk} decode_tail={tail}: rel err {err:.2e}"
        if length > 1:  # the comparison must be able to tell an FP8 cache from a float32 one
            assert quantization_effect > 50 * 1e-4 or quantization_effect > 100 * err, (
                f"{name} length={length}: FP8 moves the logits by only {quantization_effect:.2e}")


def test_fp8_cache_greedy_with_preemption_and_prefix_caching_matches_transformers(checkpoints):
    """8 prompts of mixed lengths sharing a prefix, a cache too small for all: preemption and shared pages over the
    FP8 cache give the greedy tokens of the FP8-latent reference."""
    path = checkpoints["v3"]
    model = load_reference(path)
    rng = np.random.default_rng(11)
    shared = rng.integers(3, VOCAB, 12).tolist()
    prompts = [shared + rng.integers(3, VOCAB, n).tolist() for n in (3, 17, 9, 28, 1, 20, 12, 5)]
    with fp8_cache_reference(model):
        expected = [hf_greedy(model, p, 24) for p in prompts]
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), kv_cache_dtype="fp8", page_size=4,
                                              num_cache_pages=40, max_model_len=96, max_num_batched_tokens=64))
    try:
        outs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24))
        stats = engine.stats()
        assert stats.num_preemptions > 0, "the cache was meant to be too small for all 8 requests"
        assert stats.prefix_cache_hits > 0, "the shared prefix was meant to hit the prefix cache"
        for i, (out, exp) in enumerate(zip(outs, expected)):
            assert list(out.token_ids) == exp, f"prompt {i}"
    finally:
        engine.shutdown()


def test_fp8_cache_holds_more_tokens_in_the_same_memory(checkpoints):
    """Same cache budget: pages scale with the row size (float32 on the CPU: 56 values x 4 bytes; FP8: 40 codes, one
    scale, 16 bf16 rope values, padded to 80 bytes), and the engine and /metrics report the cache's dtype and bytes."""
    from deepinfer.server.metrics import ServerMetrics

    path = checkpoints["v3"]
    pages, info = {}, {}
    for dtype in ("auto", "fp8"):
        engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), kv_cache_dtype=dtype,
                                                  cache_memory_gb=0.01, max_model_len=256))
        try:
            pages[dtype] = engine.stats().num_cache_pages
            info[dtype] = engine.cache_info
            metrics = ServerMetrics(engine, "m").render().decode()
        finally:
            engine.shutdown()
        row = f'deepinfer_cache_bytes_per_token{{dtype="{info[dtype]["dtype"]}",model_name="m"}} ' \
              f'{float(info[dtype]["bytes_per_token"])}'
        assert row in metrics
    layers = 3
    assert info == {"auto": {"dtype": "float32", "bytes_per_token": 224 * layers},
                    "fp8": {"dtype": "float8_e4m3fn", "bytes_per_token": 80 * layers}}
    assert pages["fp8"] == pytest.approx(pages["auto"] * 224 / 80, rel=0.01)


@pytest.mark.parametrize("value", ["fp8", "fp8_e4m3", "auto"])
def test_kv_cache_dtype_values(value):
    assert EngineConfig(kv_cache_dtype=value).kv_cache_dtype == value


def test_kv_cache_dtype_unknown_fails_before_loading():
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        EngineConfig(kv_cache_dtype="int8")
