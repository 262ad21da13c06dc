"""FP4 weights (e2m1 with group scales) on the CPU backend (the reference; the GPU's packed kernels: test_fp4_cuda.py),
weight-only: compressed-tensors NVFP4 and MXFP4
checkpoints and ModelOpt's NVFP4 export, against transformers in fp32 on the weights as each format's own library
dequantizes them, and the errors that come before a weight is read.

The checkpoints are written by the formats' libraries: compressed-tensors' NVFP4PackedCompressor /
MXFP4PackedCompressor (scales from its calculate_qparams and generate_gparam) and ModelOpt's NVFP4QTensor.quantize
(what its export stores: weight, weight_scale, weight_scale_2). The references dequantize with the same libraries
in float32 (compressed-tensors' own decompress rounds to bf16, so its dequantize is called on float32 values)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import require_module
from test_int4 import (DIMS, KEEP, TOLERANCE, engine_logits, is_linear, reference_logits, relative_error,  # noqa: F401
                       base, write_like)

require_module("compressed_tensors")
from compressed_tensors.compressors.mxfp4 import MXFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402

from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer  # noqa: E402
from deepinfer.config import QuantizationConfig as DiQuantization, resolve_weight_format  # noqa: E402

# compressed-tensors' presets: weight-only NVFP4 and MXFP4, and NVFP4 with FP4 activations (loaded weight-only).
SCHEMES = {"nvfp4": ("NVFP4A16", NVFP4PackedCompressor, "nvfp4-pack-quantized"),
           "nvfp4-w4a4": ("NVFP4", NVFP4PackedCompressor, "nvfp4-pack-quantized"),
           "mxfp4": ("MXFP4A16", MXFP4PackedCompressor, "mxfp4-pack-quantized")}


def compress_ct_fp4(sd: dict, preset: str):
    """(the compressed tensors, config.json's quantization_config, the weights the library dequantizes)."""
    name_of_scheme, compressor, fmt = SCHEMES[preset]
    scheme = preset_name_to_scheme(name_of_scheme, ["Linear"])
    args = scheme.weights
    out, dequantized = {}, {}
    for name, t in sd.items():
        if not is_linear(name, t) or name.startswith(KEEP):
            out[name] = t
            continue
        w = t.float()
        g = w.reshape(w.shape[0], -1, args.group_size)
        global_scale = generate_gparam(w.amin(), w.amax()) if compressor is NVFP4PackedCompressor else None
        scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), args, global_scale=global_scale)
        state = {"weight": w, "weight_scale": scale}
        if global_scale is not None:
            state["weight_global_scale"] = global_scale
        packed = compressor.compress(state, scheme)
        module = name.removesuffix(".weight")
        packed["weight_shape"] = torch.tensor(w.shape, dtype=torch.int64)
        for key, value in packed.items():
            out[f"{module}.{key}"] = value
        codes = unpack_fp4_from_uint8(packed["weight_packed"], *w.shape, dtype=torch.float32)
        stored_scale = compressor._decompress_scale(packed["weight_scale"], torch.float32)
        dequantized[name] = dequantize(codes, stored_scale, args=args, global_scale=global_scale,
                                       dtype=torch.float32)
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt,
                                ignore=["lm_head", "re:.*mlp\\.gate$", KEEP], quantization_status="compressed")
    return out, config.model_dump(mode="json"), dequantized


@pytest.mark.parametrize("arch, preset", [("v3", "nvfp4"), ("v2", "nvfp4"), ("v3", "nvfp4-w4a4"), ("v3", "mxfp4"),
                                          ("v2", "mxfp4")])
def test_compressed_tensors_fp4_checkpoints_match_transformers_on_the_dequantized_weights(
        base, tmp_path, arch, preset):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, quantization, dequantized = compress_ct_fp4(sd, preset)
    assert f"{KEEP}.weight" in packed and not any(k.endswith("mlp.gate.weight_packed") for k in packed)
    assert packed["model.layers.0.self_attn.o_proj.weight_packed"].dtype == torch.uint8
    checkpoint = write_like(base[arch], tmp_path / "ct", packed, quantization)
    reference = write_like(base[arch], tmp_path / "plain", {**sd, **dequantized})
    assert _deepinfer.load_model_config(str(checkpoint)).fp4_format == preset.removesuffix("-w4a4")
    want = reference_logits(reference)
    assert relative_error(engine_logits(checkpoint), want) <= TOLERANCE
    # The FP4 model is not the original: the comparison above is of the quantized weights.
    assert relative_error(reference_logits(base[arch]), want) > 10 * TOLERANCE


