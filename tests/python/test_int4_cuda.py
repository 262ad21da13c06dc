"""INT4 weights on a GPU: the checkpoint's 4-bit words stay packed and the W4A16 kernels unpack them in registers
(the INT4 skinny GEMM at decode sizes, the widening path at prefill sizes, the MoE experts). The CUDA engine's
logits on a 4-bit checkpoint against the same engine on the dequantized weights stored in bf16 (compressed-tensors'
own decompression, compressed-tensors' AutoAWQ converter; for rounding at load, round-to-nearest written here in
torch, equal to the engine's on the CPU): compressed-tensors checkpoints written by compressed-tensors, an AWQ one in
AutoAWQ's layout, and rounding at load. The kernels themselves are checked against the CPU reference op by op
(tests/cpp/cuda_int4_gemm_test.cpp, cuda_moe_int4_test.cpp).

Needs a CUDA device and a build with the CUDA backend; skipped otherwise. The models have DeepSeek's real MLA
dimensions and 16 heads (what the CUDA attention kernels take), random weights, and K a multiple of 128 in every projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import write_checkpoint
from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer
from deepinfer.model_dims import load_model_dims
from deepinfer.plan import plan_memory
from test_int4 import (KEEP, TOKENS, awq_reference, compress_ct, engine_logits, is_linear, quantize_awq, relative_error,
                       write_like)

pytestmark = pytest.mark.skipif(_deepinfer.cuda_device_count() == 0, reason="needs a CUDA device")

# The 4-bit kernels multiply the exact dequantized weights (or round them to bf16 once, as the bf16 reference holds
# them), so the two GPU runs differ by rounding alone: at most twice what the unquantized model's GPU and CPU runs
# differ by (BF16_FACTOR), or TOLERANCE, whichever is larger. A kernel that misreads a nibble, a scale or a zero point
# moves the logits by far more.
TOLERANCE = 3e-2
BF16_FACTOR = 2.0
# Every token routes to every expert (top-k = E, one group): random weights leave routing scores near-tied, so a
# rounding-sized difference could swap an expert for one token and move the logits far past any rounding bound (seen:
# one sequence in eight at 0.2-1.0 in every 4-bit form, symmetric or not, the rest at the unquantized model's 0.03).
# With every expert chosen the routing weights still come from the router, continuously, and every expert's kernel
# sees every token.
MLA = dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_attention_heads=16,
           num_key_value_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
           n_routed_experts=8, num_experts_per_tok=8, n_group=1, topk_group=1)
DIMS = {"v3": dict(MLA, q_lora_rank=384), "v2": dict(MLA)}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4_cuda_base")
    return {arch: write_checkpoint(root / arch, arch, seed=60 + i, **DIMS[arch]) for i, arch in enumerate(DIMS)}


def cuda_and_cpu(path, **options) -> tuple[np.ndarray, np.ndarray]:
    return engine_logits(path, device="cuda", **options), engine_logits(path, device="cpu", **options)


@pytest.fixture(scope="module")
def bf16_error(base):
    """arch -> the GPU-vs-CPU relative error of the unquantized checkpoint (bf16 on the GPU)."""
    return {arch: relative_error(*cuda_and_cpu(path)) for arch, path in base.items()}


def assert_close(got, want, baseline: float, what: str) -> None:
    err = relative_error(got, want)
    assert err <= max(TOLERANCE, BF16_FACTOR * baseline), f"{what} {err:.4f}, bf16 GPU vs CPU {baseline:.4f}"


def check_against_dequantized(checkpoint, dequantized_checkpoint, baseline: float, **options) -> None:
    """The 4-bit checkpoint on the GPU against its dequantized weights in bf16 on the GPU: the same activations and
    routing arithmetic, so what differs is the kernels (the CPU against transformers is test_int4.py's; a GPU run
    against the CPU one also moves with every routing near-tie of these random weights, so it is not the measure)."""
    gpu = engine_logits(checkpoint, device="cuda", **options)
    reference = engine_logits(dequantized_checkpoint, device="cuda")
    assert_close(gpu, reference, baseline, "INT4 GPU vs its dequantized weights in bf16 on the GPU")


def assert_planned_as_held(config: EngineConfig, engine: DeepInferenceEngine) -> None:
    """`deepinfer plan`'s weight bytes by dtype are what the engine holds: the checkpoint's groups, zero points (or
    none) and the layers its config leaves unquantized (KEEP, the router) in bf16."""
    planned = plan_memory(load_model_dims(config.model_name_or_path), config, gpu_memory_bytes=1 << 40)
    assert planned.weight_bytes == dict(engine.weight_bytes)


def round_to_nearest(w: torch.Tensor, group_size: int, symmetric: bool) -> torch.Tensor:
    """quantization="int4"'s rounding (model/int4.h round_int4) of a [.., N, K] weight along K, dequantized."""
    shape, k = w.shape, w.shape[-1]
    n = w.numel() // k
    g = w.float().reshape(n, -1, group_size if group_size > 0 else k)
    if symmetric:
        s = g.abs().amax(-1, keepdim=True) / 7
        q = torch.where(s > 0, torch.clamp(torch.round(g / s), -8, 7), torch.zeros_like(g))
        return (q * s).reshape(shape)
    lo, hi = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
    s = (hi - lo) / 15
    safe = torch.where(s > 0, s, torch.ones_like(s))
    z = torch.round(-lo / safe)
    q = torch.clamp(torch.round(g / safe) + z, 0, 15)
    return torch.where(s > 0, (q - z) * s, torch.zeros_like(g)).reshape(shape)


