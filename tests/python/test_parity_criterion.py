"""The GPU parity gate's criterion (benchmarks/gpu/parity_criterion.py) and its compare phase on the CPU.

The margin is a number of bf16 ulps at the step's logit scale: checked against torch's own bf16 grid. A bf16 engine
may choose the fp32 runner-up only under that margin, and teacher-forcing judges every step, including steps after a
near-tie where the free-running comparison has nothing left to compare. End to end: hf_parity.py's references and
compare phase on tiny checkpoints pass for DeepInfer's CPU backend and fail once the engine's weights differ from the
reference's."""

from __future__ import annotations

import json
import shutil
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import hf_parity  # noqa: E402
from parity_criterion import (MARGIN_ULPS, bf16_ulp, judge_free_running, judge_step,  # noqa: E402
                              judge_teacher_forced, step_margin)


def torch_bf16_spacing(x: float) -> float:
    """The distance from |x| (a bf16 number) to the next bf16 number up, by torch's bf16 bit pattern."""
    t = torch.tensor([abs(x)], dtype=torch.bfloat16)
    up = (t.view(torch.int16) + 1).view(torch.bfloat16)
    return float(up.float() - t.float())


@pytest.mark.parametrize("x", [1.0, 1.5, 2.0, 20.0, 35.75, 0.3, -12.0, 1024.0])
def test_the_ulp_is_torchs_bf16_spacing(x):
    assert bf16_ulp(x) == torch_bf16_spacing(float(torch.tensor(x).to(torch.bfloat16)))
    assert bf16_ulp(1.0) == torch.finfo(torch.bfloat16).eps


def logits_with_gap(top: float, gap: float, vocab: int = 10, top_token: int = 3, runner_up: int = 7) -> np.ndarray:
    row = np.full(vocab, top - 10.0, dtype=np.float32)
    row[top_token], row[runner_up] = top, top - gap
    return row


def test_a_step_is_a_near_tie_under_the_margin_only():
    ulp = bf16_ulp(20.0)  # 0.125
    assert step_margin(logits_with_gap(20.0, 1.0)) == MARGIN_ULPS * ulp
    tight = judge_step(0, logits_with_gap(20.0, 3 * ulp), chosen=7)
    assert tight.near_tie and tight.rank_in_fp32 == 1 and tight.ok
    wide = judge_step(0, logits_with_gap(20.0, 5 * ulp), chosen=7)
    assert not wide.near_tie and not wide.ok
    assert judge_step(0, logits_with_gap(20.0, 5 * ulp), chosen=3).ok
    third = logits_with_gap(20.0, 1 * ulp)
    third[5] = 20.0 - 2 * ulp  # a third token inside the margin too: choosing it is not rounding of a tie
    assert not judge_step(0, third, chosen=5).ok


def test_the_margin_scales_with_the_logits():
    """The same gap is a near-tie among large logits and a clear choice among small ones."""
    assert judge_step(0, logits_with_gap(30.0, 0.4), chosen=7).near_tie  # ulp(30) = 1/8: the margin is 0.5
    assert not judge_step(0, logits_with_gap(3.0, 0.4), chosen=7).near_tie  # ulp(3) = 1/64: the margin is 1/16


def trajectory(gaps: list[float], top: float = 20.0) -> tuple[list[int], np.ndarray]:
    rows = [logits_with_gap(top, g) for g in gaps]
    return [3] * len(gaps), np.stack(rows)


def test_free_running_accepts_only_a_near_tie_divergence():
    ref, logits = trajectory([2.0, 2.0, 0.2, 2.0])
    assert judge_free_running(ref, ref, logits)["identical"]
    at_tie = judge_free_running(ref, [3, 3, 7, 9], logits)
    assert at_tie["ok"] and at_tie["first_divergence"] == 2 and at_tie["near_tie"]
    wide = judge_free_running(ref, [3, 7, 7, 7], logits)
    assert not wide["ok"] and wide["first_divergence"] == 1
    assert not judge_free_running(ref, [3, 3], logits)["ok"]  # fewer tokens


