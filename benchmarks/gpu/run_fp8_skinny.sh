#!/usr/bin/env bash
# Builds the FP8 skinny GEMM check + microbenchmark (benchmarks/kernels/fp8_skinny_bench.cu) for sm_90a with nvcc and
# runs it; logs and the JSON go to $OUT (default ./out/fp8_skinny). Run from the repository root on a Hopper GPU
# machine (CUDA 13, gcc, no other deps).
#   BUILD_ONLY=1: build (compile and link) only, no GPU needed; CI checks the source list this way.
#   KERNEL_SOURCE / INT4_KERNEL_SOURCE: a kernel source to build instead of csrc/backend/cuda/gemm/fp8_skinny_gemm.cu
#   / int4_skinny_gemm.cu (another version of it, to compare two on one machine).
#   BENCH_COMMIT / BENCH_DATE: recorded in the JSON (git is used when available).
set -euo pipefail
source "$(dirname "$0")/kernel_bench_env.sh"
kernel_bench_env fp8_skinny
FLAGS=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc --expt-relaxed-constexpr -lineinfo)
SOURCES=(benchmarks/kernels/fp8_skinny_bench.cu "${KERNEL_SOURCE:-csrc/backend/cuda/gemm/fp8_skinny_gemm.cu}"
         "${INT4_KERNEL_SOURCE:-csrc/backend/cuda/gemm/int4_skinny_gemm.cu}" csrc/backend/cuda/gemm/fp8_convert.cu
         csrc/core/fp8.cpp)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$NVCC" --version | tail -n 2
  compile_objects "${SOURCES[@]}" || exit 1
  grep -h -E "registers|spill" "$BUILD"/fp8_skinny_gemm.o.log "$BUILD"/int4_skinny_gemm.o.log || true
  "$NVCC" "${FLAGS[@]}" "$BUILD"/*.o -o "$BUILD/fp8_skinny_bench"
} 2>&1 | tee "$OUT/build.log"
if [[ "${BUILD_ONLY:-0}" == 1 ]]; then echo "built $BUILD/fp8_skinny_bench; not run (BUILD_ONLY=1)"; exit 0; fi

"$BUILD/fp8_skinny_bench" --json "$OUT/fp8_skinny.json" 2>&1 | tee "$OUT/run.log"
"$BUILD/fp8_skinny_bench" --int4 --json "$OUT/int4_skinny.json" 2>&1 | tee "$OUT/run_int4.log"