@pytest.mark.parametrize("arch, group_size, symmetric", [
    ("v3", 128, False), ("v3", 128, True), ("v2", 64, False), ("v3", -1, True),
], ids=["v3-g128-asym", "v3-g128-sym", "v2-g64-asym", "v3-channel-sym"])
def test_compressed_tensors_checkpoints_run_packed_on_the_gpu(base, bf16_error, tmp_path, arch, group_size,
                                                               symmetric):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, quantization, dequantized = compress_ct(sd, group_size, symmetric, torch.bfloat16)
    checkpoint = write_like(base[arch], tmp_path / "ct", packed, quantization)
    plain = write_like(base[arch], tmp_path / "plain", {**sd, **dequantized})
    check_against_dequantized(checkpoint, plain, bf16_error[arch])
    # The GPU holds the 4-bit words, not widened weights (the one layer left unquantized stays bf16).
    config = EngineConfig(model_name_or_path=str(checkpoint), device="cuda", num_cache_pages=16, max_model_len=64,
                          enforce_eager=True)
    with DeepInferenceEngine(config) as e:
        assert e.weight_bytes["int4"] > 4 * e.weight_bytes.get("float32", 0)
        assert_planned_as_held(config, e)


def test_awq_checkpoints_run_packed_on_the_gpu(base, bf16_error, tmp_path):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    packed, dequantized = {}, {}
    for name, t in sd.items():
        if not is_linear(name, t) or name.startswith(KEEP):
            packed[name] = t
            continue
        qweight, qzeros, scales = quantize_awq(t, 128)
        module = name.removesuffix(".weight")
        packed.update({f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales})
        dequantized[name] = awq_reference(qweight, qzeros, scales, 128)
    quantization = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                    "modules_to_not_convert": [KEEP]}
    check_against_dequantized(write_like(base["v3"], tmp_path / "awq", packed, quantization),
                              write_like(base["v3"], tmp_path / "plain", {**sd, **dequantized}), bf16_error["v3"])


def rounds(name: str, t: torch.Tensor) -> bool:
    """The tensors quantization="int4" rounds (model/int4_source.h is_int4_linear): every projection, the fused
    experts (each row of each expert) included; not the router, embeddings, lm_head or norms."""
    return t.dim() >= 2 and (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")
                             or name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"))


@pytest.mark.parametrize("group_size, symmetric", [(128, False), (32, True)])
def test_rounding_at_load_runs_packed_on_the_gpu(base, bf16_error, tmp_path, group_size, symmetric):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    rounded = {name: round_to_nearest(t, group_size, symmetric) if rounds(name, t) else t for name, t in sd.items()}
    check_against_dequantized(base["v3"], write_like(base["v3"], tmp_path / "rounded", rounded), bf16_error["v3"],
                              int4_weights=True, int4_group_size=group_size, int4_symmetric=symmetric)
    # Greedy generation on the GPU through the seed's API and CUDA graphs, 4-bit weights and all.
    config = EngineConfig(model_name_or_path=str(base["v3"]), device="cuda", num_cache_pages=64, max_model_len=128,
                          quantization={"method": "int4", "group_size": group_size, "symmetric": symmetric})
    with DeepInferenceEngine.from_config(config) as e:
        outputs = e.generate([TOKENS, TOKENS[:5]], temperature=0.0, max_tokens=12, ignore_eos=True)
        assert all(len(o.token_ids) == 12 for o in outputs)
