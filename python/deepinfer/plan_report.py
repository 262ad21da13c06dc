"""A memory plan as ``deepinfer plan`` prints it: a short table for people, or JSON (bytes, not GiB) for programs."""

from __future__ import annotations

import json

from deepinfer.plan import GIB, MemoryPlan, Option

__all__ = ["format_plan", "plan_json"]


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f}"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' if n != 1 else ''}"


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<34}{value:>8}  {note}".rstrip()


def _weights_note(plan: MemoryPlan) -> str:
    parts = sorted(plan.weight_bytes.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{dtype} {n / GIB:,.2f}" for dtype, n in parts)  # two places: the scales are small


def _pages(plan: MemoryPlan) -> str:
    return f"{plan.cache_pages:,} pages of {plan.page_size} tokens"


def _cache_sharing(plan: MemoryPlan) -> str:
    if plan.enable_dp_attention:
        return " (a cache a data-parallel rank)"
    if plan.tensor_parallel_size > 1:
        return " (every rank holds it whole)"
    return ""


def format_plan(plan: MemoryPlan, options: list[Option]) -> str:
    layout = f"tensor_parallel_size {plan.tensor_parallel_size}"
    if plan.enable_dp_attention:
        layout += ", data-parallel attention"
    elif plan.enable_expert_parallel:
        layout += ", expert parallel"
    lines = [f"model     {plan.architecture}, {plan.parameters / 1e9:,.2f} B parameters ({plan.model})"]
    if plan.device == "cuda":
        assert plan.gpu_memory_bytes is not None and plan.budget_bytes is not None
        lines.append(f"layout    {layout} on {_count(plan.gpus, 'GPU')} of {_gib(plan.gpu_memory_bytes)} GiB; weights "
                     f"{plan.weight_format}; cache {plan.cache_dtype}")
        lines.append(_row("a GPU", "GiB"))
        lines.append(_row(f"budget ({plan.gpu_memory_utilization:g} x the GPU)", _gib(plan.budget_bytes)))
        lines.append(_row("weights", _gib(plan.weights_per_gpu), _weights_note(plan)))
        lines.append(_row(f"working memory, {plan.working_tokens:,}-token step", _gib(plan.working_bytes),
                          "estimated"))
        in_use = "in use, measured" if plan.in_use_bytes is not None else "allowance"
        lines.append(_row("CUDA context, libraries, NCCL", _gib(plan.context_bytes), in_use))
        lines.append(_row("decode graphs, engine reserve", _gib(plan.reserve_bytes)))
        lines.append(_row("latent cache", _gib(plan.cache_bytes), _pages(plan)))
    else:
        lines.append(f"layout    {layout} on the CPU backend; weights {plan.weight_format}; cache {plan.cache_dtype}")
        lines.append(_row("a rank", "GiB"))
        lines.append(_row("weights", _gib(plan.weights_per_gpu), _weights_note(plan)))
        lines.append(_row("latent cache", _gib(plan.cache_bytes), _pages(plan)))
    unit = "GPU" if plan.device == "cuda" else "rank"
    lines.append(f"cache     {plan.cache_bytes_per_token:,} bytes a token (all layers); "
                 f"{plan.cache_tokens_per_gpu:,} tokens a {unit}, {plan.cache_tokens_total:,} in all"
                 f"{_cache_sharing(plan)}")
    lines.append(f"verdict   {plan.verdict()}")
    for note in plan.notes:
        lines.append(f"note      {note}")
    if options:
        lines.append("options   change: weights a GPU, cache tokens a GPU, verdict")
        for o in options:
            verdict = "fits" if o.plan.fits else "does not fit"
            if o.plan.fits:
                verdict += f", {o.plan.sequences:,} x {o.plan.context_len:,} tokens"
            note = f" ({o.note})" if o.note else ""
            lines.append(f"  {o.change:<26} {_gib(o.plan.weights_per_gpu):>7} GiB, {o.plan.cache_tokens_per_gpu:>11,}"
                         f" tokens, {verdict}{note}")
    return "\n".join(lines)


def plan_json(plan: MemoryPlan, options: list[Option]) -> str:
    return json.dumps({"plan": plan.to_dict(), "options": [o.to_dict() for o in options]}, indent=2)
