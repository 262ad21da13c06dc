"""The greedy parity criterion of hf_parity.py: when may a bf16 engine choose another token than the fp32 reference?

Only at a near-tie, and the margin comes from bf16 itself, not from another implementation's error: a bf16 number
near x is one of a grid with spacing ulp(x) = 2^(floor(log2 |x|) - 7) (8 significant bits), so logits of a bf16
forward are off by a few of those ulps at the logits' scale (the largest |logit| of the step). A step whose fp32
top-2 gap is under MARGIN_ULPS of them is a near-tie: choosing the fp32 runner-up there is rounding. Anything else,
a choice at a wider gap or a token that is not the runner-up, is a bug (a wrong routing, scale or rope moves the
logits by far more than a few ulps).

Two views of one run, both judged at every step:
- free-running: the engine's own greedy tokens against the reference's; every step up to the first divergence must
  agree, and that divergence must be a near-tie (after it the two trajectories condition on different text, so
  there is nothing left to compare);
- teacher-forced: the engine scores the reference's trajectory (prompt logprobs), so every step of it is compared,
  including those after a free-running near-tie: the engine's top token must be the reference's everywhere except at
  near-ties, where it may be the runner-up.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

MARGIN_ULPS = 4.0
BF16_SIGNIFICAND_BITS = 8


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at |x| (normal range)."""
    ax = abs(float(x))
    if ax < 2.0 ** -126:
        return 2.0 ** (-126 - (BF16_SIGNIFICAND_BITS - 1))
    return 2.0 ** (math.floor(math.log2(ax)) - (BF16_SIGNIFICAND_BITS - 1))


def step_margin(logits: np.ndarray, ulps: float = MARGIN_ULPS, fixed: float | None = None) -> float:
    """The near-tie margin of one step's fp32 logits (nats): `ulps` bf16 ulps at their largest magnitude, or a
    `fixed` number of nats (an fp32 engine's: 0 by default, exact agreement)."""
    return fixed if fixed is not None else ulps * bf16_ulp(float(np.abs(logits).max()))


def top2(logits: np.ndarray) -> tuple[int, int]:
    """The fp32 choice and its runner-up of one step (the lower token id first at an exact tie)."""
    first, second = np.argsort(-logits, kind="stable")[:2]
    return int(first), int(second)


@dataclass
class StepVerdict:
    step: int
    fp32_top2: tuple[int, int]
    fp32_top2_gap: float
    margin: float
    chosen: int
    rank_in_fp32: int  # 0: the fp32 choice, 1: its runner-up, ...
    near_tie: bool
    ok: bool


def judge_step(step: int, logits: np.ndarray, chosen: int, ulps: float = MARGIN_ULPS,
               fixed_margin: float | None = None) -> StepVerdict:
    """One step: `chosen` against the fp32 logits of that step."""
    top = top2(logits)
    gap = float(logits[top[0]] - logits[top[1]])
    margin = step_margin(logits, ulps, fixed_margin)
    rank = int((logits > logits[chosen]).sum())
    near_tie = gap < margin
    return StepVerdict(step, top, gap, margin, int(chosen), rank, near_tie, rank == 0 or (near_tie and rank == 1))


def judge_free_running(reference: list[int], got: list[int], logits: np.ndarray, ulps: float = MARGIN_ULPS,
                       fixed_margin: float | None = None) -> dict:
    """`got` (the engine's greedy tokens) against `reference` (the fp32 greedy tokens, `logits[i]` the fp32 logits of
    step i on the reference's trajectory). Every step up to the first divergence agrees by construction; the
    divergence itself must be a near-tie choosing the runner-up. A shorter `got` is a failure."""
    if len(got) < len(reference):
        return {"identical": False, "first_divergence": len(got), "ok": False, "why": "fewer tokens than asked for"}
    d = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), None)
    if d is None:
        return {"identical": True, "first_divergence": None, "ok": True}
    v = judge_step(d, logits[d], got[d], ulps, fixed_margin)
    return {"identical": False, "first_divergence": d, **_public(v), "ok": v.ok}


def judge_teacher_forced(logits: np.ndarray, chosen: list[int], gap_got: list[float | None] | None = None,
                         ulps: float = MARGIN_ULPS, fixed_margin: float | None = None) -> dict:
    """Every step of the reference's trajectory: `chosen[i]` is the engine's top token at step i given the
    reference's tokens before it, `gap_got[i]` (optional) the engine's own logit gap between the fp32 top-2 tokens
    there (None when the runner-up is outside what the engine reported). Reports the failing steps, the near-ties
    and the engine's error on the gap in ulps."""
    failures, near_ties, gap_err_ulps = [], 0, []
    for i, (row, c) in enumerate(zip(logits, chosen)):
        v = judge_step(i, row, c, ulps, fixed_margin)
        near_ties += v.near_tie
        if not v.ok:
            failures.append(_public(v) | {"step": i})
        if gap_got is not None and gap_got[i] is not None:
            gap_err_ulps.append(abs(gap_got[i] - v.fp32_top2_gap) / bf16_ulp(float(np.abs(row).max())))
    return {"steps": len(chosen), "agree": sum(1 for row, c in zip(logits, chosen) if int(np.argmax(row)) == c),
            "near_tie_steps": near_ties, "failures": failures, "ok": not failures and len(chosen) == len(logits),
            "gap_error_ulps_max": max(gap_err_ulps) if gap_err_ulps else None,
            "gap_error_ulps_median": float(np.median(gap_err_ulps)) if gap_err_ulps else None}


def _public(v: StepVerdict) -> dict:
    d = asdict(v)
    d["fp32_top2"] = list(v.fp32_top2)
    del d["ok"]
    return d
