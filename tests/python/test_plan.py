"""`deepinfer plan`: its figures against what the engine allocates (the CPU backend), DeepSeek-V3 on 8 x H200, the
command as a user runs it, and the engine's refusal before loading."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys

import pytest

from deepinfer import EngineConfig
from deepinfer.model_dims import linear_module, load_model_dims
from deepinfer.plan import GIB, check_fits_before_load, plan_memory, plan_options

ENV = {**os.environ, "DEEPINFER_NO_PROGRESS": "1"}

# DeepSeek-V3's published config.json, less what does not size memory (rope scaling, routing details); bf16 (the
# FP8 release adds quantization_config, which the tests add where they want FP8 weights by default).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
}
FP8_RELEASE = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
H200_GIB = 141


@pytest.fixture(scope="module")
def v3_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("v3") / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3))
    return path


def deepinfer(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The command's result and the CPU seconds it took (user + system: unlike wall time, not the machine's load)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "deepinfer.cli", *args], capture_output=True, text=True, env=ENV,
                       timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_plan(path, **engine):
    config = EngineConfig(model_name_or_path=str(path), device="cpu", **engine)
    return plan_memory(load_model_dims(path), config)


def within_2_percent(planned: int, actual: int) -> bool:
    return abs(planned - actual) <= 0.02 * actual


# ---------------------------------------------------------------------------------------------- against the engine

LAYOUTS = [dict(), dict(tensor_parallel_size=2), dict(tensor_parallel_size=2, enable_expert_parallel=True),
           dict(tensor_parallel_size=2, enable_expert_parallel=True, enable_dp_attention=True)]


@pytest.mark.parametrize("arch", ["v3", "v2_two_shared"])
@pytest.mark.parametrize("quantization", [None, "fp8"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["whole", "tp2", "ep2", "dp2"])
def test_weight_bytes_are_the_engines(checkpoints, arch, quantization, layout):
    from deepinfer import DeepInferenceEngine

    engine = dict(quantization=quantization, num_cache_pages=16, max_model_len=64, **layout)
    planned = cpu_plan(checkpoints[arch], **engine)
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints[arch]), **engine)) as e:
        actual = e.weight_bytes  # rank 0's under TP / EP: a rank's bytes, what a plan gives a GPU
    assert set(planned.weight_bytes) == set(actual)
    for dtype, n in actual.items():
        assert within_2_percent(planned.weight_bytes[dtype], n), (dtype, planned.weight_bytes, actual)
    assert planned.weight_bytes == actual  # on the CPU every term is exact


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_a_bf16_file_is_float32_on_the_cpu(tmp_path, quantization):
    import torch

    from conftest import write_checkpoint
    from deepinfer import DeepInferenceEngine

    path = write_checkpoint(tmp_path / "bf16", "v3", seed=7, dtype=torch.bfloat16)
    engine = dict(quantization=quantization, num_cache_pages=16, max_model_len=64)
    planned = cpu_plan(path, **engine)
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), **engine)) as e:
        assert planned.weight_bytes == e.weight_bytes == {"float32": planned.weights_per_gpu}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("layout", [dict(), LAYOUTS[3]], ids=["whole", "dp2"])
def test_cache_pages_are_the_engines(checkpoints, kv_cache_dtype, layout):
    from deepinfer import DeepInferenceEngine

    engine = dict(kv_cache_dtype=kv_cache_dtype, cache_memory_gb=0.01, page_size=8, **layout)
    planned = cpu_plan(checkpoints["v3"], **engine)
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), **engine)) as e:
        assert planned.cache_bytes_per_token == e.cache_info["bytes_per_token"]
        assert planned.cache_dtype == e.cache_info["dtype"]
        pages = e.stats().num_cache_pages  # every data-parallel rank's pages together
        assert within_2_percent(planned.cache_pages * planned.lanes, pages)
        assert planned.cache_tokens_total == pages * 8
        assert e.max_model_len == min(512, planned.cache_tokens_per_gpu)  # what the plan says an unset one becomes


# ------------------------------------------------------------------------------------------ DeepSeek-V3, 8 x H200

def test_v3_in_fp8_fits_eight_h200s(v3_config):
    config = EngineConfig(model_name_or_path=str(v3_config), tensor_parallel_size=8, quantization="fp8",
                          max_model_len=32768)
    plan = plan_memory(load_model_dims(v3_config), config, gpu_memory_bytes=H200_GIB * GIB)
    assert 670e9 < plan.parameters < 672e9  # the main model's 671 B (the MTP layer is not loaded)
    # 671 B / 8 in FP8, plus what every rank holds whole (q_a, kv_a) and what stays bf16 (kv_b and its halves, the
    # vocabulary's eighth of the embedding and lm_head), plus the scales.
    assert 84e9 < plan.weights_per_gpu < 87e9
    assert plan.weight_bytes["float8_e4m3fn"] > 0.97 * plan.weights_per_gpu
    assert plan.cache_bytes_per_token == 61 * 576 * 2
    assert plan.fits and plan.sequences >= 10 and plan.cache_tokens_total == plan.cache_tokens_per_gpu
    fp8_cache = plan_memory(load_model_dims(v3_config), dataclasses.replace(config, kv_cache_dtype="fp8"),
                            gpu_memory_bytes=H200_GIB * GIB)
    assert fp8_cache.cache_bytes_per_token == 61 * 656
    assert fp8_cache.cache_pages > 1.7 * plan.cache_pages  # 1,152 / 656 bytes a token a layer, the same memory


def test_v3_in_bf16_does_not_fit_and_fp8_would(v3_config):
    config = EngineConfig(model_name_or_path=str(v3_config), tensor_parallel_size=8)
    dims = load_model_dims(v3_config)
    plan = plan_memory(dims, config, gpu_memory_bytes=H200_GIB * GIB)
    assert plan.weight_format == "bfloat16" and plan.weights_per_gpu > 160e9 and not plan.fits
    assert plan.verdict().startswith("does not fit: the weights take")
    options = {o.change: o for o in plan_options(dims, config, plan)}
    assert options["--quantization fp8"].plan.fits
    assert options["--tensor-parallel-size 16"].plan.fits  # the smallest split that fits: more GPUs than 8
    assert not options["--kv-cache-dtype fp8"].plan.fits   # the cache is not what is too big
    assert options["--quantization int4"].plan.fits and options["--quantization int4"].plan.weight_format == "int4 (W4A16)"


def test_v3_in_int4_fits_eight_h100s_where_fp8_does_not(v3_config):
    # The INT4 row: 4-bit codes, a float32 scale and a 4-bit zero point per 128 inputs of every projection; the
    # embedding, lm_head, the router, kv_b_proj's absorbed halves and the norms as in bf16.
    dims = load_model_dims(v3_config)
    for quantization, fits in (("fp8", False), ("int4", True)):
        config = EngineConfig(model_name_or_path=str(v3_config), tensor_parallel_size=8, quantization=quantization)
        plan = plan_memory(dims, config, gpu_memory_bytes=80 * GIB)
        assert plan.fits is fits, (quantization, plan.verdict())
    assert plan.weight_format == "int4 (W4A16)" and 40 * GIB < plan.weights_per_gpu < 44 * GIB
    assert plan.weight_bytes["int4"] > 10 * plan.weight_bytes["float32"]


def test_an_nvfp4_checkpoint_plans_packed_e2m1_words_on_gpus(tmp_path):
    # ModelOpt's NVFP4 export of DeepSeek-V3's shape: on GPUs half a byte a weight and a float32 scale per 16 inputs
    # (a third of the codes' bytes again), the router, embeddings, kv_b_proj's halves and norms as in bf16.
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
             "exclude_modules": ["lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "quantization_config": nvfp4}))
    dims = load_model_dims(tmp_path)
    assert dims.fp4_checkpoint == "modelopt-nvfp4"
    plan = plan_memory(dims, EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=8),
                       gpu_memory_bytes=H200_GIB * GIB)
    assert plan.weight_format == "fp4 (W4A16, e2m1)" and plan.fits
    codes, f32 = plan.weight_bytes["fp4_e2m1"], plan.weight_bytes["float32"]
    assert 37 * GIB < codes < 40 * GIB and 0.5 <= f32 / codes < 0.51
    cpu = plan_memory(dims, EngineConfig(model_name_or_path=str(tmp_path), device="cpu"), gpu_memory_bytes=1 << 50)
    assert cpu.weight_format == "fp4 (float32 on the CPU)" and "fp4_e2m1" not in cpu.weight_bytes


@pytest.mark.parametrize("quantization, stored", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "int4 (W4A16)"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
     "fp4 (W4A16, e2m1)"),
], ids=["awq", "nvfp4"])
def test_a_4_bit_checkpoints_options_are_other_checkpoints_not_quantizing_it_again(tmp_path, quantization, stored):
    # quantization="fp8" on a 4-bit checkpoint is refused (it is quantized already), so the plan's FP8 row is an FP8
    # checkpoint of the model, as its INT4 row for an FP4 checkpoint is a 4-bit one.
    (tmp_path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "quantization_config": quantization}))
    dims = load_model_dims(tmp_path)
    config = EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=8)
    plan = plan_memory(dims, config, gpu_memory_bytes=80 * GIB)
    assert plan.weight_format == stored
    options = {o.change: o for o in plan_options(dims, config, plan)}
    assert options["FP8 weights"].plan.weight_format == "fp8 (W8A8)" and options["FP8 weights"].note
    assert "--quantization fp8" not in options and "--kv-cache-dtype fp8" in options
    assert ("INT4 weights" in options) == (stored != "int4 (W4A16)")
    run, _ = deepinfer("plan", "--model", str(tmp_path), "--tensor-parallel-size", "8", "--gpu-memory-gb", "80")
    assert run.returncode == 0 and "FP8 weights" in run.stdout, run.stderr


def w4a16(group_size: int, symmetric: bool, ignore: list[str]) -> dict:
    """compressed-tensors' pack-quantized W4A16 quantization_config, as llm-compressor writes it."""
    weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ignore}


