"""Loading Hugging Face DeepSeek checkpoints: FP8 block-scaled weights, naming variants, MTP layers, bad files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import VOCAB, write_checkpoint, write_tokenizer
from deepinfer import DeepInferenceEngine, EngineConfig, _deepinfer

BLOCK = 128
TOKENS = [5, 77, 300, 12, 9, 401, 250, 3, 64, 128, 17]


def last_logits(path: Path, tokens=TOKENS, fp8_weights: bool = False) -> np.ndarray:
    options = _deepinfer.EngineOptions()
    options.model_path = str(path)
    options.page_size = 4
    options.fp8_weights = fp8_weights
    return _deepinfer.SequenceScorer(options).last_logits(tokens, 0, 2)


def is_quantized_linear(name: str, t: torch.Tensor) -> bool:
    """DeepSeek's FP8 checkpoints quantize the linear layers; embeddings, lm_head, norms and the router stay wide."""
    return (t.dim() == 2 and name.endswith(".weight") and "norm" not in name and "embed_tokens" not in name
            and not name.startswith("lm_head") and not name.endswith("mlp.gate.weight"))


def quantize_fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's format: e4m3 values and a float32 scale_inv per 128x128 block, w ~= q * scale_inv."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale_inv = torch.zeros(br, bc, dtype=torch.float32)
    q = torch.zeros(rows, cols, dtype=torch.float8_e4m3fn)
    w = w.float()
    for i in range(br):
        for j in range(bc):
            block = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = block.abs().max().clamp(min=1e-12) / 448.0
            scale_inv[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (block / s).to(torch.float8_e4m3fn)
    return q, scale_inv


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    expanded = scale_inv.repeat_interleave(BLOCK, 0)[: q.shape[0]].repeat_interleave(BLOCK, 1)[:, : q.shape[1]]
    return q.float() * expanded


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    # hidden 160 and intermediate 288: weights of several blocks, most of them partial.
    return write_checkpoint(tmp_path_factory.mktemp("bf16") / "m", "v3", seed=5, dtype=torch.bfloat16,
                            hidden_size=160, intermediate_size=288, q_lora_rank=136)


def test_fp8_checkpoint_loads_to_exactly_the_dequantized_weights(bf16_checkpoint, tmp_path):
    tensors = load_file(bf16_checkpoint / "model.safetensors")
    fp8, dequantized = {}, {}
    for name, t in tensors.items():
        if is_quantized_linear(name, t):
            q, s = quantize_fp8_blocks(t)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            dequantized[name] = dequantize(q, s)
        else:
            fp8[name] = dequantized[name] = t.float()
    assert sum(n.endswith("_scale_inv") for n in fp8) >= 10
    fp8_dir, ref_dir = tmp_path / "fp8", tmp_path / "dequantized"
    for d, ts in ((fp8_dir, fp8), (ref_dir, dequantized)):
        d.mkdir()
        save_file(ts, d / "model.safetensors")
        config = json.loads((bf16_checkpoint / "config.json").read_text())
        if d == fp8_dir:
            config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": [BLOCK, BLOCK]}
        (d / "config.json").write_text(json.dumps(config))
        write_tokenizer(d)
    got, ref = last_logits(fp8_dir), last_logits(ref_dir)
    assert np.array_equal(got, ref), f"max diff {np.abs(got - ref).max()}"
    # The quantization was real: the dequantized weights differ from the bf16 originals.
    assert not np.array_equal(ref, last_logits(bf16_checkpoint))
    assert _deepinfer.load_model_config(str(fp8_dir)).fp8

    # quantization="fp8" is accepted for the FP8 checkpoint, which also stays FP8 without it.
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(fp8_dir), quantization="fp8", num_cache_pages=16,
                                              max_model_len=64))
    assert engine.weight_bytes["float32"] > 0
    engine.shutdown()


