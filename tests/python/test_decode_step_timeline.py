"""The attribution of a traced decode step to its kernels (benchmarks/gpu/decode_step_timeline.py), on hand-built
timelines whose answer is known: overlapping kernels under programmatic dependent launch, idle gaps, cut steps."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

from decode_step_timeline import (Kernel, attribute, decode_steps, kernels_from_chrome_trace, split_steps,  # noqa: E402
                                  short_name, summarize)


def k(name, start, end, grid="(1, 1, 1)"):
    return Kernel(name, grid, float(start), float(end))


def test_exposed_time_charges_overlap_to_the_kernel_that_ends_later():
    # b starts early (PDL) at 5, waits for a (ends 10) and ends at 14: only 10..14 is b's; c starts after a 2 us gap.
    step = [k("a", 0, 10), k("b", 5, 14), k("c", 16, 20)]
    exposed, idle, wall = attribute(step)
    assert exposed == [10.0, 4.0, 4.0]
    assert idle == 2.0
    assert wall == 20.0
    assert sum(exposed) + idle == wall


def test_a_kernel_hidden_under_an_earlier_one_is_charged_nothing():
    exposed, idle, wall = attribute([k("long", 0, 30), k("short", 2, 8), k("tail", 9, 33)])
    assert exposed == [30.0, 0.0, 3.0]
    assert (idle, wall) == (0.0, 33.0)


def test_steps_are_cut_after_each_sampling_kernel_and_partial_ends_dropped():
    ks = [k("x", 0, 1), k("sample_kernel<8>", 1, 2), k("a", 3, 5), k("sample_kernel<8>", 5, 6), k("a", 7, 9),
          k("sample_kernel<8>", 9, 10), k("a", 11, 12)]
    steps = split_steps(list(reversed(ks)))  # the trace's order does not matter
    assert [[x.name for x in s] for s in steps] == [["a", "sample_kernel<8>"], ["a", "sample_kernel<8>"]]


def test_summary_averages_over_steps_and_groups_by_name_and_grid():
    steps = [[k("void deepinfer::cuda::gemm(int)", 0, 4, "(2, 1, 1)"), k("gemm(int)", 4, 6, "(8, 1, 1)"),
              k("sample_kernel", 6, 7)],
             [k("gemm(int)", 10, 16, "(2, 1, 1)"), k("gemm(int)", 16, 18, "(8, 1, 1)"), k("sample_kernel", 19, 20)]]
    s = summarize(steps)
    assert s["steps"] == 2
    assert s["step_us"] == pytest.approx((7 + 10) / 2)
    assert s["idle_us"] == pytest.approx(0.5)
    by = {(r["kernel"], r["grid"]): r for r in s["kernels"]}
    assert by[("gemm", "(2, 1, 1)")]["exposed_us_per_step"] == pytest.approx(5.0)
    assert by[("gemm", "(2, 1, 1)")]["calls_per_step"] == 1
    assert by[("gemm", "(8, 1, 1)")]["span_us_per_call"] == pytest.approx(2.0)
    assert s["kernels"][0]["kernel"] == "gemm" and s["kernels"][0]["grid"] == "(2, 1, 1)"  # largest exposed first


def test_chrome_trace_kernel_events_are_read_and_other_events_skipped():
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "k1", "ts": 100.5, "dur": 2.25, "args": {"grid": [4, 1, 1]}},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 99.0, "dur": 5.0},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 103.0, "dur": 1.0},
        {"ph": "M", "name": "process_name"}]}
    assert kernels_from_chrome_trace(trace) == [Kernel("k1", "(4, 1, 1)", 100.5, 102.75)]


def test_decode_steps_keep_the_last_steps_of_the_common_kernel_count():
    prefill = [k("prefill", 0, 1), k("x", 1, 2), k("sample_kernel", 2, 3)]
    decode = [k("x", 0, 1), k("sample_kernel", 1, 2)]
    steps = [prefill, decode, decode, prefill, decode, decode, decode]
    assert decode_steps(steps, 2) == [decode, decode]
    assert decode_steps(steps, 10) == [decode] * 5
    assert decode_steps([], 3) == []


def test_short_names_drop_namespaces_and_arguments():
    assert short_name("void deepinfer::cuda::(anonymous namespace)::skinny_gemm_kernel<1, 1>(SkinnyKernelArgs)") == \
        "skinny_gemm_kernel<1, 1>"
    assert short_name("nvjet_sm90_tss_512x8") == "nvjet_sm90_tss_512x8"