def v3_plan(tmp_path, quantization_config: dict | None, **engine):
    path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, **({"quantization_config": quantization_config}
                                                  if quantization_config else {})}))
    config = EngineConfig(model_name_or_path=str(path), tensor_parallel_size=8, **engine)
    return plan_memory(load_model_dims(path), config, gpu_memory_bytes=H200_GIB * GIB)


def test_layers_a_4_bit_checkpoint_leaves_unquantized_are_planned_in_bf16(tmp_path):
    # A common llm-compressor recipe keeps attention in bf16: per layer and GPU (8-way tensor parallel) q_a_proj and
    # kv_a_proj_with_mqa whole, a GPU's 16 heads of q_b_proj and o_proj. The MoE layers stay 4-bit.
    everything = v3_plan(tmp_path, w4a16(128, True, ["lm_head"]))
    no_attention = v3_plan(tmp_path, w4a16(128, True, ["lm_head", "re:.*self_attn.*"]))
    attention = 1536 * 7168 + 16 * 192 * 1536 + 576 * 7168 + 7168 * 16 * 128  # weights a layer and GPU
    layers = DEEPSEEK_V3["num_hidden_layers"]
    assert no_attention.weight_bytes["bfloat16"] - everything.weight_bytes["bfloat16"] == 2 * layers * attention
    assert everything.weight_bytes["int4"] - no_attention.weight_bytes["int4"] == layers * attention // 2
    assert everything.weight_bytes["float32"] - no_attention.weight_bytes["float32"] == 4 * layers * attention // 128
    run, _ = deepinfer("plan", str(tmp_path / "c1.json"), "--tensor-parallel-size", "8", "--gpu-memory-gb", "141")
    assert run.returncode == 0, run.stderr
    # ModelOpt's and AWQ's lists are read too (their own matching rules: tests/python/test_quantized_modules.py).
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    assert (v3_plan(tmp_path, {**nvfp4, "exclude_modules": ["lm_head", "*self_attn*"]}).weight_bytes["bfloat16"]
            - v3_plan(tmp_path, {**nvfp4, "exclude_modules": ["lm_head"]}).weight_bytes["bfloat16"]
            == 2 * layers * attention)


