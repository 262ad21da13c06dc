"""compressed-tensors' block-FP8 checkpoints (llm-compressor's FP8_BLOCK) on a GPU: their e4m3 codes and block scales
stay FP8 in HBM, as DeepSeek's own FP8 checkpoints do, and the engine's logits match the same engine on the weights as
compressed-tensors decompresses them, stored in bf16; the layers an FP8 checkpoint leaves in bf16 stay bf16. The FP8
kernels themselves are checked against the CPU reference op by op (tests/cpp/cuda_fp8_gemm_test.cpp). Needs a CUDA
device and a build with the CUDA backend; skipped otherwise."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer
from test_checkpoint_loading import compress_fp8_block, deepseek_fp8
from test_int4 import write_like
from test_int4_cuda import assert_planned_as_held, base, bf16_error, check_against_dequantized  # noqa: F401

pytestmark = pytest.mark.skipif(_deepinfer.cuda_device_count() == 0, reason="needs a CUDA device")


@pytest.mark.parametrize("arch, weight_only", [("v3", False), ("v2", False), ("v3", True)],
                         ids=["v3-w8a8", "v2-w8a8", "v3-w8a16"])
def test_compressed_tensors_fp8_block_checkpoints_run_fp8_on_the_gpu(base, bf16_error, tmp_path, arch, weight_only):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, quantization, dequantized = compress_fp8_block(sd, weight_only)
    checkpoint = write_like(base[arch], tmp_path / "ct", packed, quantization)
    plain = write_like(base[arch], tmp_path / "plain", {k: v.to(torch.bfloat16) for k, v in dequantized.items()})
    check_against_dequantized(checkpoint, plain, bf16_error[arch], fp8_weights=True,
                              fp8_activations=not weight_only)
    config = EngineConfig(model_name_or_path=str(checkpoint), device="cuda", num_cache_pages=16, max_model_len=64,
                          enforce_eager=True)
    with DeepInferenceEngine(config) as e:
        assert e.weight_bytes["float8_e4m3fn"] > 4 * e.weight_bytes.get("float32", 0)
        assert_planned_as_held(config, e)


@pytest.mark.parametrize("form", ["deepseek", "compressed-tensors"])
def test_layers_an_fp8_checkpoint_stores_in_bf16_stay_bf16_on_the_gpu(base, bf16_error, tmp_path, form):
    """The linear layers an FP8 checkpoint leaves unquantized (modules_to_not_convert; compressed-tensors' ignore) are
    held in bf16 as stored, not rounded to FP8 at load: against the same checkpoint with every layer FP8 they add their
    bf16 bytes and take away their FP8 ones, the plan says so too, and the logits are the engine's on the dequantized
    weights with those layers in bf16. kv_a_proj in bf16 beside an FP8 q_a_proj runs one multi_linear of both."""
    sd = {k: v.to(torch.bfloat16) for k, v in load_file(str(base["v3"] / "model.safetensors")).items()}
    keep = ("model.layers.0.self_attn.kv_a_proj_with_mqa", "model.layers.1.self_attn.o_proj")
    held = {}
    for name, kept in (("all_fp8", ()), ("kept", keep)):
        if form == "deepseek":
            packed, quantization, dequantized = deepseek_fp8(sd, kept)
        else:
            packed, quantization, dequantized = compress_fp8_block(sd, ignore=tuple(re.escape(m) + "$" for m in kept))
        checkpoint = write_like(base["v3"], tmp_path / name, packed, quantization)
        config = EngineConfig(model_name_or_path=str(checkpoint), device="cuda", num_cache_pages=16, max_model_len=64,
                              enforce_eager=True)
        with DeepInferenceEngine(config) as e:
            held[name] = dict(e.weight_bytes)
            assert_planned_as_held(config, e)
    plain = write_like(base["v3"], tmp_path / "plain", {k: v.to(torch.bfloat16) for k, v in dequantized.items()})
    check_against_dequantized(checkpoint, plain, bf16_error["v3"], fp8_weights=True)
    kept_elements = sum(sd[m + ".weight"].numel() for m in keep)
    assert held["kept"]["bfloat16"] - held["all_fp8"]["bfloat16"] == 2 * kept_elements
    assert held["all_fp8"]["float8_e4m3fn"] - held["kept"]["float8_e4m3fn"] == kept_elements
