#!/usr/bin/env bash
# Builds the sampling microbenchmark for sm_90a with nvcc and runs it; logs and the JSON go to $OUT (default
# ./out/sample). Run from the repository root on a Hopper GPU machine (CUDA 13, gcc with OpenMP, no other deps).
#   BUILD_ONLY=1: build (compile and link) only, no GPU needed; CI checks the source list this way.
#   BENCH_COMMIT / BENCH_DATE: recorded in the JSON (git is used when available).
set -euo pipefail
source "$(dirname "$0")/kernel_bench_env.sh"
kernel_bench_env sample
FLAGS=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc --expt-relaxed-constexpr -Xcompiler -fopenmp -lineinfo)
SOURCES=(benchmarks/kernels/sample_bench.cu csrc/backend/cuda/sample/sample.cu csrc/backend/cuda/runtime/cuda_stream.cpp
         csrc/backend/cuda/runtime/device_buffer.cpp csrc/backend/cpu/sample.cpp csrc/backend/ops_validate.cpp
         csrc/core/tensor.cpp)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$NVCC" --version | tail -n 2
  pids=()
  for src in "${SOURCES[@]}"; do
    obj="$BUILD/$(echo "${src%.*}" | tr / _).o"  # cpu/sample.cpp and cuda/sample.cu share a basename
    "$NVCC" "${FLAGS[@]}" -Xptxas -v -c "$src" -o "$obj" > "$obj.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$BUILD"/*.o.log; exit 1; }; done
  grep -h -E "registers|spill" "$BUILD"/csrc_backend_cuda_sample.o.log || true
  "$NVCC" "${FLAGS[@]}" "$BUILD"/*.o -o "$BUILD/sample_bench"
} 2>&1 | tee "$OUT/build.log"
if [[ "${BUILD_ONLY:-0}" == 1 ]]; then echo "built $BUILD/sample_bench; not run (BUILD_ONLY=1)"; exit 0; fi

"$BUILD/sample_bench" --json "$OUT/sample_h200.json" 2>&1 | tee "$OUT/run.log"