def test_a_modelopt_checkpoint_described_beside_config_json_plans_its_fp4_weights(tmp_path):
    # ModelOpt's older exports (the NVIDIA DeepSeek-R1 FP4 release among them) describe their quantization in
    # hf_quant_config.json, not in config.json: a plan of the directory reads it, as the engine's loader does.
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                            "exclude_modules": ["lm_head", "*self_attn*"]}}))
    dims = load_model_dims(tmp_path)
    assert dims.fp4_checkpoint == "modelopt-nvfp4"
    assert linear_module(5, "self_attn.o_proj") in dims.unquantized_linears
    assert linear_module(5, "mlp.experts.0.gate_proj") not in dims.unquantized_linears
    assert load_model_dims(tmp_path / "config.json").fp4_checkpoint == ""  # the bare file says nothing of it
    run, _ = deepinfer("plan", str(tmp_path), "--tensor-parallel-size", "8", "--gpu-memory-gb", "80")
    assert run.returncode == 0 and "fp4 (W4A16, e2m1)" in run.stdout, (run.stdout, run.stderr)


@pytest.mark.parametrize("group_size, stored", [(32, True), (64, False)], ids=["stored-g32", "rtn-g64"])
def test_int4_weights_are_planned_with_their_own_groups(tmp_path, group_size, stored):
    # Half a byte a weight and, symmetric, a float32 scale a group and no zero points.
    plain = v3_plan(tmp_path, None)
    plan = (v3_plan(tmp_path, w4a16(group_size, True, ["lm_head"])) if stored else
            v3_plan(tmp_path, None, quantization={"method": "int4", "group_size": group_size, "symmetric": True}))
    assert plan.weight_format == "int4 (W4A16)"
    scales = plan.weight_bytes["float32"] - plain.weight_bytes["float32"]  # the norms are float32 in both
    assert scales == 4 * (2 * plan.weight_bytes["int4"]) // group_size


