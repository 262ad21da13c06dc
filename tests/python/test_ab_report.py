"""benchmarks/gpu/ab_report.py: the before/after report of run_ab.sh, on result files shaped as engine_bench.py,
mla_decode_bench and moe_bench write them."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import ab_report  # noqa: E402


def engine_result(ms_per_step: dict[tuple[int, int], float], ttft_ms: float) -> dict:
    decode = [{"batch": b, "context": c, "status": "ok", "ms_per_step": ms} for (b, c), ms in ms_per_step.items()]
    decode.append({"batch": 256, "context": 8192, "status": "skipped: does not fit"})
    ttft = [{"context": 1024, "batch": 1, "status": "ok", "ttft_ms_min": ttft_ms, "ttft_ms": [ttft_ms]}]
    return {"shapes": {"v2-lite": {"modes": {"graphs": {"decode": decode, "ttft": ttft}}}}}


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def make_run(folder: Path, new_b1_ms: float, new_moe_us: float) -> None:
    for r, jitter in ((1, 0.0), (2, 0.01)):
        write(folder / "base" / f"engine_r{r}" / "engine_bench.json",
              engine_result({(1, 1024): 2.00 + jitter, (8, 1024): 6.00 + jitter}, 16.0))
        write(folder / "new" / f"engine_r{r}" / "engine_bench.json",
              engine_result({(1, 1024): new_b1_ms + jitter, (8, 1024): 5.90 + jitter}, 16.1))
    mla = {"perf": [{"tag": "main", "heads": 16, "batch": 1, "context": 1024, "kernel": "auto", "time_us": 13.0}]}
    write(folder / "base" / "mla_decode_r1" / "mla_decode_h200.json", mla)
    write(folder / "new" / "mla_decode_r1" / "mla_decode_h200.json", mla)
    for tree, us in (("base", 48.0), ("new", new_moe_us)):
        write(folder / tree / "moe_r1" / "moe_h200.json",
              {"perf": [{"model": "v2-lite", "tag": "main", "tokens": 1, "path": "small-m", "time_us_graph": us,
                         "bytes": 100_000_000}]})


def run(folder: Path, tolerance: float = 2.0) -> tuple[int, dict]:
    sys.argv = ["ab_report.py", "--out", str(folder), "--tolerance-pct", str(tolerance)]
    rc = ab_report.main()
    return rc, json.loads((folder / "ab.json").read_text())


def test_equal_runs_pass_and_every_case_is_paired(tmp_path):
    make_run(tmp_path, new_b1_ms=2.01, new_moe_us=48.2)
    rc, report = run(tmp_path)
    assert rc == 0, report["flagged"]
    engine = {r["case"]: r for r in report["sections"]["Engine"]}
    b1 = engine["decode v2-lite graphs batch 1 ctx 1024 (ms/step)"]
    assert b1["base"] == pytest.approx([2.00, 2.01]) and b1["new"] == pytest.approx([2.01, 2.02])
    assert abs(b1["change_pct"] - 100 * (2.015 / 2.005 - 1)) < 1e-9
    assert "ttft v2-lite graphs ctx 1024 (ms, best repeat)" in engine
    assert not any("256" in case for case in engine), "a skipped case is not a figure"
    assert len(report["sections"]["Kernels"]) == 2
    assert "| decode v2-lite graphs batch 8 ctx 1024 (ms/step) | 6.000 / 6.010 | 5.900 / 5.910 |" in (
        tmp_path / "ab.md").read_text()


def test_a_slower_case_is_flagged(tmp_path):
    make_run(tmp_path, new_b1_ms=2.10, new_moe_us=50.0)  # +4.7% and +4.2%
    rc, report = run(tmp_path)
    assert rc == 1
    assert report["flagged"] == ["decode v2-lite graphs batch 1 ctx 1024 (ms/step)",
                                 "moe v2-lite main T=1 small-m (us per GB read, graph)"]
    rc, _ = run(tmp_path, tolerance=5.0)
    assert rc == 0


def test_a_case_missing_in_one_tree_is_flagged(tmp_path):
    make_run(tmp_path, new_b1_ms=2.0, new_moe_us=48.0)
    (tmp_path / "new" / "moe_r1" / "moe_h200.json").unlink()
    rc, report = run(tmp_path)
    assert rc == 1 and report["flagged"] == ["moe v2-lite main T=1 small-m (us per GB read, graph)"]
