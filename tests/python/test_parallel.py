"""Tensor and expert parallelism on the CPU backend (ranks as threads): the same greedy tokens as one rank, and the
same logprobs to fp32 rounding, on both architectures with preemption; splits the model cannot take and a rank that
fails are errors naming the values or the rank, before or instead of a hang."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams

# Eight prompts of mixed lengths (1 to 37 tokens); a 24-page cache of 4-token pages cannot hold them all at once.
PROMPTS = [[5 + (7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate([1, 3, 9, 17, 37, 6, 24, 12])]


def run(path, **overrides):
    config = dict(model_name_or_path=str(path), page_size=4, num_cache_pages=24, max_model_len=64,
                  max_num_batched_tokens=16, seed=5)
    config.update(overrides)
    engine = DeepInferenceEngine(EngineConfig(**config))
    try:
        greedy = engine.generate([{"prompt_token_ids": p} for p in PROMPTS],
                                 SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=4))
        scored = engine.generate([{"prompt_token_ids": p} for p in PROMPTS if len(p) > 1],
                                 SamplingParams(max_tokens=0, prompt_logprobs=4))
        stats = engine.stats()
    finally:
        engine.shutdown()
    return greedy, scored, stats


def logprob_values(outputs, attribute):
    """Every logprob reported: each generated token's and its top alternatives ("logprobs"), or each scored prompt
    token's top alternatives ("prompt_logprobs"), in order."""
    values = []
    for o in outputs:
        if attribute == "logprobs":
            for t in o.outputs[0].logprobs:
                values.append(t.logprob)
                values.extend(x.logprob for x in t.top)
        else:
            for position in o.prompt_logprobs:
                if position is not None:
                    values.extend(position[k].logprob for k in sorted(position))
    return np.array(values, dtype=np.float64)


@pytest.fixture(scope="module")
def reference(checkpoints):
    return {arch: run(checkpoints[arch]) for arch in ("v3", "v2_two_shared")}


@pytest.mark.parametrize("arch", ["v3", "v2_two_shared"])
@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2), dict(tensor_parallel_size=4),
                                    dict(tensor_parallel_size=2, enable_expert_parallel=True),
                                    dict(tensor_parallel_size=4, enable_expert_parallel=True)],
                         ids=["tp2", "tp4", "tp2-ep", "tp4-ep"])
def test_parallel_layouts_match_one_rank(checkpoints, reference, arch, layout):
    ref_greedy, ref_scored, ref_stats = reference[arch]
    greedy, scored, stats = run(checkpoints[arch], **layout)
    assert ref_stats.num_preemptions > 0  # the cache is small enough to preempt, on one rank and on several
    assert stats.num_preemptions == ref_stats.num_preemptions
    assert [o.token_ids for o in greedy] == [o.token_ids for o in ref_greedy]
    for attribute, ref_out, out in (("logprobs", ref_greedy, greedy), ("prompt_logprobs", ref_scored, scored)):
        ref_values, values = logprob_values(ref_out, attribute), logprob_values(out, attribute)
        assert ref_values.shape == values.shape and ref_values.size > 0
        assert np.max(np.abs(values - ref_values)) / np.max(np.abs(ref_values)) <= 1e-5


