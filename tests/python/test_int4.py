"""INT4 weights on the CPU backend: compressed-tensors pack-quantized (W4A16) and AutoAWQ GEMM checkpoints, and
round-to-nearest INT4 at load (quantization="int4"), against transformers in fp32 on the same weights, and the
errors that come before a weight is read.

compressed-tensors writes the test checkpoints with its own compressor (PackedQuantizationCompressor.compress, scales
and zero points from its calculate_qparams) and unpacks them for the reference (decompress). AutoAWQ does not install
on a CPU-only machine with its dependencies, so the AWQ packer is written here (WQLinear_GEMM.from_linear's layout:
nibble j of a word holds column 0 2 4 6 1 3 5 7 [j] of its 8); the reference unpacks it with compressed-tensors'
AutoAWQConverter (the AutoAWQ -> compressed-tensors converter, which reverses AWQ's order) and decompress. The
references dequantize with float32 scales (the stored bf16/fp16 scales widened), as the engine does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import load_reference, require_module, write_checkpoint

ct = require_module("compressed_tensors")
from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402

from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer  # noqa: E402
from deepinfer.config import QuantizationConfig as DiQuantization, resolve_weight_format  # noqa: E402

TOKENS = [5, 77, 300, 12, 9, 401, 250, 3, 64, 128, 17]
TOLERANCE = 1e-4  # max |diff| / max |ref| of the last logits; the CPU computes in fp32
# Every linear layer's K (96, 160, 64) and N a multiple of 32 and of 8, so group 32 and AWQ's packing along N apply.
DIMS = {"v3": dict(moe_intermediate_size=64, q_lora_rank=64, kv_lora_rank=64, v_head_dim=24),
        "v2": dict(moe_intermediate_size=64, kv_lora_rank=64, v_head_dim=24)}
KEEP = "model.layers.0.self_attn.kv_a_proj_with_mqa"  # left unquantized (in `ignore`): it must load as stored


def is_linear(name: str, t: torch.Tensor) -> bool:
    """The layers DeepSeek's quantized checkpoints quantize (the router, embeddings, lm_head and norms stay)."""
    return t.dim() == 2 and (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4_base")
    return {arch: write_checkpoint(root / arch, arch, seed=40 + i, **DIMS[arch]) for i, arch in enumerate(DIMS)}


def write_like(src: Path, dst: Path, tensors: dict, quantization_config: dict | None = None) -> Path:
    """A copy of checkpoint `src` (config, tokenizer) with `tensors` and config.json's quantization_config."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json" and f.is_file():
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def engine_logits(path: Path, **options) -> np.ndarray:
    o = _deepinfer.EngineOptions()
    o.model_path = str(path)
    o.page_size = 4
    for k, v in options.items():
        setattr(o, k, v)
    return np.asarray(_deepinfer.SequenceScorer(o).last_logits(TOKENS, 0, 2))


def reference_logits(path: Path) -> np.ndarray:
    with torch.no_grad():
        return load_reference(path)(torch.tensor([TOKENS])).logits[0, -1].float().numpy()


def relative_error(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


# ---------------------------------------------------------------------------------------------- compressed-tensors

def ct_scheme(group_size: int, symmetric: bool) -> QuantizationScheme:
    strategy = dict(strategy="group", group_size=group_size) if group_size > 0 else dict(strategy="channel")
    return QuantizationScheme(targets=["Linear"],
                              weights=QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, **strategy))


def compress_ct(sd: dict, group_size: int, symmetric: bool, scale_dtype: torch.dtype):
    """(the compressed tensors, config.json's quantization_config, the dequantized weights by the library)."""
    scheme = ct_scheme(group_size, symmetric)
    out, dequantized = {}, {}
    for name, t in sd.items():
        if not is_linear(name, t) or name.startswith(KEEP):
            out[name] = t
            continue
        w = t.float()
        g = w.reshape(w.shape[0], -1, group_size) if group_size > 0 else w.unsqueeze(1)
        scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
        module = name.removesuffix(".weight")
        packed = PackedQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zero}, scheme)
        for key, value in packed.items():
            out[f"{module}.{key}"] = value
        wide = {**packed, "weight_scale": packed["weight_scale"].float()}  # the stored scales, widened
        dequantized[name] = PackedQuantizationCompressor.decompress(wide, scheme)["weight"].float()
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                                ignore=["lm_head", "re:.*mlp\\.gate$", KEEP], quantization_status="compressed")
    return out, config.model_dump(mode="json"), dequantized


