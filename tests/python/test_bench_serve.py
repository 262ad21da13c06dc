"""`deepinfer bench serve`: prompt loading, statistics, and a short run against a real server process."""

from __future__ import annotations

import json
import math

import pytest

from conftest import default_v3_tokenizer, require_module, skip_or_fail

require_module("aiohttp")
require_module("openai")
require_module("fastapi")

from deepinfer.bench.serve import (_percentile, default_dataset, load_prompts, main, random_requests,  # noqa: E402
                                   sample_prompts)
from test_server import ServerProcess  # noqa: E402

VLLM_KEYS = ["completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
             "total_token_throughput", "duration", "input_lens", "output_lens", "ttfts", "errors"] + [
    f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p99")]


def test_load_prompts_formats(tmp_path):
    cases = {
        "strings.json": ["one", "two"],
        "prompts.json": [{"prompt": "one"}, {"prompt": "two"}],
        "sharegpt.json": [{"id": "a", "conversations": [{"from": "human", "value": "one"},
                                                          {"from": "gpt", "value": "answer"}]},
                          {"id": "b", "conversations": [{"from": "system", "value": "sys"},
                                                        {"from": "human", "value": "two"}]}],
        "messages.json": [{"messages": [{"role": "user", "content": "one"}]},
                          {"messages": [{"role": "user", "content": "two"}]}],
    }
    for name, data in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        assert load_prompts(tmp_path / name) == ["one", "two"], name
    (tmp_path / "lines.jsonl").write_text('{"prompt": "one"}\n\n{"prompt": "two"}\n')
    assert load_prompts(tmp_path / "lines.jsonl") == ["one", "two"]
    (tmp_path / "empty.json").write_text(json.dumps([{"other": 1}, ""]))
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(tmp_path / "empty.json")
    assert sample_prompts(["a", "b", "c"], 7, seed=1) == sample_prompts(["a", "b", "c"], 7, seed=1)
    assert sorted(set(sample_prompts(["a", "b", "c"], 7, seed=1))) == ["a", "b", "c"]
    assert sample_prompts(["short", "much longer"], 3, 0, max_chars=5) == ["short"] * 3


def test_sharegpt_default_dataset():
    path = default_dataset()
    if path is None:
        skip_or_fail("the ShareGPT prompts are not beside the repository (../shared/assets/prompts)")
    prompts = load_prompts(path)
    assert len(prompts) == 1000 and all(isinstance(p, str) and p for p in prompts)


def test_percentile():
    assert _percentile([], 50) == 0.0
    assert _percentile([3.0], 99) == 3.0
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isclose(_percentile(list(range(101)), 90), 90.0)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-model-len", "512", "--api-key", "bench-key")
    try:
        srv.wait_ready()
        yield srv
    finally:
        assert srv.stop() == 0


def test_bench_serve_against_the_server(server, tmp_path):
    dataset = tmp_path / "prompts.json"
    dataset.write_text(json.dumps(["To be or not to be", "My lord,", "ROMEO:\n", "Once upon a time", "Hark!", "O"]))
    out = tmp_path / "result.json"
    code = main(["--base-url", server.base_url, "--api-key", "bench-key", "--dataset", str(dataset),
                 "--num-prompts", "8", "--request-rate", "40", "--max-tokens", "8", "--ignore-eos",
                 "--save-result", str(out), "--disable-tqdm", "--percentiles", "95"])
    assert code == 0
    result = json.loads(out.read_text())
    for key in VLLM_KEYS + ["p95_ttft_ms"]:
        assert key in result, key
    assert result["completed"] == 8 and result["failed"] == 0 and result["errors"] == []
    assert result["total_output_tokens"] == 64 and result["total_input_tokens"] > 0
    assert result["mean_ttft_ms"] > 0 and result["mean_e2el_ms"] >= result["mean_ttft_ms"]
    assert result["mean_tpot_ms"] > 0 and result["p99_itl_ms"] >= result["p50_itl_ms"] > 0
    assert result["request_throughput"] > 0 and result["output_throughput"] > 0
    # provenance, as the GPU benchmark scripts record it
    assert result["command"].startswith("deepinfer bench serve ") and result["date"]
    assert result["commit"] and result["gpu"]

    chat_out = tmp_path / "chat.json"
    code = main(["--base-url", server.base_url + "/v1", "--api-key", "bench-key", "--dataset", str(dataset),
                 "--endpoint", "chat", "--num-prompts", "4", "--max-tokens", "4", "--ignore-eos",
                 "--save-result", str(chat_out), "--disable-tqdm", "--no-warmup"])
    assert code == 0
    chat = json.loads(chat_out.read_text())
    assert chat["completed"] == 4 and chat["total_output_tokens"] == 16 and chat["backend"] == "openai-chat"


def test_bench_serve_reports_failures(server, tmp_path, capsys):
    dataset = tmp_path / "prompts.json"
    dataset.write_text(json.dumps(["hello"]))
    out = tmp_path / "result.json"
    # Wrong key: every request fails with 401, and the run says so.
    code = main(["--base-url", server.base_url, "--api-key", "wrong", "--model", "any", "--dataset", str(dataset),
                 "--num-prompts", "3", "--max-tokens", "4", "--no-warmup", "--disable-tqdm",
                 "--save-result", str(out)])
    assert code == 1
    result = json.loads(out.read_text())
    assert result["completed"] == 0 and result["failed"] == 3
    assert all(e.startswith("HTTP 401") for e in result["errors"])
    assert "Failed requests:" in capsys.readouterr().out
    # Nothing listening: a clear error, not a traceback.
    assert main(["--base-url", "http://127.0.0.1:9", "--dataset", str(dataset), "--num-prompts", "1",
                 "--disable-tqdm"]) == 1


def test_random_dataset_lengths():
    tokenizer = default_v3_tokenizer()
    fixed = random_requests(tokenizer, 4, input_len=32, output_len=5, seed=3)
    assert fixed == random_requests(tokenizer, 4, input_len=32, output_len=5, seed=3)  # the seed decides
    assert len({r.prompt for r in fixed}) == 4 and all(r.max_tokens == 5 for r in fixed)
    for r in fixed:  # about the length asked for: re-encoding random tokens' text can merge a few
        assert 24 <= len(tokenizer.encode(r.prompt, add_special_tokens=False)) <= 32
    ranged = random_requests(tokenizer, 20, input_len=20, output_len=10, range_ratio=0.5, seed=0)
    assert all(5 <= r.max_tokens <= 15 for r in ranged) and len({r.max_tokens for r in ranged}) > 1


def test_bench_serve_random_dataset_needs_no_file(server, tmp_path, capsys):
    from deepinfer.default_model import TRAINED_MODEL_DIR

    if not (TRAINED_MODEL_DIR / "tokenizer.json").is_file():
        skip_or_fail("the embedded demo model (and its tokenizer) is not in this build")
    out = tmp_path / "random.json"
    # The served model's tokenizer makes the prompts, so their lengths are its token counts.
    code = main(["--base-url", server.base_url, "--api-key", "bench-key", "--dataset-name", "random",
                 "--tokenizer", str(TRAINED_MODEL_DIR), "--random-input-len", "24", "--random-output-len", "4", "--num-prompts", "4", "--ignore-eos",
                 "--save-result", str(out), "--disable-tqdm", "--no-warmup"])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 4 and result["total_output_tokens"] == 16
    assert 4 * 16 <= result["total_input_tokens"] <= 4 * 26  # ~24 each (+ BOS)
    assert result["dataset_name"] == "random" and result["random_input_len"] == 24
    # A prompt file with --dataset-name random is a mistake, said as one.
    assert main(["--dataset-name", "random", "--dataset", str(out), "--disable-tqdm"]) == 2
    assert "--dataset-name sharegpt" in capsys.readouterr().err


def test_arrival_schedule():
    from deepinfer.bench.serve import arrival_offsets

    assert arrival_offsets(4, math.inf, 1.0, 0) == [0.0] * 4
    poisson = arrival_offsets(2000, 50.0, 1.0, 7)
    assert poisson[0] == 0.0 and all(b >= a for a, b in zip(poisson, poisson[1:]))
    assert poisson == arrival_offsets(2000, 50.0, 1.0, 7)  # the seed decides
    assert abs(poisson[-1] / 1999 - 1 / 50.0) < 0.1 / 50.0  # mean gap 1 / rate


def test_bench_serve_with_several_load_generators(server, tmp_path):
    """The requests dealt to two processes: each sent once (the same prompts' lengths, in order), all counted."""
    dataset = tmp_path / "prompts.json"
    dataset.write_text(json.dumps(["To be or not to be", "My lord,", "ROMEO:\n", "Once upon a time", "Hark!", "O"]))
    results = {}
    for workers in (1, 2):
        out = tmp_path / f"result_{workers}.json"
        code = main(["--base-url", server.base_url, "--api-key", "bench-key", "--dataset", str(dataset),
                     "--num-prompts", "6", "--request-rate", "30", "--max-tokens", "5", "--ignore-eos",
                     "--num-workers", str(workers), "--save-result", str(out), "--disable-tqdm"])
        assert code == 0
        results[workers] = json.loads(out.read_text())
    one, two = results[1], results[2]
    assert two["num_workers"] == 2 and one["num_workers"] == 1
    assert two["completed"] == 6 and two["failed"] == 0 and two["total_output_tokens"] == 30
    assert two["input_lens"] == one["input_lens"] and len(set(two["input_lens"])) > 1
    assert two["duration"] > 0 and two["mean_ttft_ms"] > 0 and two["p50_itl_ms"] > 0
    # A concurrency cap is shared among the workers: never more workers than it allows.
    for cap, expected in ((3, 2), (1, 1)):
        out = tmp_path / f"capped_{cap}.json"
        assert main(["--base-url", server.base_url, "--api-key", "bench-key", "--dataset", str(dataset),
                     "--num-prompts", "4", "--max-tokens", "3", "--ignore-eos", "--num-workers", "2",
                     "--max-concurrency", str(cap), "--save-result", str(out), "--disable-tqdm", "--no-warmup"]) == 0
        capped = json.loads(out.read_text())
        assert capped["num_workers"] == expected and capped["completed"] == 4 and capped["max_concurrency"] == cap
    assert main(["--base-url", server.base_url, "--dataset", str(dataset), "--num-workers", "0",
                 "--disable-tqdm"]) == 2