def test_asymmetric_int4_adds_a_zero_point_a_group_and_a_row_takes_one_group(tmp_path):
    plain = v3_plan(tmp_path, None)
    symmetric, asymmetric = (v3_plan(tmp_path, w4a16(128, sym, ["lm_head"])) for sym in (True, False))
    groups = (symmetric.weight_bytes["float32"] - plain.weight_bytes["float32"]) // 4
    assert asymmetric.weight_bytes["float32"] == symmetric.weight_bytes["float32"]
    zero_bytes = asymmetric.weight_bytes["int4"] - symmetric.weight_bytes["int4"]
    # Half a byte a group, in int32 words a row: at most one word a group (a row of one group).
    assert groups // 2 <= zero_bytes <= 4 * groups
    rows = v3_plan(tmp_path, None, quantization={"method": "int4", "group_size": -1, "symmetric": True})
    assert 0 < rows.weight_bytes["float32"] - plain.weight_bytes["float32"] < 4 * groups // 2


def test_an_fp8_checkpoint_plans_fp8_by_default(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "quantization_config": FP8_RELEASE}))
    config = EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=8)
    plan = plan_memory(load_model_dims(tmp_path), config, gpu_memory_bytes=H200_GIB * GIB)
    assert plan.weight_format == "fp8 (W8A8)" and plan.fits