# ---------------------------------------------------------------------------------------------- ModelOpt

def quantize_modelopt(sd: dict, exclude: str = KEEP):
    """ModelOpt's NVFP4 export of the linear layers (NVFP4QTensor.quantize: weight U8, weight_scale e4m3,
    weight_scale_2 f32, as its unified checkpoint stores them), and what its dequantize gives back."""
    nvfp4 = require_module("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    out, dequantized = {}, {}
    for name, t in sd.items():
        if not is_linear(name, t) or name.startswith(exclude):
            out[name] = t
            continue
        q, scale, scale_2 = nvfp4.NVFP4QTensor.quantize(t.float(), 16)
        module = name.removesuffix(".weight")
        out.update({name: q._quantized_data, f"{module}.weight_scale": scale,
                    f"{module}.weight_scale_2": scale_2.reshape([]).float(),
                    f"{module}.input_scale": torch.tensor(1.0)})
        dequantized[name] = q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2,
                                         block_sizes={-1: 16}).float()
    return out, dequantized


@pytest.mark.parametrize("arch, record", [("v3", "config.json"), ("v2", "config.json"),
                                          ("v3", "hf_quant_config.json")])
def test_modelopt_nvfp4_checkpoints_match_transformers_on_the_dequantized_weights(base, tmp_path, arch, record):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, dequantized = quantize_modelopt(sd)
    settings = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                "exclude_modules": ["lm_head", KEEP]}
    if record == "config.json":
        checkpoint = write_like(base[arch], tmp_path / "mo", packed, {"quant_method": "modelopt", **settings})
    else:  # older exports: the record beside config.json, as the NVIDIA FP4 DeepSeek releases ship it
        checkpoint = write_like(base[arch], tmp_path / "mo", packed)
        (checkpoint / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": settings}))
    reference = write_like(base[arch], tmp_path / "plain", {**sd, **dequantized})
    assert _deepinfer.load_model_config(str(checkpoint)).fp4_format == "modelopt-nvfp4"
    assert relative_error(engine_logits(checkpoint), reference_logits(reference)) <= TOLERANCE
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoint), device="cpu", num_cache_pages=16,
                                          max_model_len=64)) as e:
        assert set(e.weight_bytes) == {"float32"}


# ---------------------------------------------------------------------------------------------- errors

@pytest.fixture(scope="module")
def nvfp4_checkpoint(base):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    packed, quantization, _ = compress_ct_fp4(sd, "nvfp4")
    return packed, quantization


def load_error(path: Path) -> str:
    with pytest.raises(ValueError) as e:
        engine_logits(path)
    return str(e.value)


O_PROJ = "model.layers.0.self_attn.o_proj"


def test_a_weight_shape_that_disagrees_with_the_codes_is_refused_naming_it(base, tmp_path, nvfp4_checkpoint):
    packed, quantization = nvfp4_checkpoint
    bad = {**packed, f"{O_PROJ}.weight_shape": torch.tensor([96, 64], dtype=torch.int64)}
    message = load_error(write_like(base["v3"], tmp_path / "c", bad, quantization))
    assert f"{O_PROJ}.weight_shape says [96, 64]" in message and "two values a byte" in message


def test_group_scales_of_the_wrong_shape_or_dtype_are_refused_naming_them(base, tmp_path, nvfp4_checkpoint):
    packed, quantization = nvfp4_checkpoint
    scale = packed[f"{O_PROJ}.weight_scale"]
    wrong_shape = {**packed, f"{O_PROJ}.weight_scale": scale[:, :-1].contiguous()}
    assert f"{O_PROJ}.weight_scale has shape" in load_error(write_like(base["v3"], tmp_path / "s", wrong_shape,
                                                                       quantization))
    wrong_dtype = {**packed, f"{O_PROJ}.weight_scale": scale.float()}
    message = load_error(write_like(base["v3"], tmp_path / "d", wrong_dtype, quantization))
    assert f"{O_PROJ}.weight_scale is F32" in message and "F8_E4M3" in message
    no_global = {k: v for k, v in packed.items() if k != f"{O_PROJ}.weight_global_scale"}
    assert f"has no {O_PROJ}.weight_global_scale" in load_error(write_like(base["v3"], tmp_path / "g", no_global,
                                                                           quantization))


