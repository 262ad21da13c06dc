"""Which backend `pip install .` builds (DEEPINFER_CUDA=AUTO in CMakeLists.txt): the CUDA one where nvcc and a
Hopper GPU are, the CPU one otherwise, saying why. Checked by configuring the project with CMake (no compile) under a
stand-in nvidia-smi that reports the GPUs' compute capability."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def configure(tmp_path: Path, compute_caps: list[str] | None, *extra: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = dict(os.environ)
    if compute_caps is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo {c}\n" for c in compute_caps))
        smi.chmod(0o755)
    # Only the stand-in (or no nvidia-smi at all) on the search path before the system's tools.
    path = [str(bin_dir)] + [p for p in env.get("PATH", "").split(os.pathsep)
                             if not (Path(p) / "nvidia-smi").exists()]
    env["PATH"] = os.pathsep.join(path)
    r = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "build"), "-G", "Ninja",
                        "-DDEEPINFER_BUILD_PYTHON=OFF", "-DDEEPINFER_BUILD_TESTS=OFF", *extra],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture
def nvcc():
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        skip_or_fail("nvcc is not installed")


@pytest.fixture(autouse=True)
def tools():
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed")


def test_a_hopper_gpu_and_nvcc_build_the_cuda_backend(tmp_path, nvcc):
    assert "deepinfer: building the CUDA backend for sm_90a" in configure(tmp_path, ["9.0", "9.0"])


def test_nvcc_without_a_gpu_builds_the_cpu_backend_and_says_so(tmp_path, nvcc):
    out = configure(tmp_path, None)
    assert "nvcc found but no GPU listed by nvidia-smi: building the CPU backend only" in out
    assert "building the CUDA backend" not in out


def test_gpus_that_are_not_hopper_build_the_cpu_backend_and_say_so(tmp_path, nvcc):
    out = configure(tmp_path, ["8.0"])
    assert "the GPUs here (compute capability 8.0) are not Hopper" in out
    assert "building the CUDA backend" not in out


def test_off_and_on_decide_whatever_is_found(tmp_path, nvcc):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert "building the CUDA backend" not in configure(tmp_path / "a", ["9.0"], "-DDEEPINFER_CUDA=OFF")
    assert "building the CUDA backend for sm_90a" in configure(tmp_path / "b", None, "-DDEEPINFER_CUDA=ON")
