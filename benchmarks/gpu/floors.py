"""The two ceilings every GPU figure is reported against, measured with torch on the machine of the run.

    python benchmarks/gpu/floors.py --out OUT_DIR            # writes OUT_DIR/floors.json
    python benchmarks/gpu/floors.py --device cpu --out DIR   # a quick check of the script without a GPU

- Copy bandwidth: a device-to-device copy of --copy-gib GiB (`dst.copy_(src)`), bytes moved = 2 x size (read +
  write), the convention of benchmarks/kernels. The best of --repeats timed batches
  of --iters copies, each batch timed with CUDA events after a warm-up; the median is recorded too.
- bf16 GEMM peak: torch.matmul (cuBLAS) of 8192^3 and 4096x7168x7168 in bf16 with fp32 accumulation
  (reduced-precision reductions off); TFLOP/s = 2 M N K / time, best of the repeats. The larger of the two shapes
  is `bf16_gemm_tflops` (about 800 on an H200).
- FP8 GEMM (informational): torch._scaled_mm with per-tensor scales, e4m3 x e4m3 -> bf16, 8192^3, when this torch
  build has it. DeepSeek's block-scaled FP8 goes through cuBLASLt's block scaling (DESIGN.md), not measured here.

A decode step's roofline floor is (bytes it must read) / copy_gbps; prefill efficiency is TFLOP/s / bf16_gemm_tflops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import run_metadata, write_json  # noqa: E402


def timed(fn, iters: int, repeats: int, device: str) -> list[float]:
    """Seconds per call of fn, one value per repeat (CUDA events on a GPU, perf_counter on the CPU)."""
    for _ in range(2):
        fn()
    out = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t) / iters)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--copy-gib", type=float, default=2.0, help="size of the copied buffer (GiB; CPU: /16)")
    ap.add_argument("--iters", type=int, default=10, help="calls per timed batch")
    ap.add_argument("--repeats", type=int, default=5, help="timed batches; the best is the ceiling")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for floors.json")
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("floors: no CUDA device visible to torch", file=sys.stderr)
        return 1
    result: dict = {"what": "measured ceilings: device-to-device copy bandwidth and GEMM peaks (torch)",
                    **run_metadata(), "device": dev, "torch": torch.__version__}
    if dev == "cuda":
        result["torch_cuda"] = torch.version.cuda
        result["gpu_torch_name"] = torch.cuda.get_device_name(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    # Copy bandwidth.
    nbytes = int(args.copy_gib * (1 << 30)) // (1 if dev == "cuda" else 16)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    secs = timed(lambda: dst.copy_(src), args.iters, args.repeats, dev)
    gbps = [2.0 * nbytes / s / 1e9 for s in secs]
    result["copy"] = {"bytes": nbytes, "gbps_per_repeat": gbps, "gbps_best": max(gbps),
                      "gbps_median": statistics.median(gbps)}
    result["copy_gbps"] = max(gbps)
    print(f"copy {nbytes / 2**30:.2f} GiB: best {max(gbps):,.0f} GB/s, median {statistics.median(gbps):,.0f} GB/s",
          flush=True)
    src = dst = None  # free the buffers

    # GEMM peaks.
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    shapes = [(8192, 8192, 8192), (4096, 7168, 7168)] if dev == "cuda" else [(1024, 1024, 1024)]
    gemms = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        secs = timed(lambda a=a, b=b: torch.matmul(a, b), args.iters, args.repeats, dev)
        tflops = [2.0 * m * n * k / s / 1e12 for s in secs]
        gemms.append({"m": m, "n": n, "k": k, "dtype": str(dtype).replace("torch.", ""), "tflops_best": max(tflops),
                      "tflops_median": statistics.median(tflops)})
        print(f"gemm {m}x{n}x{k} {gemms[-1]['dtype']}: best {max(tflops):,.1f} TFLOP/s", flush=True)
        a = b = None
    result["gemm"] = gemms
    result["bf16_gemm_tflops" if dev == "cuda" else "fp32_gemm_tflops"] = max(g["tflops_best"] for g in gemms)

    if dev == "cuda":
        try:
            m = n = k = 8192
            a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
            one = torch.tensor(1.0, device=dev)
            secs = timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                         args.iters, args.repeats, dev)
            result["fp8_gemm_tflops_per_tensor_scale"] = max(2.0 * m * n * k / s / 1e12 for s in secs)
            print(f"gemm 8192^3 fp8 (per-tensor scales): {result['fp8_gemm_tflops_per_tensor_scale']:,.1f} TFLOP/s")
        except Exception as e:  # informational only
            result["fp8_gemm_error"] = f"{type(e).__name__}: {e}"[:300]
    write_json(args.out / "floors.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