def deepseek_fp8(tensors: dict, keep: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
    """DeepSeek's FP8 checkpoint of `tensors` with the linear modules `keep` left in their dtype without a scale, as
    DeepSeek-V3 leaves its MTP eh_proj (and listed in modules_to_not_convert, transformers' FineGrainedFP8Config
    field): (the tensors, config.json's quantization_config, the weights it holds dequantized, in float32)."""
    out, dequantized = {}, {}
    for name, t in tensors.items():
        if is_quantized_linear(name, t) and name.removesuffix(".weight") not in keep:
            q, s = quantize_fp8_blocks(t)
            out[name], out[name + "_scale_inv"] = q, s
            dequantized[name] = dequantize(q, s)
        else:
            out[name], dequantized[name] = t, t.float()
    quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": list(keep) or None}
    return out, quantization, dequantized


def test_linear_layers_an_fp8_checkpoint_stores_in_bf16_load_as_stored(bf16_checkpoint, tmp_path):
    """An FP8 checkpoint's linear layers stored in bf16 without a scale are computed with as stored, beside its FP8
    ones: the logits are the engine's on the dequantized weights with those layers in bf16, and transformers' on them.
    (The CPU holds every weight in float32, so this passes whatever an FP8 sink would do with them; that a GPU keeps
    them in bf16, not rounded to FP8, is tests/cpp/fp8_weights_test.cpp's and test_fp8_cuda.py's.) The plan's bytes
    are the engine's."""
    from deepinfer.model_dims import load_model_dims
    from deepinfer.plan import plan_memory
    from test_int4 import reference_logits, relative_error, write_like

    keep = ("model.layers.1.self_attn.o_proj", "model.layers.0.mlp.down_proj")
    fp8, quantization, dequantized = deepseek_fp8(load_file(bf16_checkpoint / "model.safetensors"), keep)
    for module in keep:
        assert fp8[module + ".weight"].dtype == torch.bfloat16 and module + ".weight_scale_inv" not in fp8
    assert fp8["model.layers.1.self_attn.q_b_proj.weight"].dtype == torch.float8_e4m3fn
    checkpoint = write_like(bf16_checkpoint, tmp_path / "fp8", fp8, quantization)
    reference = write_like(bf16_checkpoint, tmp_path / "dequantized", dequantized)
    got = last_logits(checkpoint)
    assert np.array_equal(got, last_logits(reference)), f"max diff {np.abs(got - last_logits(reference)).max()}"
    assert relative_error(got, reference_logits(reference)) <= 1e-4
    assert not np.array_equal(got, last_logits(bf16_checkpoint))  # the other layers' FP8 rounding is real

    config = EngineConfig(model_name_or_path=str(checkpoint), device="cpu", num_cache_pages=16, max_model_len=64)
    with DeepInferenceEngine(config) as e:
        assert plan_memory(load_model_dims(checkpoint), config).weight_bytes == e.weight_bytes


def compress_fp8_block(tensors: dict, weight_only: bool = False,
                       ignore: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
    """llm-compressor's FP8_BLOCK checkpoint of `tensors`, written by compressed-tensors itself: e4m3 `weight` and a
    float32 `weight_scale` per 128 x 128 block from the library's own qparams and compressor, but for the linear
    modules `ignore` matches (compressed-tensors' "re:" patterns, as re.match reads them: left in their dtype and
    listed in `ignore`); (the tensors, config.json's quantization_config, the weights as the library decompresses
    them)."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    if weight_only:
        scheme.input_activations = None
    out, dequantized = {}, {}
    for name, t in tensors.items():
        if not is_quantized_linear(name, t) or any(re.match(p, name.removesuffix(".weight")) for p in ignore):
            out[name] = dequantized[name] = t
            continue
        w = t.float()
        rows, cols = w.shape
        br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
        padded = torch.zeros(br * BLOCK, bc * BLOCK)
        padded[:rows, :cols] = w
        blocks = padded.reshape(br, BLOCK, bc, BLOCK).transpose(1, 2)
        scale, _ = calculate_qparams(blocks.amin(dim=(-1, -2)), blocks.amax(dim=(-1, -2)), scheme.weights)
        packed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
        module = name.removesuffix(".weight")
        out[name], out[f"{module}.weight_scale"] = packed["weight"], packed["weight_scale"]
        dequantized[name] = FloatQuantizationCompressor.decompress(dict(packed), scheme)["weight"].float()
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                                ignore=["lm_head", "re:.*mlp\\.gate$", *(f"re:{p}" for p in ignore)],
                                quantization_status="compressed")
    return out, config.model_dump(mode="json"), dequantized


@pytest.mark.parametrize("weight_only", [False, True], ids=["w8a8", "w8a16"])
def test_compressed_tensors_fp8_block_checkpoints_load_as_deepseeks(bf16_checkpoint, tmp_path, weight_only):
    """compressed-tensors' block FP8 (float-quantized, FP8_BLOCK: DeepSeek's layout under other names) loads as
    DeepSeek's FP8 checkpoints do: the engine computes with exactly the weights compressed-tensors decompresses, and
    matches transformers in fp32 on them. Without input_activations the checkpoint is weight-only: W8A16."""
    from test_int4 import reference_logits, relative_error, write_like

    packed, quantization, dequantized = compress_fp8_block(load_file(bf16_checkpoint / "model.safetensors"),
                                                           weight_only)
    assert sum(k.endswith(".weight_scale") for k in packed) >= 10
    assert packed["model.layers.0.self_attn.o_proj.weight"].dtype == torch.float8_e4m3fn
    checkpoint = write_like(bf16_checkpoint, tmp_path / "ct_fp8", packed, quantization)
    reference = write_like(bf16_checkpoint, tmp_path / "plain", dequantized)
    config = _deepinfer.load_model_config(str(checkpoint))
    assert config.fp8 and config.fp8_activations is not weight_only
    got = last_logits(checkpoint)
    assert np.array_equal(got, last_logits(reference)), f"max diff {np.abs(got - last_logits(reference)).max()}"
    assert relative_error(got, reference_logits(reference)) <= 1e-4
    assert not np.array_equal(got, last_logits(bf16_checkpoint))  # the FP8 rounding is real

    from deepinfer.model_dims import load_model_dims
    from deepinfer.plan import plan_memory

    plan = plan_memory(load_model_dims(checkpoint), EngineConfig(model_name_or_path=str(checkpoint)),
                       gpu_memory_bytes=80 << 30)
    assert plan.weight_format == ("fp8 (W8A16)" if weight_only else "fp8 (W8A8)")


@pytest.mark.parametrize("change, message", [
    (lambda g: g["weights"].update(strategy="channel", block_structure=None), "128 x 128 block"),
    (lambda g: g["weights"].update(block_structure=[64, 64]), "128 x 128 block"),
    (lambda g: g["weights"].update(num_bits=4), "8-bit 'float'"),
    (lambda g: g["input_activations"].update(dynamic=False), "quantized dynamically"),
], ids=["channel", "block-64", "4-bit", "static-activations"])
def test_compressed_tensors_fp8_schemes_the_kernels_lack_are_refused(tmp_path, change, message):
    config = json.loads((write_checkpoint(tmp_path / "m", "v3", seed=2) / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [128, 128],
               "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128, "dynamic": True}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    change(group)
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                     "config_groups": {"group_0": group}, "ignore": ["lm_head"]}
    with pytest.raises(ValueError, match=message):
        _deepinfer.parse_model_config(json.dumps(config))


def torch_fp8_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's linear layers quantized by torch's float8_e4m3fn per 128 x 128 block, dequantized to fp32."""
    out = {}
    for name, t in load_file(checkpoint / "model.safetensors").items():
        out[name] = dequantize(*quantize_fp8_blocks(t)) if is_quantized_linear(name, t) else t.float()
    return out


def test_bf16_checkpoint_is_quantized_to_fp8_at_load(tmp_path):
    """quantization='fp8' on a bf16 checkpoint: the weights the engine computes with are torch's FP8 quantization of
    the same linear layers (gate and up, and the experts, end on block boundaries here, so the fused weights' blocks
    are those of the stored tensors)."""
    src = write_checkpoint(tmp_path / "bf16", "v3", seed=9, dtype=torch.bfloat16, hidden_size=160,
                           intermediate_size=256, moe_intermediate_size=128, q_lora_rank=136)
    ref_dir = tmp_path / "torch_fp8"
    ref_dir.mkdir()
    save_file(torch_fp8_weights(src), ref_dir / "model.safetensors")
    shutil.copy(src / "config.json", ref_dir / "config.json")
    write_tokenizer(ref_dir)
    got, ref = last_logits(src, fp8_weights=True), last_logits(ref_dir)
    assert np.array_equal(got, ref), f"max diff {np.abs(got - ref).max()}"
    assert not np.array_equal(got, last_logits(src))

    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(src), quantization="fp8", num_cache_pages=16,
                                              max_model_len=64))
    # The CPU computes in float32 with the FP8 values; an FP8 device keeps a byte a weight (tests/cpp).
    assert set(engine.weight_bytes) == {"float32"}
    engine.shutdown()


