"""The offline-throughput baseline of benchmarks/gpu/hf_baseline.py on the CPU (its smoke shape), and the engine
benchmark's report putting it beside the engine's own ShareGPT figures."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import bench_common  # noqa: E402
import engine_bench  # noqa: E402
import hf_baseline  # noqa: E402

TEXTS = ["Write a haiku about the sea.", "What is the capital of France? Answer in one word.",
         "Explain the difference between a list and a tuple in Python, with an example of each.",
         "hi", "Summarize the plot of Hamlet in three sentences, for a reader who has never seen the play."]


def write_prompts(path: Path) -> Path:
    data = [{"id": str(i), "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "..."}]}
            for i, t in enumerate(TEXTS)]
    data.insert(2, {"id": "empty", "conversations": []})  # skipped, as engine_bench skips it
    path.write_text(json.dumps(data))
    return path


def run_hf(tmp_path: Path, batch: int, output: int = 3) -> dict:
    prompts = write_prompts(tmp_path / "sharegpt.json")
    assert hf_baseline.main(["--shapes", "smoke", "--device", "cpu", "--contexts", "64", "--ttft-contexts", "64",
                             "--batches", "1", "--steps", "2", "--sharegpt", str(prompts), "--sharegpt-num", "5",
                             "--sharegpt-output", str(output), "--sharegpt-batch", str(batch),
                             "--out", str(tmp_path)]) == 0
    return json.loads((tmp_path / "hf_baseline.json").read_text())


def test_every_request_generates_exactly_its_tokens(tmp_path):
    sg = run_hf(tmp_path, batch=2)["shapes"]["smoke"]["sharegpt"]
    assert sg["status"] == "ok", sg
    assert sg["completed_requests"] == sg["prompts"] == 5
    assert sg["output_tokens_total"] == 5 * 3
    # the same requests as the engine's benchmark: its prompt selection and truncation
    c = bench_common.shape_config("smoke")
    ids, info = bench_common.sharegpt_prompts(tmp_path / "sharegpt.json", 5, c["vocab_size"],
                                              bench_common.sharegpt_prompt_budget(c, [64], 3))
    assert sg["completed_prompt_tokens"] == info["prompt_tokens_total"] == sum(len(p) for p in ids)
    assert sg["requests_per_s"] > 0
    assert sg["output_tokens_per_s"] == pytest.approx(sg["requests_per_s"] * 3)


def test_the_engine_report_shows_transformers_beside_its_sharegpt_row(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    theirs = run_hf(hf_dir, batch=5)["shapes"]["smoke"]["sharegpt"]
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    ours = {"prompts": 5, "prompt_tokens_mean": theirs["prompt_tokens_mean"], "completed_requests": 5,
            "output_tokens_per_request": 3, "requests_per_s": 2 * theirs["requests_per_s"],
            "output_tokens_per_s": 2 * theirs["output_tokens_per_s"], "total_tokens_per_s": 1.0, "status": "ok",
            "wall_s": 1.0}
    result = {"gpu": None, "commit": "test", "date": "today", "command": "test",
              "shapes": {"smoke": {"config": {"num_hidden_layers": 2}, "modes": {"graphs": {"sharegpt": ours}}}}}
    (engine_dir / "engine_bench.json").write_text(json.dumps(result))
    assert engine_bench.main(["--report-only", "--out", str(engine_dir), "--hf-baseline",
                              str(hf_dir / "hf_baseline.json")]) == 0
    sg = json.loads((engine_dir / "engine_bench.json").read_text())["shapes"]["smoke"]["modes"]["graphs"]["sharegpt"]
    assert abs(sg["output_speedup_vs_hf"] - 2.0) < 1e-9
    report = (engine_dir / "engine_bench.md").read_text()
    assert "transformers on the same prompts (5 of 5 requests" in report and "2.0x the output tokens" in report