@pytest.mark.parametrize("arch, group_size, symmetric, scale_dtype", [
    ("v3", 32, True, torch.bfloat16), ("v3", 32, False, torch.float32), ("v2", 32, False, torch.float16),
    ("v2", -1, True, torch.bfloat16), ("v3", -1, False, torch.bfloat16),
], ids=["v3-g32-sym-bf16", "v3-g32-asym-f32", "v2-g32-asym-f16", "v2-channel-sym", "v3-channel-asym"])
def test_compressed_tensors_checkpoints_match_transformers_on_the_dequantized_weights(
        base, tmp_path, arch, group_size, symmetric, scale_dtype):
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, quantization, dequantized = compress_ct(sd, group_size, symmetric, scale_dtype)
    assert f"{KEEP}.weight" in packed and not any(k.endswith("mlp.gate.weight_packed") for k in packed)
    if not symmetric:
        assert any(k.endswith(".weight_zero_point") for k in packed)
    checkpoint = write_like(base[arch], tmp_path / "ct", packed, quantization)
    reference = write_like(base[arch], tmp_path / "plain", {**sd, **dequantized})
    assert _deepinfer.load_model_config(str(checkpoint)).int4_format == "compressed-tensors"
    got, want = engine_logits(checkpoint), reference_logits(reference)
    assert relative_error(got, want) <= TOLERANCE
    # The 4-bit model is not the original: the comparison above is of the quantized weights.
    assert relative_error(reference_logits(base[arch]), want) > 10 * TOLERANCE