@pytest.mark.parametrize("quantization, field", [
    ({"method": "fp8", "group_size": 64}, "group_size"),
    ({"method": "fp8", "weight_bits": 4}, "weight_bits"),
    ({"method": "fp8", "activation_bits": 4}, "activation_bits"),
    ({"method": "nf4"}, "method"),
])
def test_bad_quantization_fails_before_loading(quantization, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(quantization=quantization)


def test_checkpoint_of_another_quantization_method_is_refused(bf16_checkpoint, tmp_path):
    other = tmp_path / "gptq"
    shutil.copytree(bf16_checkpoint, other)
    config = json.loads((other / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(other), quantization="fp8"))


def test_sharded_checkpoint_with_index(tmp_path):
    from transformers import AutoModelForCausalLM

    src = write_checkpoint(tmp_path / "one", "v2", seed=3)
    model = AutoModelForCausalLM.from_pretrained(src)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert np.array_equal(last_logits(src), last_logits(tmp_path / "sharded"))


def test_deepseek_naming_variants_and_mtp_layers(checkpoints, tmp_path):
    """DeepSeek's own config writes `rope_scaling`; transformers 5 may fuse experts; MTP layers are skipped."""
    src = checkpoints["v3_yarn"]
    ref = last_logits(src)
    variant = tmp_path / "variant"
    shutil.copytree(src, variant)
    config = json.loads((variant / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    config["rope_scaling"] = rope
    config["num_nextn_predict_layers"] = 1
    (variant / "config.json").write_text(json.dumps(config))

    tensors = load_file(variant / "model.safetensors")
    layers, experts = config["num_hidden_layers"], config["n_routed_experts"]
    for layer in range(config["first_k_dense_replace"], layers):
        p = f"model.layers.{layer}.mlp.experts."
        gate_up = [torch.cat([tensors.pop(f"{p}{e}.gate_proj.weight"), tensors.pop(f"{p}{e}.up_proj.weight")])
                   for e in range(experts)]
        down = [tensors.pop(f"{p}{e}.down_proj.weight") for e in range(experts)]
        tensors[p + "gate_up_proj"] = torch.stack(gate_up)
        tensors[p + "down_proj"] = torch.stack(down)
    # An MTP layer as DeepSeek stores it: model.layers.{num_hidden_layers}.*
    mtp = f"model.layers.{layers}."
    tensors[mtp + "enorm.weight"] = torch.ones(config["hidden_size"])
    tensors[mtp + "hnorm.weight"] = torch.ones(config["hidden_size"])
    tensors[mtp + "eh_proj.weight"] = torch.zeros(config["hidden_size"], 2 * config["hidden_size"])
    tensors[mtp + "shared_head.head.weight"] = torch.zeros(VOCAB, config["hidden_size"])
    save_file(tensors, variant / "model.safetensors")
    assert np.array_equal(ref, last_logits(variant))


def test_dummy_weights_are_deterministic(checkpoints):
    def dummy(seed):
        o = _deepinfer.EngineOptions()
        o.model_path = str(checkpoints["v3"])
        o.load_format = _deepinfer.LoadFormat.dummy
        o.seed = seed
        return _deepinfer.SequenceScorer(o).last_logits(TOKENS, 0, 0)

    a, b, c = dummy(1), dummy(1), dummy(2)
    assert np.array_equal(a, b) and not np.array_equal(a, c) and np.isfinite(a).all()


# ---------------------------------------------------------------------------------------------- bad checkpoints

def engine_for(path, **kw):
    return DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), num_cache_pages=16, max_model_len=64, **kw))


