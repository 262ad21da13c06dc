"""Which linear modules a quantized checkpoint's config lists as quantized (ModelConfig.quantizes), against each
format's own matching: compressed-tensors' `is_match` for its targets and `ignore`, Python's fnmatch for ModelOpt's
`exclude_modules` globs, vLLM's substring rule for AutoAWQ's `modules_to_not_convert`. The memory plan and the FP4
random weights read these answers; the loader itself reads each tensor's stored format."""

from __future__ import annotations

import fnmatch
import json

import pytest
import torch
from compressed_tensors.utils.match import is_match

from deepinfer import _deepinfer
from deepinfer.model_dims import LAYER_LINEARS, linear_module

V3_TINY = {"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,
           "moe_intermediate_size": 32, "num_hidden_layers": 12, "first_k_dense_replace": 1, "n_routed_experts": 4,
           "n_shared_experts": 1, "num_experts_per_tok": 2, "num_attention_heads": 2, "q_lora_rank": 32,
           "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
           "num_nextn_predict_layers": 1}
NAMES = [linear_module(layer, suffix) for layer in range(13) for suffix in LAYER_LINEARS] + [
    "model.layers.2.mlp.experts.3.up_proj", "model.layers.11.mlp.experts.gate_up_proj",
    "model.layers.11.mlp.experts.down_proj", "lm_head"]


def config(quantization: dict):
    return _deepinfer.parse_model_config(json.dumps({**V3_TINY, "quantization_config": quantization}))


def compressed_tensors(targets: list[str], ignore: list[str]) -> dict:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": targets, "weights": weights}}, "ignore": ignore}


# transformers 5's fused expert tensors are matched as their first expert's modules (vLLM's `fused` mapping).
FUSED = {"experts.gate_up_proj": ["experts.0.gate_proj"], "experts.down_proj": ["experts.0.down_proj"]}


@pytest.mark.parametrize("targets, ignore", [
    (["Linear"], ["lm_head"]),
    (["Linear"], ["lm_head", "re:.*self_attn.*", "model.layers.0.mlp.down_proj"]),
    (["Linear"], ["re:.*layers\\.1[01]\\..*", "re:.*shared_experts.*", "re:.*eh_proj$"]),
    (["re:.*mlp\\.experts.*"], ["re:.*experts\\.0\\.down_proj$"]),
    (["re:model\\.layers\\.[0-9]\\.self_attn\\.(q_a|q_b|o)_proj$", "re:.*mlp\\..*"], ["re:layers"]),
], ids=["lm-head", "attention", "layers-10-11", "experts-only", "two-targets"])
def test_compressed_tensors_lists_match_as_compressed_tensors_matches_them(targets, ignore):
    c = config(compressed_tensors(targets, ignore))
    linear = torch.nn.Linear(1, 1)
    for name in NAMES:
        want = is_match(name, linear, targets, ignore, fused=FUSED)
        assert c.quantizes(name) == want, (name, targets, ignore)


def glob_reference(name: str, pattern: str) -> bool:
    """ModelOpt's exclusion: fnmatch over the module's name, or over a parent's (excluding a block excludes its
    projections, as vLLM's ModelOpt loader reads it)."""
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:n]), pattern) for n in range(1, len(parts) + 1))


@pytest.mark.parametrize("exclude", [
    ["lm_head"], ["lm_head", "model.layers.1*"], ["*self_attn*", "model.layers.?.mlp"], ["*.shared_experts", "*eh_proj"],
], ids=["lm-head", "layer-1-prefix", "attention-and-short-layers", "shared-and-mtp"])
def test_modelopt_exclusions_match_as_fnmatch_does(exclude):
    c = config({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": exclude})
    for name in NAMES:
        assert c.quantizes(name) == (not any(glob_reference(name, p) for p in exclude)), (name, exclude)


@pytest.mark.parametrize("keep", [["kv_a_proj_with_mqa"], ["self_attn", "layers.11."], ["shared_experts", "mlp.gate_"]])
def test_awq_modules_to_not_convert_are_keys_anywhere_in_the_name(keep):
    # vLLM's is_layer_skipped_awq: a module is skipped when any key is a substring of its name.
    c = config({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True,
                "modules_to_not_convert": keep})
    for name in NAMES:
        assert c.quantizes(name) == (not any(k in name for k in keep)), (name, keep)


def test_an_unquantized_config_quantizes_every_module_and_a_bad_list_is_refused():
    c = _deepinfer.parse_model_config(json.dumps(V3_TINY))
    assert all(c.quantizes(name) for name in NAMES)
    with pytest.raises(ValueError, match=r"quantization_config.*is not a regular expression"):
        config(compressed_tensors(["Linear"], ["re:(lm_head"]))
    with pytest.raises(ValueError, match=r"modules_to_not_convert is not a list"):
        config({"quant_method": "awq", "bits": 4, "group_size": 32, "modules_to_not_convert": "lm_head"})
