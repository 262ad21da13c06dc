"""FP4 weights on a GPU (weight-only NVFP4 / MXFP4): the checkpoint's e2m1 codes stay packed, in the INT4 kernels'
word layout, and every kernel unpacks them to bf16 in registers (the skinny GEMM at decode sizes, the widening path at
prefill sizes, the MoE experts). The CUDA engine's logits on an FP4 checkpoint against the same engine on the weights
as the format's own library dequantizes them, stored in bf16: compressed-tensors NVFP4 and MXFP4 checkpoints written
by compressed-tensors (test_fp4.py's writer) and ModelOpt's NVFP4 export where ModelOpt installs. The kernels
themselves are checked against the CPU reference op by op (tests/cpp/cuda_int4_gemm_test.cpp, cuda_moe_int4_test.cpp).

Needs a CUDA device and a build with the CUDA backend; skipped otherwise. The models are test_int4_cuda.py's (DeepSeek's
real MLA dimensions, every token routed to every expert)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer
from test_fp4 import compress_ct_fp4, quantize_modelopt
from test_int4 import KEEP, TOKENS, write_like
from test_int4_cuda import assert_planned_as_held, base, bf16_error, check_against_dequantized  # noqa: F401

pytestmark = pytest.mark.skipif(_deepinfer.cuda_device_count() == 0, reason="needs a CUDA device")


@pytest.mark.parametrize("arch, preset", [("v3", "nvfp4"), ("v2", "nvfp4"), ("v3", "mxfp4"), ("v3", "nvfp4-w4a4")])
def test_compressed_tensors_fp4_checkpoints_run_packed_on_the_gpu(base, bf16_error, tmp_path, arch, preset):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, quantization, dequantized = compress_ct_fp4(sd, preset)
    checkpoint = write_like(base[arch], tmp_path / "ct", packed, quantization)
    plain = write_like(base[arch], tmp_path / "plain",
                       {**sd, **{name: w.to(torch.bfloat16) for name, w in dequantized.items()}})
    check_against_dequantized(checkpoint, plain, bf16_error[arch])
    # The GPU holds the e2m1 words (half a byte a weight) and their float32 group scales, not widened weights.
    config = EngineConfig(model_name_or_path=str(checkpoint), device="cuda", num_cache_pages=16, max_model_len=64,
                          enforce_eager=True)
    with DeepInferenceEngine(config) as e:
        assert e.weight_bytes["fp4_e2m1"] > 0 and "int4" not in e.weight_bytes
        assert_planned_as_held(config, e)


def test_modelopt_nvfp4_checkpoints_run_packed_on_the_gpu(base, bf16_error, tmp_path):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    packed, dequantized = quantize_modelopt(sd)
    settings = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                "exclude_modules": ["lm_head", KEEP]}
    checkpoint = write_like(base["v3"], tmp_path / "mo", packed, {"quant_method": "modelopt", **settings})
    plain = write_like(base["v3"], tmp_path / "plain",
                       {**sd, **{name: w.to(torch.bfloat16) for name, w in dequantized.items()}})
    check_against_dequantized(checkpoint, plain, bf16_error["v3"])


def test_fp4_generation_through_the_seeds_api_with_cuda_graphs(base, tmp_path):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    packed, quantization, _ = compress_ct_fp4(sd, "nvfp4")
    checkpoint = write_like(base["v3"], tmp_path / "ct", packed, quantization)
    config = EngineConfig(model_name_or_path=str(checkpoint), device="cuda", num_cache_pages=64, max_model_len=128,
                          enforce_eager=False)
    with DeepInferenceEngine.from_config(config) as e:
        outputs = e.generate([TOKENS, TOKENS[:5]], temperature=0.0, max_tokens=12, ignore_eos=True)
        assert all(len(o.token_ids) == 12 for o in outputs)