def test_a_group_size_the_format_lacks_and_an_unknown_algorithm_are_refused(base, tmp_path, nvfp4_checkpoint):
    packed, quantization = nvfp4_checkpoint
    q = json.loads(json.dumps(quantization))
    q["config_groups"]["group_0"]["weights"]["group_size"] = 32
    message = load_error(write_like(base["v3"], tmp_path / "g", packed, q))
    assert "weights.group_size is 32; NVFP4 scales groups of 16" in message
    q = json.loads(json.dumps(quantization))
    q["config_groups"]["group_1"] = {**q["config_groups"]["group_0"], "format": "pack-quantized"}
    assert "one quantized format for every layer" in load_error(write_like(base["v3"], tmp_path / "m", packed, q))
    message = load_error(write_like(base["v3"], tmp_path / "a", packed, {"quant_method": "modelopt",
                                                                         "quant_algo": "FP8"}))
    assert "quant_algo 'FP8' is not supported" in message


def test_quantizing_an_fp4_checkpoint_again_is_refused_before_loading(base, tmp_path, nvfp4_checkpoint):
    packed, quantization = nvfp4_checkpoint
    path = write_like(base["v3"], tmp_path / "c", packed, quantization)
    with pytest.raises(ValueError, match="already quantized"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), device="cpu", quantization="fp8"))
    with pytest.raises(ValueError, match="already quantized"):
        resolve_weight_format(DiQuantization(method="int4"), False, "", "cpu", "mxfp4")
    options = _deepinfer.EngineOptions()
    options.model_path, options.device, options.int4_weights = str(path), "cpu", True
    with pytest.raises(ValueError, match="already quantized"):
        _deepinfer.SequenceScorer(options)
    # As stored, on either backend (the GPU keeps the e2m1 codes packed: test_fp4_cuda.py).
    assert resolve_weight_format(None, False, "", "cpu", "modelopt-nvfp4").fp4 == "modelopt-nvfp4"
    assert resolve_weight_format(None, False, "", "cuda", "nvfp4").fp4 == "nvfp4"
    assert np.isfinite(engine_logits(path)).all()


def test_random_weights_for_an_fp4_config_are_rounded_to_it(base, tmp_path):
    """load_format="dummy" on an NVFP4 checkpoint's config (what engine_bench --quantization nvfp4 runs): the random
    linear weights are rounded to NVFP4 as they load (model/fp4_source.h make_fp4_rounding_source), so the logits
    move by a quantization's error from those of the same random weights unrounded, and are reproducible."""
    config = json.loads((base["v3"] / "config.json").read_text())
    plain, nvfp4 = tmp_path / "plain", tmp_path / "nvfp4"
    for d, extra in ((plain, {}), (nvfp4, {"quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**config, **extra}))
    dummy = _deepinfer.LoadFormat.dummy
    want, got = engine_logits(plain, load_format=dummy), engine_logits(nvfp4, load_format=dummy)
    assert 1e-3 < relative_error(got, want) < 0.5
    assert np.array_equal(got, engine_logits(nvfp4, load_format=dummy))


def test_the_engine_benchmark_runs_an_nvfp4_config_and_counts_its_bytes(tmp_path):
    """engine_bench.py --quantization nvfp4 (the smoke shape on the CPU): the shape's config carries ModelOpt's NVFP4
    record, the engine rounds its random weights to it, and the roofline counts NVFP4's bytes (half a byte a
    weight and a float32 scale per 16) for the linear layers."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    import bench_common
    import engine_bench

    assert engine_bench.main(["--shapes", "smoke", "--device", "cpu", "--quantization", "nvfp4", "--modes", "eager",
                              "--batches", "1", "--contexts", "32", "--decode-steps", "2", "--skip-steps", "1",
                              "--ttft-contexts", "32", "--ttft-repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "engine_bench.json").read_text())
    shape = result["shapes"]["smoke"]
    assert result["quantization"] == "nvfp4"
    assert shape["config"]["quantization_config"]["quant_algo"] == "NVFP4"
    row = shape["modes"]["eager"]["decode"][0]
    assert row["status"] == "ok"
    c, mid = shape["config"], row["cache_context"]
    assert row["weight_bytes_per_step"] == bench_common.step_bytes(c, 1, mid, "nvfp4")[0]
    assert row["weight_bytes_per_step"] < bench_common.step_bytes(c, 1, mid, "bf16")[0]
    assert bench_common.BYTES_PER_WEIGHT["nvfp4"] == 0.5 + 4 / 16