def fp8_block(ignore: list[str]) -> dict:
    """compressed-tensors' float-quantized FP8_BLOCK quantization_config (DeepSeek's layout), as llm-compressor writes
    it."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [128, 128],
               "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128, "dynamic": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ignore,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}


# A GPU's attention projections of a layer under 8-way tensor parallelism: q_a_proj and kv_a_proj_with_mqa whole, its
# 16 heads of q_b_proj and o_proj; their weights and their 128 x 128 FP8 scale blocks.
V3_ATTENTION_TP8 = 1536 * 7168 + 16 * 192 * 1536 + 576 * 7168 + 7168 * 16 * 128
V3_ATTENTION_TP8_BLOCKS = 12 * 56 + 24 * 12 + 5 * 56 + 56 * 16


def test_layers_an_fp8_checkpoint_leaves_unquantized_are_planned_in_bf16(tmp_path):
    # The loader keeps what an FP8 checkpoint stores in bf16 in bf16 (csrc/model/weights.cpp Loader::fp8_weight):
    # attention left out of the quantization costs 2 bytes a weight, and no FP8 byte or block scale.
    base = ["lm_head", "re:.*mlp\\.gate$"]
    everything = v3_plan(tmp_path, fp8_block(base))
    no_attention = v3_plan(tmp_path, fp8_block([*base, "re:.*self_attn.*"]))
    layers = DEEPSEEK_V3["num_hidden_layers"]
    assert everything.weight_format == no_attention.weight_format == "fp8 (W8A8)"
    assert no_attention.weight_bytes["bfloat16"] - everything.weight_bytes["bfloat16"] == 2 * layers * V3_ATTENTION_TP8
    assert everything.weight_bytes["float8_e4m3fn"] - no_attention.weight_bytes["float8_e4m3fn"] == (
        layers * V3_ATTENTION_TP8)
    assert everything.weight_bytes["float32"] - no_attention.weight_bytes["float32"] == (
        4 * layers * V3_ATTENTION_TP8_BLOCKS)


def test_the_modules_an_fp8_release_does_not_convert_are_planned_in_bf16(tmp_path):
    # transformers' FineGrainedFP8Config lists them in modules_to_not_convert (csrc/model/config.cpp parse_fp8).
    listed = v3_plan(tmp_path, {**FP8_RELEASE, "modules_to_not_convert": ["self_attn"]})
    none_listed = v3_plan(tmp_path, {**FP8_RELEASE, "modules_to_not_convert": None})
    layers = DEEPSEEK_V3["num_hidden_layers"]
    assert listed.weight_bytes["bfloat16"] - none_listed.weight_bytes["bfloat16"] == 2 * layers * V3_ATTENTION_TP8


@pytest.mark.parametrize("quantization_config, quantization", [(FP8_RELEASE, None), (None, "fp8")],
                         ids=["fp8-release", "fp8-at-load"])
def test_the_mtp_layers_eh_proj_stays_bf16_under_fp8(tmp_path, quantization_config, quantization):
    # DeepSeek's FP8 release stores eh_proj in bf16, and quantization at load follows that release: 61 layers and the
    # MTP layer hold what 62 layers do, and besides eh_proj [7168, 2 * 7168] in bf16 and three norms.
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    with_mtp = v3_plan(tmp_path, quantization_config, quantization=quantization, speculative_config=spec)
    path = tmp_path / "62_layers.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, "num_hidden_layers": 62,
                                **({"quantization_config": quantization_config} if quantization_config else {})}))
    config = EngineConfig(model_name_or_path=str(path), tensor_parallel_size=8, quantization=quantization)
    layers_62 = plan_memory(load_model_dims(path), config, gpu_memory_bytes=H200_GIB * GIB)
    dim = DEEPSEEK_V3["hidden_size"]
    assert with_mtp.weight_format == "fp8 (W8A8)"
    assert with_mtp.weight_bytes["bfloat16"] - layers_62.weight_bytes["bfloat16"] == 2 * dim * 2 * dim
    assert with_mtp.weight_bytes["float8_e4m3fn"] == layers_62.weight_bytes["float8_e4m3fn"]
    assert with_mtp.weight_bytes["float32"] - layers_62.weight_bytes["float32"] == 3 * 4 * dim


# ---------------------------------------------------------------------------------------------------- the command

def test_the_command_prints_the_plan_in_under_a_second(v3_config):
    r, cpu_seconds = deepinfer("plan", str(v3_config), "--gpus", "8", "--gpu-memory-gb", str(H200_GIB),
                               "--quantization", "fp8", "--max-model-len", "32768")
    assert r.returncode == 0, r.stderr
    assert cpu_seconds < 1.0
    for words in ("weights", "latent cache", "verdict   fits", "--kv-cache-dtype fp8", "--quantization int4"):
        assert words in r.stdout
    r, _ = deepinfer("plan", str(v3_config), "--gpus", "8", "--gpu-memory-gb", str(H200_GIB), "--json")
    assert r.returncode == 1  # bf16 does not fit: scripts can gate `deepinfer serve` on the status
    out = json.loads(r.stdout)
    assert out["plan"]["fits"] is False and out["plan"]["tensor_parallel_size"] == 8
    assert any(o["change"] == "--quantization fp8" and o["fits"] for o in out["options"])


def test_the_command_plans_the_cpu_backend(checkpoints):
    r, _ = deepinfer("plan", "--model", str(checkpoints["v3"]), "--device", "cpu", "--cache-memory-gb", "0.01",
                     "--page-size", "8", "--json")
    assert r.returncode == 0, r.stderr
    expected = cpu_plan(checkpoints["v3"], cache_memory_gb=0.01, page_size=8)
    assert json.loads(r.stdout)["plan"]["cache_pages"] == expected.cache_pages


@pytest.mark.parametrize("args, code, message", [
    (("plan", "/nonexistent/model", "--gpu-memory-gb", "80"), 2, "no such checkpoint directory or config.json"),
    (("plan", "--kv-cache-dtype", "fp4", "--gpu-memory-gb", "80"), 2, "kv_cache_dtype must be"),
    (("plan", "--gpus", "2", "--tensor-parallel-size", "4", "--gpu-memory-gb", "80"), 2, "needs as many GPUs"),
    (("plan", "--gpu-memory-gb", "lots"), 2, "expected a number, got 'lots'"),
    (("plan", "--gpus", "3", "--gpu-memory-gb", "80"), 2, "tensor_parallel_size 3 does not divide"),
])
def test_bad_input_is_one_clear_line(args, code, message):
    r, _ = deepinfer(*args)
    assert r.returncode == code and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_gpu_plan_without_the_gpus_memory_says_what_to_give(tmp_path):
    from deepinfer import _deepinfer

    if _deepinfer.cuda_device_count() > 0:
        pytest.skip("a visible GPU answers for --gpu-memory-gb")
    r, _ = deepinfer("plan")
    assert r.returncode == 2 and "--gpu-memory-gb" in r.stderr


# ------------------------------------------------------------------------------------ the engine's check before load

def test_the_check_before_loading_refuses_in_the_plans_words(v3_config, monkeypatch):
    dims = load_model_dims(v3_config)
    h200 = [(H200_GIB * GIB - GIB // 2, H200_GIB * GIB)] * 8  # (free, total): half a GiB in use already
    with pytest.raises(ValueError, match=r"does not fit: the weights take 158\.\d GiB a GPU \(bfloat16, "
                                         r"tensor_parallel_size 8\).*would fit: --tensor-parallel-size 16, "
                                         r"--quantization fp8"):
        check_fits_before_load(dims, EngineConfig(model_name_or_path=str(v3_config), tensor_parallel_size=8), h200)
    plan = check_fits_before_load(dims, EngineConfig(model_name_or_path=str(v3_config), tensor_parallel_size=8,
                                                     quantization="fp8"), h200)
    assert plan.fits and plan.in_use_bytes == GIB // 2

    # The engine runs that check before it reads a weight: here with 8 GPUs made visible to it.
    from deepinfer import DeepInferenceEngine, _deepinfer

    monkeypatch.setattr(_deepinfer, "cuda_device_count", lambda: 8)
    monkeypatch.setattr(_deepinfer, "cuda_device_memory", lambda index: h200[index], raising=False)
    with pytest.raises(ValueError, match="does not fit: the weights take 158"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(v3_config.parent), tensor_parallel_size=8,
                                         device="cuda", load_format="dummy"))


def test_readme_sample_reproduces(tmp_path):
    """The README's `deepinfer plan` sample is what the command prints for DeepSeek-V3's config.json (FP8 release)."""
    readme = (os.path.dirname(__file__) + "/../../README.md")
    text = open(readme, encoding="utf-8").read()
    command = "$ deepinfer plan DeepSeek-V3 --gpus 8 --gpu-memory-gb 141 --max-model-len 32768"
    assert command in text
    sample = text.split(command + "\n", 1)[1].split("```", 1)[0].rstrip("\n").splitlines()
    model = tmp_path / "DeepSeek-V3"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "quantization_config": FP8_RELEASE}))
    r = subprocess.run([sys.executable, "-m", "deepinfer.cli", *command.split()[2:]], capture_output=True, text=True,
                       env=ENV, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n").splitlines() == sample


# DeepSeek-V2-Lite's dimensions (the CUDA kernels' shapes), four layers, with V3's vocabulary (the default tokenizer
# fits it): enough to size every term.
V2_LITE_4L = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 129280, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 4, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
    "topk_group": 1, "topk_method": "greedy", "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "max_position_embeddings": 16384, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_plan_matches_the_cuda_engine(tmp_path, kv_cache_dtype):
    """On a GPU: the plan's weights equal what the engine holds, and its cache pages (after an estimated working
    memory) are within 2% of the pages the engine measured room for."""
    from deepinfer import DeepInferenceEngine, _deepinfer

    if _deepinfer.cuda_device_count() == 0:
        pytest.skip("needs a CUDA GPU and a build with the CUDA backend")
    (tmp_path / "config.json").write_text(json.dumps(V2_LITE_4L))
    config = EngineConfig(model_name_or_path=str(tmp_path), load_format="dummy", device="cuda",
                          kv_cache_dtype=kv_cache_dtype, max_model_len=8192)
    free, total = _deepinfer.cuda_device_memory(0)
    plan = plan_memory(load_model_dims(tmp_path), config, gpu_memory_bytes=total, in_use_bytes=total - free)
    engine = DeepInferenceEngine(config)
    try:
        assert plan.weight_bytes == dict(engine.weight_bytes)
        assert plan.cache_bytes_per_token == engine.cache_info["bytes_per_token"]
        pages = engine.stats().num_cache_pages
        assert within_2_percent(plan.cache_pages, pages), (plan.cache_pages, pages)
    finally:
        engine.shutdown()


def test_the_mtp_layer_is_counted_when_speculative_decoding_loads_it():
    """With MTP speculative decoding the engine loads the MTP layer and gives it a cache layer: so does the plan."""
    from deepinfer import DeepInferenceEngine
    from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

    if not has_trained_model():
        pytest.skip("the embedded demo model is missing")
    engine = dict(speculative_config={"method": "mtp", "num_speculative_tokens": 2}, num_cache_pages=16)
    planned = cpu_plan(TRAINED_MODEL_DIR, **engine)
    without = cpu_plan(TRAINED_MODEL_DIR, num_cache_pages=16)
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(TRAINED_MODEL_DIR), **engine)) as e:
        assert planned.weight_bytes == e.weight_bytes
        assert planned.cache_bytes_per_token == e.cache_info["bytes_per_token"]
    assert planned.weights_per_gpu > without.weights_per_gpu
    layers = load_model_dims(TRAINED_MODEL_DIR).num_hidden_layers
    assert planned.cache_bytes_per_token * layers == without.cache_bytes_per_token * (layers + 1)
    assert any("MTP layer is loaded" in n for n in planned.notes)


def test_a_plan_with_mtp_for_a_model_without_it_says_so(v3_config, tmp_path):
    config = json.loads(v3_config.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    r, _ = deepinfer("plan", str(path), "--gpus", "1", "--gpu-memory-gb", "141", "--num-speculative-tokens", "1")
    assert r.returncode == 2 and "has no MTP layer" in r.stderr, (r.stdout, r.stderr)
