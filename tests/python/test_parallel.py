"""Tensor and expert parallelism on the CPU backend (ranks as threads): the same greedy tokens as one rank, and the
same logprobs to fp32 rounding, on both architectures with preemption; splits the model cannot take and a rank that
fails are errors naming the values or the rank, before or instead of a hang."""

from __future__ import annotations

import json
import re
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


# ------------------------------------------- ranks as processes meeting at an address (--nnodes, LWS, torchrun)

_NODE_PROGRAM = """
import json, os, sys, threading
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
path, prompts, extra = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
die_after, die_by = (float(v) for v in sys.argv[4].split(":"))
if die_after > 0:
    threading.Timer(die_after, lambda: os.kill(os.getpid(), int(die_by))).start()  # the signal comes mid-run
rounds = 1000 if extra.pop("rounds", False) else 1
if extra.pop("children_fail", False):
    sys.executable = "/bin/false"  # the machine's other ranks' processes exit at once, with 1
config = dict(model_name_or_path=path, page_size=4, num_cache_pages=24, max_model_len=64, max_num_batched_tokens=16,
              seed=5, collective_timeout_s=20)
config.update(extra)
engine = DeepInferenceEngine(EngineConfig(**config))
params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
for _ in range(rounds):
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
print("TOKENS " + json.dumps([o.outputs[0].token_ids for o in outs]), flush=True)
engine.shutdown()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_gloo() -> None:
    import deepinfer._deepinfer as core

    if "gloo" not in core.process_communicators():
        from conftest import skip_or_fail
        skip_or_fail("this build has no gloo communicator (apt-get install libgloo-dev, then reinstall)")


def run_nodes(path, nodes: list[tuple[dict, dict]], timeout: float = 240, die_after: dict | None = None):
    """Starts one process a machine (its EngineConfig overrides, its environment additions) on this machine and
    returns their (returncode, stdout, stderr) in order, all ended within `timeout`. `die_after`: node index ->
    (seconds, signal) sent to that node's process mid-run."""
    import os
    import subprocess
    import sys

    require_gloo()
    procs = []
    for i, (extra, env) in enumerate(nodes):
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "LWS_"))}
        environment.update(env)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _NODE_PROGRAM, str(path), json.dumps(PROMPTS), json.dumps(extra),
             "{}:{}".format(*(die_after or {}).get(i, (0, 0)))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment))
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def tokens_of(stdout: str):
    lines = [line for line in stdout.splitlines() if line.startswith("TOKENS ")]
    return json.loads(lines[0][len("TOKENS "):]) if len(lines) == 1 else None


@pytest.mark.parametrize("ranks", [2, 4], ids=["one-rank-a-machine", "two-ranks-a-machine"])
def test_two_machines_through_the_multi_node_flags_give_the_same_tokens(checkpoints, reference, ranks):
    """`--nnodes 2 --node-rank R --dist-init-addr HOST:PORT`, two commands on localhost: node 0 runs the engine, node 1
    its steps; with 4 ranks each command also starts its machine's second rank as a child process."""
    address = f"127.0.0.1:{free_port()}"
    nodes = [(dict(tensor_parallel_size=ranks, nnodes=2, node_rank=r, dist_init_addr=address), {}) for r in (1, 0)]
    (rc1, out1, err1), (rc0, out0, err0) = run_nodes(checkpoints["v3"], nodes)
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert tokens_of(out0) == [o.token_ids for o in reference["v3"][0]]
    assert "TOKENS" not in out1  # only rank 0 generates; node 1 ends with its stop
    if ranks == 4:
        # Each machine's second rank is a child process its command started (it logs to the command's stderr).
        assert "rank 1 of 4 (flags): running rank 0's steps" in err0
        assert "rank 3 of 4 (flags): running rank 0's steps" in err1