def test_teacher_forcing_catches_a_wrong_step_after_a_near_tie():
    """What a first-divergence check cannot see: a near-tie at step 2, then a wrong choice at a wide gap at step 5."""
    ref, logits = trajectory([2.0, 2.0, 0.2, 2.0, 2.0, 2.0])
    verdict = judge_teacher_forced(logits, [3, 3, 7, 3, 3, 7])
    assert not verdict["ok"]
    assert [f["step"] for f in verdict["failures"]] == [5]
    assert verdict["near_tie_steps"] == 1 and verdict["agree"] == 4
    assert judge_teacher_forced(logits, [3, 3, 7, 3, 3, 3])["ok"]
    assert not judge_teacher_forced(logits, [3, 3, 7])["ok"]  # steps missing


def test_teacher_forcing_reports_the_gap_error_in_ulps():
    _, logits = trajectory([2.0, 1.0])
    ulp = bf16_ulp(20.0)
    verdict = judge_teacher_forced(logits, [3, 3], [2.0 + 3 * ulp, 1.0 - ulp])
    assert verdict["gap_error_ulps_max"] == pytest.approx(3.0)
    assert verdict["gap_error_ulps_median"] == pytest.approx(2.0)
    assert judge_teacher_forced(logits, [3, 3], [None, None])["gap_error_ulps_max"] is None


# ------------------------------------------------------------------------------------------ the compare phase, CPU


def parity_args(work: Path, out: Path) -> Namespace:
    return hf_parity.parse_args(["--smoke", "--work", str(work), "--out", str(out), "--new-tokens", "6",
                                 "--archs", "v3", "v2", "--data", str(work / "unused.txt")])


@pytest.fixture()
def work(checkpoints, tmp_path):
    """A work folder as the prepare phase leaves it: the tiny checkpoints and transformers' references."""
    work = tmp_path / "work"
    for arch, name in (("v3", "v3"), ("v2", "v2_two_shared")):
        shutil.copytree(checkpoints[name], work / arch)
    args = parity_args(work, tmp_path / "out")
    prompts = ["To be, or not to be", "Hello world, hello", "abc"]
    for arch in args.archs:
        hf_parity.hf_references(args, arch, prompts)
    (work / "prepare_done.json").write_text(json.dumps({"train": {}}))
    return work


def test_the_cpu_backend_passes_the_gate(work, tmp_path):
    args = parity_args(work, tmp_path / "out")
    assert hf_parity.compare(args) == 0
    result = json.loads((tmp_path / "out" / "hf_parity.json").read_text())
    assert result["verdict"] == "PASS"
    for arch in ("v3", "v2"):
        s = result["models"][arch]["summary"]
        assert s["cpu_identical_to_hf_fp32"] == 3 and s["cpu_teacher_forced_agree"] == "18/18"
        assert s["cpu_gap_error_ulps_max"] < 1e-2  # two fp32 implementations of one model


def test_an_engine_that_computes_another_model_fails_the_gate(work, tmp_path):
    """The engine runs changed weights (the reference keeps transformers' logits of the original): it must fail."""
    path = work / "v3" / "model.safetensors"
    tensors = load_file(str(path))
    name = "model.norm.weight"
    tensors[name] = torch.flip(tensors[name], [0]) * 3.0
    save_file(tensors, str(path), metadata={"format": "pt"})
    args = parity_args(work, tmp_path / "out")
    assert hf_parity.compare(args) == 1
    result = json.loads((tmp_path / "out" / "hf_parity.json").read_text())
    assert result["verdict"] == "FAIL"
    assert not result["models"]["v3"]["summary"]["cpu_ok"] and result["models"]["v2"]["summary"]["cpu_ok"]
    assert any(r["cpu_teacher_forced"]["failures"] for r in result["models"]["v3"]["prompts"])