# ---------------------------------------------------------------------------------------------- AWQ

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble j of a word holds column AWQ_ORDER[j] of its 8 (AutoAWQ's order_map)


def pack_awq(q: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit values [R, C] -> int32 [R, C / 8], packed along C in AWQ's interleaved order."""
    r, c = q.shape
    q = q.to(torch.int64).reshape(r, c // 8, 8)[:, :, AWQ_ORDER]
    words = sum(q[:, :, j] << (4 * j) for j in range(8))
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def quantize_awq(w: torch.Tensor, group_size: int):
    """AWQ's asymmetric groups along K (scale (max - min) / 15 in fp16, zero round(-min / scale)): qweight [K, N / 8],
    qzeros [K / G, N / 8], scales fp16 [K / G, N]."""
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    hi, lo = g.amax(-1), g.amin(-1)
    scale = ((hi - lo).clamp(min=1e-5) / 15).half()
    s = scale.float().unsqueeze(-1)
    zero = torch.round(-lo.unsqueeze(-1) / s).clamp(0, 15)
    q = torch.clamp(torch.round(g / s) + zero, 0, 15).reshape(n, k)
    return pack_awq(q.T.contiguous()), pack_awq(zero.squeeze(-1).T.contiguous()), scale.T.contiguous()


def awq_reference(qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """compressed-tensors' AutoAWQ converter, then its decompressor: the dequantized [N, K] weight."""
    converted = AutoAWQConverter(bits=4, group_size=group_size).process(
        {"m.qweight": qweight, "m.qzeros": qzeros, "m.scales": scales.float()})
    local = {k.removeprefix("m."): v for k, v in converted.items()}
    return PackedQuantizationCompressor.decompress(local, ct_scheme(group_size, symmetric=False))["weight"].float()


@pytest.mark.parametrize("arch", ["v3", "v2"])
def test_awq_checkpoints_match_transformers_on_the_dequantized_weights(base, tmp_path, arch):
    group_size = 32
    sd = load_file(str(base[arch] / "model.safetensors"))
    packed, dequantized = {}, {}
    for name, t in sd.items():
        if not is_linear(name, t) or name.startswith(KEEP):
            packed[name] = t
            continue
        module = name.removesuffix(".weight")
        qweight, qzeros, scales = quantize_awq(t, group_size)
        packed.update({f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales})
        dequantized[name] = awq_reference(qweight, qzeros, scales, group_size)
    quantization = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": [KEEP]}
    checkpoint = write_like(base[arch], tmp_path / "awq", packed, quantization)
    reference = write_like(base[arch], tmp_path / "plain", {**sd, **dequantized})
    assert relative_error(engine_logits(checkpoint), reference_logits(reference)) <= TOLERANCE
    # quantization="awq" asks for exactly this; the high-level engine holds float32 values on the CPU.
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoint), quantization="awq", device="cpu",
                                          num_cache_pages=16, max_model_len=64)) as e:
        assert set(e.weight_bytes) == {"float32"}


def test_awq_packing_is_what_the_converter_reverses():
    """One word, by hand: columns 0..7 holding 0..7 pack to 0x75316420, and come back in order."""
    q = torch.arange(8).reshape(1, 8)
    word = pack_awq(q)
    assert word.item() == 0x75316420
    unpacked, _ = AutoAWQConverter.unpack_awq(word, word, 4)
    ordered, _ = AutoAWQConverter.reverse_awq_order(unpacked, unpacked, 4)
    assert (ordered & 0xF).tolist() == [list(range(8))]  # the converter masks the shifted words to 4 bits next


# ---------------------------------------------------------------------------------------------- RTN at load

def rtn(w: torch.Tensor, group_size: int, symmetric: bool) -> torch.Tensor:
    """Round-to-nearest INT4 per group along K, dequantized (model/int4.h round_int4, in torch, in float32)."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    x = w.float().reshape(n, k // g, g)
    if symmetric:
        amax = x.abs().amax(-1, keepdim=True)
        s = amax / 7.0
        y = torch.clamp(torch.round(x / s), -8, 7) * s
        return torch.where(amax == 0, x, y).reshape(n, k)
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    s = (hi - lo) / 15.0
    z = torch.round(-lo / s)
    y = (torch.clamp(torch.round(x / s) + z, 0, 15) - z) * s
    return torch.where(hi == lo, x, y).reshape(n, k)


@pytest.mark.parametrize("arch, group_size, symmetric", [("v3", 32, False), ("v2", 32, False), ("v3", -1, False),
                                                         ("v2", 32, True)])
def test_rounding_at_load_is_the_python_rounding(base, tmp_path, arch, group_size, symmetric):
    sd = load_file(str(base[arch] / "model.safetensors"))
    rounded = {k: rtn(v, group_size, symmetric) if is_linear(k, v) else v for k, v in sd.items()}
    reference = write_like(base[arch], tmp_path / "rtn", rounded)
    got = engine_logits(base[arch], int4_weights=True, int4_group_size=group_size, int4_symmetric=symmetric)
    assert relative_error(got, engine_logits(reference)) <= TOLERANCE
    assert relative_error(got, reference_logits(reference)) <= TOLERANCE
    assert relative_error(got, engine_logits(base[arch])) > 10 * TOLERANCE  # it did round


def test_quantization_int4_in_the_seeds_form_rounds_at_load_and_plans_float32(base):
    from deepinfer.model_dims import load_model_dims
    from deepinfer.plan import plan_memory

    path = base["v3"]
    engine = dict(model_name_or_path=str(path), device="cpu", num_cache_pages=16, max_model_len=64,
                  quantization={"method": "int4", "weight_bits": 4, "activation_bits": 16, "group_size": 32})
    plan = plan_memory(load_model_dims(path), EngineConfig(**engine))
    with DeepInferenceEngine(EngineConfig(**engine)) as e:
        assert plan.weight_bytes == e.weight_bytes == {"float32": plan.weights_per_gpu}
        assert plan.weight_format == "int4 (float32 on the CPU)"
        out = e.generate([TOKENS], max_tokens=1, temperature=0.0)
    rounded = engine_logits(path, int4_weights=True, int4_group_size=32)
    assert out[0].outputs[0].token_ids[0] == int(np.argmax(rounded))


# ---------------------------------------------------------------------------------------------- errors

@pytest.fixture(scope="module")
def ct_checkpoint(base, tmp_path_factory):
    sd = load_file(str(base["v3"] / "model.safetensors"))
    packed, quantization, _ = compress_ct(sd, 32, False, torch.bfloat16)
    return packed, quantization


def bad_checkpoint(base, tmp_path, tensors, quantization) -> Path:
    return write_like(base["v3"], tmp_path / "bad", tensors, quantization)


def test_a_packed_tensor_that_disagrees_with_weight_shape_is_refused(base, ct_checkpoint, tmp_path):
    packed, quantization = ct_checkpoint
    name = "model.layers.1.self_attn.q_b_proj.weight_shape"
    path = bad_checkpoint(base, tmp_path, {**packed, name: torch.tensor([160, 80])}, quantization)
    with pytest.raises(ValueError, match=r"q_b_proj.weight_packed has shape \[160, 8\], but .*weight_shape is "
                                         r"\[160, 80\]"):
        engine_logits(path)


@pytest.mark.parametrize("edit, match", [
    (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=48),
     r"group_size 48 \(config.json\) does not divide K = 160, the input size of model\.layers\.0\.mlp\.down_proj"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=8), r"weights.num_bits is 8: only 4-bit"),
    (lambda q: q.update(quant_method="gptq"), r"quant_method 'gptq' is not supported"),
], ids=["group-size", "bits", "method"])
def test_bad_quantization_configs_are_refused(base, ct_checkpoint, tmp_path, edit, match):
    packed, quantization = ct_checkpoint
    quantization = json.loads(json.dumps(quantization))
    edit(quantization)
    path = bad_checkpoint(base, tmp_path, packed, quantization)
    with pytest.raises(ValueError, match=match):
        engine_logits(path)
    with pytest.raises(ValueError, match=match):  # the Python engine reads config.json first, before a weight
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), device="cpu"))


def test_awq_bits_other_than_4_are_refused(base, tmp_path):
    path = bad_checkpoint(base, tmp_path, {}, {"quant_method": "awq", "bits": 8, "group_size": 32, "version": "gemm"})
    with pytest.raises(ValueError, match=r"quantization_config.bits is 8"):
        _deepinfer.load_model_config(str(path))


def test_quantization_awq_needs_an_awq_checkpoint(base, ct_checkpoint, tmp_path):
    packed, quantization = ct_checkpoint
    for path in (base["v3"], bad_checkpoint(base, tmp_path, packed, quantization)):
        with pytest.raises(ValueError, match="quantization='awq' needs an AWQ checkpoint"):
            DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), quantization="awq", device="cpu"))


def test_a_rounding_group_that_does_not_divide_k_is_refused(base):
    with pytest.raises(ValueError, match=r"group_size 48 does not divide K = 64 of kv_b_proj"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(base["v3"]), device="cpu",
                                         quantization={"method": "int4", "group_size": 48}))
    with pytest.raises(ValueError, match="weight_bits=4 and activation_bits=16"):
        EngineConfig(quantization={"method": "int4", "weight_bits": 8})
    with pytest.raises(ValueError, match="symmetric"):
        EngineConfig(quantization={"method": "fp8", "symmetric": True})


def test_int4_is_planned_for_the_gpu_as_stored_or_rounded():
    # The Python engine's decision, before the tokenizer, the GPU memory check and any weight: 4-bit weights on a GPU
    # stay packed (tests/python/test_int4_cuda.py runs them there).
    assert resolve_weight_format(DiQuantization(method="int4"), False, "", "cuda").int4 == "rtn"
    for stored in ("awq", "compressed-tensors"):
        assert resolve_weight_format(None, False, stored, "cuda").int4 == stored
    assert resolve_weight_format(None, False, "", "cuda").int4 == ""


# ---------------------------------------------------------------------------------------------- parallel layouts

def greedy_with_logprobs(path: Path, **layout):
    """Greedy tokens and their logprobs of a few prompts, on the CPU at `layout`."""
    prompts = [{"prompt_token_ids": TOKENS}, {"prompt_token_ids": TOKENS[:4]}, {"prompt_token_ids": [7, 8, 9]}]
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), device="cpu", page_size=4,
                                          num_cache_pages=32, max_model_len=64, seed=3, **layout)) as e:
        outs = e.generate(prompts, temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    return ([o.outputs[0].token_ids for o in outs],
            np.array([t.logprob for o in outs for t in o.outputs[0].logprobs]))


@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2), dict(tensor_parallel_size=2,
                                                                          enable_expert_parallel=True)],
                         ids=["tp2", "tp2-ep"])
def test_int4_checkpoints_and_rounding_under_tensor_parallelism_are_one_ranks(base, ct_checkpoint, tmp_path, layout):
    """A compressed-tensors checkpoint (its packed words and groups split along K and N across ranks) and rounding at
    load (done before the split, so a group covers the same inputs) give one rank's tokens and logprobs."""
    packed, quantization = ct_checkpoint
    checkpoint = write_like(base["v3"], tmp_path / "ct", packed, quantization)
    for path, extra in ((checkpoint, {}), (base["v3"], dict(quantization={"method": "int4", "group_size": 32}))):
        ref_tokens, ref_logprobs = greedy_with_logprobs(path, **extra)
        tokens, logprobs = greedy_with_logprobs(path, **extra, **layout)
        assert tokens == ref_tokens
        assert np.abs(logprobs - ref_logprobs).max() <= 1e-4 * max(1.0, np.abs(ref_logprobs).max())