def test_a_leader_worker_set_and_torchrun_give_the_same_tokens(checkpoints, reference):
    """The rank variables of a Kubernetes LeaderWorkerSet (two pods) and of torchrun (one process a rank) instead of
    flags: the same tokens."""
    expected = [o.token_ids for o in reference["v3"][0]]
    address = f"127.0.0.1:{free_port()}"
    lws = [(dict(tensor_parallel_size=2, dist_init_addr=address),
            {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(r)}) for r in (0, 1)]
    (rc0, out0, err0), (rc1, out1, err1) = run_nodes(checkpoints["v3"], lws)
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert tokens_of(out0) == expected and "TOKENS" not in out1

    port = free_port() - 1  # the engine meets at MASTER_PORT + 1, the port after torch's own store
    torchrun = [(dict(tensor_parallel_size=2), {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in (0, 1)]
    (rc0, out0, err0), (rc1, out1, err1) = run_nodes(checkpoints["v3"], torchrun)
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert tokens_of(out0) == expected and "TOKENS" not in out1


@pytest.mark.parametrize("signal_number", [9, 2], ids=["SIGKILL", "Ctrl-C"])
def test_a_killed_machine_ends_the_leader_with_an_error(checkpoints, signal_number):
    """Node 1's process is killed mid-run, or gets Ctrl-C (which ends a worker at once: its steps run in C++, where
    Python's KeyboardInterrupt would never arrive): node 0's next collective fails at once (its connection closed),
    well before the 20 s timeout, and the leader's program fails naming the rank instead of hanging."""
    address = f"127.0.0.1:{free_port()}"
    nodes = [(dict(tensor_parallel_size=2, nnodes=2, node_rank=r, dist_init_addr=address, rounds=True), {})
             for r in (0, 1)]
    started = time.monotonic()
    (rc0, out0, err0), (rc1, _, _) = run_nodes(checkpoints["v3"], nodes, die_after={1: (4.0, signal_number)})
    assert rc1 == -signal_number and rc0 != 0
    assert "TOKENS" not in out0
    assert time.monotonic() - started < 90
    # gloo says "closed" or "reset" by peer, as the kill met the connection; the bootstrap store names the rank.
    assert re.search(r"rank 0 of 2: \w+ failed \(a rank exited.*Connection (closed|reset) by peer.*; rank 1 has exited",
                     err0), err0[-3000:]


def test_the_multi_node_launch_is_checked_before_anything_starts(checkpoints):
    from deepinfer.launch import rank_placement

    base = dict(model_name_or_path=str(checkpoints["v3"]))
    with pytest.raises(ValueError, match="nnodes=2 needs dist_init_addr"):
        EngineConfig(**base, tensor_parallel_size=2, nnodes=2)
    with pytest.raises(ValueError, match="not a multiple of nnodes 2"):
        EngineConfig(**base, tensor_parallel_size=3, nnodes=2, dist_init_addr="h:1")
    with pytest.raises(ValueError, match=r"node_rank must be an integer in \[0, nnodes=2\)"):
        EngineConfig(**base, tensor_parallel_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1")
    for bad in ("host", "host:0", "host:70000", "::1:5", ":5"):
        with pytest.raises(ValueError, match="dist_init_addr must be HOST:PORT"):
            EngineConfig(**base, tensor_parallel_size=2, nnodes=2, dist_init_addr=bad)
    assert EngineConfig(**base, tensor_parallel_size=2, nnodes=2, dist_init_addr="[::1]:5").dist_init_addr == "[::1]:5"
    with pytest.raises(ValueError, match="'mp' runs the ranks as threads"):
        rank_placement(EngineConfig(**base, tensor_parallel_size=2, nnodes=2, dist_init_addr="h:1",
                                    distributed_executor_backend="mp"), {})
    with pytest.raises(ValueError, match="torchrun started 4 processes"):
        rank_placement(EngineConfig(**base, tensor_parallel_size=2),
                       {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    with pytest.raises(ValueError, match="LWS_LEADER_ADDRESS is not"):
        rank_placement(EngineConfig(**base, tensor_parallel_size=2), {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"})
    with pytest.raises(ValueError, match=r"LWS_WORKER_INDEX=2 is not in \[0, LWS_GROUP_SIZE=2\)"):
        rank_placement(EngineConfig(**base, tensor_parallel_size=2), {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "2",
                                                                      "LWS_LEADER_ADDRESS": "h"})
    # Where each rank lands: machine by machine, the first of each machine starting the rest.
    lws = rank_placement(EngineConfig(**base, tensor_parallel_size=8),
                         {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "leader.svc"})
    assert (lws.launcher, lws.rank, lws.local_rank, lws.init_addr, lws.ranks_per_node) == \
        ("LeaderWorkerSet", 4, 0, "leader.svc:29500", 4)
    assert lws.starts_local_ranks and not lws.is_leader
    child = rank_placement(EngineConfig(**base, tensor_parallel_size=8, nnodes=2, node_rank=1, dist_init_addr="h:7"),
                           {"DEEPINFER_LOCAL_RANK": "3"})
    assert (child.rank, child.local_rank, child.starts_local_ranks) == (7, 3, False)
    assert rank_placement(EngineConfig(**base, tensor_parallel_size=2), {}) is None  # threads of this process


def test_two_serve_commands_one_a_machine_only_the_leader_serves(checkpoints, reference):
    """`deepinfer serve MODEL --tensor-parallel-size 2 --nnodes 2 --node-rank R --dist-init-addr ...` on two
    "machines" (here, on the same --port: the worker must not bind it): the official client gets the one-rank greedy
    tokens from node 0, and node 1's command ends when node 0 stops."""
    import subprocess
    import sys

    from conftest import require_module
    from test_server import HOST, ServerProcess, serve_env

    openai = require_module("openai")
    require_gloo()
    address = f"127.0.0.1:{free_port()}"
    engine_flags = [str(checkpoints["v3"]), "--tensor-parallel-size", "2", "--nnodes", "2", "--dist-init-addr",
                    address, "--page-size", "4", "--num-cache-pages", "24", "--max-model-len", "64", "--seed", "5"]
    leader = ServerProcess(*engine_flags, "--node-rank", "0", "--shutdown-timeout", "5")
    worker = subprocess.Popen([sys.executable, "-m", "deepinfer.cli", "serve", "--host", HOST, "--port",
                               str(leader.port), *engine_flags, "--node-rank", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=serve_env())
    try:
        leader.wait_ready()
        client = openai.OpenAI(base_url=f"{leader.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        got = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPTS[3], max_tokens=10,
                                        temperature=0.0, extra_body={"ignore_eos": True})
    finally:
        assert leader.stop() == 0, leader.final_output[-3000:]
        worker_output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, worker_output[-3000:]
    assert "rank 1 of 2 (flags): running rank 0's steps" in worker_output
    assert got.choices[0].text == reference["v3"][0][3].outputs[0].text


def test_a_machine_started_with_other_options_is_refused_naming_them(checkpoints):
    """Node 1 started with another page size and split: its collectives would have other shapes than node 0's. Both
    commands fail at once, naming each difference, instead of hanging or computing garbage."""
    address = f"127.0.0.1:{free_port()}"
    common = dict(tensor_parallel_size=2, nnodes=2, dist_init_addr=address)
    nodes = [(dict(common, node_rank=0), {}),
             (dict(common, node_rank=1, page_size=8, enable_expert_parallel=True), {})]
    started = time.monotonic()
    (rc0, out0, err0), (rc1, _, err1) = run_nodes(checkpoints["v3"], nodes, timeout=120)
    assert rc0 != 0 and rc1 != 0 and "TOKENS" not in out0
    assert time.monotonic() - started < 60
    expected = ("rank 1 was started with another configuration than rank 0: page_size=8 (rank 0: page_size=4), "
                "enable_expert_parallel=1 (rank 0: enable_expert_parallel=0)")
    assert expected in err1, err1[-3000:]
    assert f"rank 1 aborted: {expected}" in err0, err0[-3000:]


def test_data_parallel_ranks_take_the_requests_whose_prefix_they_cached(checkpoints):
    """Each data-parallel rank has its own cache: a request goes to the rank holding most of its prompt (unless that
    rank has more than twice the least loaded one's requests, plus one). After a first request cached a 24-token
    prefix on rank 0, three of four concurrent requests sharing it land there and find it (routing by load alone
    would send two of them to rank 1, which has none of it); the tokens are one rank's."""
    prefix = [11 + (5 * j) % 400 for j in range(24)]
    batch = [prefix + [300 + i, 7] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def run_all(**layout):
        with DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), page_size=4,
                                              num_cache_pages=48, max_model_len=64, seed=5, **layout)) as e:
            first = e.generate({"prompt_token_ids": prefix + [299, 7]}, params)
            before = e.stats().prefix_cache_hits
            outs = e.generate([{"prompt_token_ids": p} for p in batch], params)
            return [o.outputs[0].token_ids for o in first + outs], e.stats().prefix_cache_hits - before

    ref_tokens, _ = run_all()
    tokens, hits = run_all(tensor_parallel_size=2, enable_expert_parallel=True, enable_dp_attention=True)
    assert tokens == ref_tokens
    assert hits == 3 * len(prefix)


def test_a_local_rank_that_dies_before_the_ranks_meet_ends_the_start_at_once(checkpoints):
    """One command starting its machine's second rank as a process, which exits at once: the first rank stops waiting
    for it (its wait would last the 120 s timeout) and the start fails naming it."""
    nodes = [(dict(tensor_parallel_size=2, dist_init_addr=f"127.0.0.1:{free_port()}", collective_timeout_s=120,
                   children_fail=True), {})]
    started = time.monotonic()
    [(rc, out, err)] = run_nodes(checkpoints["v3"], nodes, timeout=100)
    assert rc != 0 and "TOKENS" not in out
    assert time.monotonic() - started < 60
    assert re.search(r"the ranks' bootstrap was cancelled: rank 1's process \d+ exited with 1", err), err[-3000:]


def test_a_local_rank_gone_before_it_reads_its_configuration_is_reported_not_raised(monkeypatch):
    """The child may exit before its parent writes its configuration (a broken pipe): the start goes on to report
    the exit through the child's watcher instead of failing on the write."""
    import subprocess
    import sys

    from deepinfer import _deepinfer, launch

    started = subprocess.Popen

    def exited_popen(*args, **kwargs):
        child = started(*args, **kwargs)
        child.wait()  # the child is gone before anything is written to it
        return child

    reasons = []
    monkeypatch.setattr(sys, "executable", "/bin/false")
    monkeypatch.setattr(launch.subprocess, "Popen", exited_popen)
    monkeypatch.setattr(_deepinfer, "cancel_bootstrap_waits", reasons.append)
    config = EngineConfig(model_name_or_path="unused", tensor_parallel_size=2)
    placement = launch.RankPlacement("flags", rank=0, local_rank=0, world_size=2, init_addr="127.0.0.1:1",
                                     ranks_per_node=2)
    [child] = launch.start_local_ranks(config, placement)
    deadline = time.monotonic() + 10
    while not reasons and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reasons == [f"rank 1's process {child.pid} exited with 1"]