@pytest.mark.parametrize("arch", ["v3", "v2_two_shared"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_data_parallel_attention_matches_one_rank(checkpoints, reference, arch, ranks):
    """Each rank serves its own requests from its own 12-page cache (small enough to preempt there too); the MoE
    layers are expert-parallel over all ranks. A rank whose requests have finished still runs padding steps while
    the others work."""
    ref_greedy, ref_scored, _ = reference[arch]
    greedy, scored, stats = run(checkpoints[arch], tensor_parallel_size=ranks, enable_expert_parallel=True,
                                enable_dp_attention=True, num_cache_pages=12, max_model_len=48)
    assert stats.num_preemptions > 0
    assert stats.num_cache_pages == 12 * ranks  # no rank holds another's cache
    assert [o.token_ids for o in greedy] == [o.token_ids for o in ref_greedy]
    for attribute, ref_out, out in (("logprobs", ref_greedy, greedy), ("prompt_logprobs", ref_scored, scored)):
        ref_values, values = logprob_values(ref_out, attribute), logprob_values(out, attribute)
        assert ref_values.shape == values.shape and ref_values.size > 0
        assert np.max(np.abs(values - ref_values)) / np.max(np.abs(ref_values)) <= 1e-5


def test_an_idle_data_parallel_rank_does_not_hang_the_others(checkpoints, reference):
    """One request on two ranks: rank 1 has nothing to do at every step and joins the MoE collectives anyway."""
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), tensor_parallel_size=2,
                                              enable_expert_parallel=True, enable_dp_attention=True, page_size=4,
                                              num_cache_pages=24, max_model_len=64, collective_timeout_s=30, seed=5))
    try:
        out = engine.generate({"prompt_token_ids": PROMPTS[4]},
                              SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    finally:
        engine.shutdown()
    assert out.outputs[0].token_ids == reference["v3"][0][4].outputs[0].token_ids


def test_a_split_the_model_does_not_divide_into_is_refused_before_loading(checkpoints, tmp_path):
    # Only config.json: the error must come from the split, not from weights that are not there.
    (tmp_path / "config.json").write_text((checkpoints["v3"] / "config.json").read_text())
    shutil.copy(checkpoints["v3"] / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 does not divide num_attention_heads \(4\)"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=3))
    with pytest.raises(ValueError, match=r"tensor_parallel_size 8 does not divide num_attention_heads \(4\)"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=8,
                                         enable_expert_parallel=True))
    with pytest.raises(ValueError, match="enable_dp_attention needs tensor_parallel_size > 1 and "
                                         "enable_expert_parallel"):
        EngineConfig(model_name_or_path=str(tmp_path), tensor_parallel_size=2, enable_dp_attention=True)
    with pytest.raises(ValueError, match="whole-model replicas are not built"):
        EngineConfig(model_name_or_path=str(tmp_path), data_parallel_size=2)
    with pytest.raises(ValueError, match="enable_expert_parallel needs tensor_parallel_size > 1"):
        EngineConfig(model_name_or_path=str(tmp_path), enable_expert_parallel=True)


def test_a_rank_that_fails_to_load_fails_the_start_naming_it(checkpoints, tmp_path):
    """Under EP rank 1 of 2 holds experts 4..7: without expert 5's weights only rank 1 fails; rank 0, which has all
    of its own, must not wait for it and reports rank 1's error."""
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["v3"], broken)
    index = broken / "model.safetensors.index.json"
    files = sorted(broken.glob("*.safetensors"))
    removed = 0
    for f in files:
        tensors = load_file(f)
        kept = {k: v for k, v in tensors.items() if ".mlp.experts.5." not in k}
        removed += len(tensors) - len(kept)
        save_file(kept, f, metadata={"format": "pt"})
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if ".mlp.experts.5." not in k}
        index.write_text(json.dumps(data))
    assert removed > 0, "the tiny checkpoint stores its experts one by one"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed: .*experts\.5\."):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(broken), tensor_parallel_size=2,
                                         enable_expert_parallel=True, collective_timeout_s=60))
    assert time.monotonic() - started < 30  # the failure ends the start, not the timeout


# --------------------------------------------------------------------------------------- ranks as processes (mpirun)

_RANK_PROGRAM = """
import json, os, sys, threading
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
path, prompts, die_after = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
if die_after > 0 and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    threading.Timer(die_after, lambda: os.kill(os.getpid(), 9)).start()  # rank 1's process is killed mid-run
engine = DeepInferenceEngine(EngineConfig(model_name_or_path=path, tensor_parallel_size=2, page_size=4,
                                          num_cache_pages=24, max_model_len=64, max_num_batched_tokens=16, seed=5,
                                          collective_timeout_s=20))
params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
rounds = 1000 if die_after > 0 else 1
for _ in range(rounds):
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
print("TOKENS " + json.dumps([o.outputs[0].token_ids for o in outs]), flush=True)
engine.shutdown()
"""


def mpirun(ranks: int, *args: str, timeout: float):
    import os
    import subprocess
    import sys

    mpiexec = shutil.which("mpirun")
    if mpiexec is None:
        from conftest import skip_or_fail
        skip_or_fail("mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)")
    as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return subprocess.run([mpiexec, "--oversubscribe", *as_root, "-np", str(ranks), sys.executable, "-c",
                           _RANK_PROGRAM, *args], capture_output=True, text=True, timeout=timeout)


def test_ranks_as_processes_under_mpirun_give_the_same_tokens(checkpoints, reference):
    import deepinfer._deepinfer as core

    prompts = json.dumps(PROMPTS)
    result = mpirun(2, str(checkpoints["v3"]), prompts, "0", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("TOKENS ")]
    assert len(lines) == 1, result.stdout  # only rank 0 reports; rank 1's process ends with its stop
    assert json.loads(lines[0][len("TOKENS "):]) == [o.token_ids for o in reference["v3"][0]]
    assert not core.mpi_launched()


def test_a_killed_rank_process_ends_the_job_with_an_error(checkpoints):
    started = time.monotonic()
    result = mpirun(2, str(checkpoints["v3"]), json.dumps(PROMPTS), "4", timeout=300)
    assert result.returncode != 0
    assert "TOKENS" not in result.stdout
    assert time.monotonic() - started < 120
    # mpirun names the rank that died and ends the others.
    assert "rank 1" in (result.stderr + result.stdout), result.stderr[-3000:]


def test_one_command_serves_a_tensor_parallel_model_through_the_openai_client(checkpoints, reference):
    """`deepinfer serve MODEL --tensor-parallel-size 2`: the official client gets the one-rank greedy tokens."""
    from conftest import require_module
    from test_server import ServerProcess

    openai = require_module("openai")
    srv = ServerProcess(str(checkpoints["v3"]), "--tensor-parallel-size", "2", "--page-size", "4",
                        "--num-cache-pages", "24", "--max-model-len", "64", "--seed", "5", "--shutdown-timeout", "5")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        got = client.completions.create(model=model, prompt=PROMPTS[3], max_tokens=10, temperature=0.0,
                                        extra_body={"ignore_eos": True})
    finally:
        assert srv.stop() == 0
    assert got.usage.completion_tokens == 10
    assert got.choices[0].text == reference["v3"][0][3].outputs[0].text