def test_nonexistent_path():
    with pytest.raises(ValueError, match="does not exist"):
        engine_for("/nonexistent/deepseek-model")


def test_other_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "vocab_size": 100, "hidden_size": 8}))
    with pytest.raises(ValueError, match="unsupported architecture 'LlamaForCausalLM'"):
        engine_for(tmp_path)


def test_truncated_safetensors(checkpoints, tmp_path):
    bad = tmp_path / "truncated"
    shutil.copytree(checkpoints["v2"], bad)
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(RuntimeError, match="truncated"):
        engine_for(bad)


def test_missing_tensor_and_wrong_shape(checkpoints, tmp_path):
    tensors = load_file(checkpoints["v2"] / "model.safetensors")
    for case in ("missing", "shape"):
        d = tmp_path / case
        shutil.copytree(checkpoints["v2"], d)
        ts = dict(tensors)
        if case == "missing":
            del ts["model.layers.1.self_attn.kv_b_proj.weight"]
            match = "model.layers.1.self_attn.kv_b_proj.weight"
        else:
            ts["model.norm.weight"] = torch.ones(7)
            match = r"model.norm.weight.*shape \[7\]"
        save_file(ts, d / "model.safetensors")
        with pytest.raises(RuntimeError, match=match):
            engine_for(d)


def test_unsupported_dtype(checkpoints, tmp_path):
    d = tmp_path / "e5m2"
    shutil.copytree(checkpoints["v2"], d)
    ts = load_file(d / "model.safetensors")
    ts["model.norm.weight"] = ts["model.norm.weight"].to(torch.float8_e5m2)
    save_file(ts, d / "model.safetensors")
    with pytest.raises(RuntimeError, match="model.norm.weight.*unsupported dtype"):
        engine_for(d)


