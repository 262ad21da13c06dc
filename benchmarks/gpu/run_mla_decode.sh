#!/usr/bin/env bash
# Builds the MLA decode test + microbenchmark for sm_90a with nvcc and runs it; logs and the JSON go to $OUT
# (default ./out/mla_decode). Run from the repository root on a Hopper GPU machine (CUDA 13, gcc, no other deps).
#   BUILD_ONLY=1: build (compile and link) only, no GPU needed; CI checks the source list this way.
#   JOBS: at most this many compiles at once (default: every source at once; `make cuda-build JOBS=n` passes it).
#   BENCH_COMMIT / BENCH_DATE: recorded in the JSON (git is used when available).
#   MLA_BENCH_ARGS: extra arguments for the program (e.g. --quick; --fp8 times the FP8 cache too, beside bf16).
set -euo pipefail
source "$(dirname "$0")/kernel_bench_env.sh"
kernel_bench_env mla_decode
FLAGS=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Xcompiler -fopenmp -lineinfo)
SOURCES=(
  benchmarks/kernels/mla_decode_bench.cu
  csrc/backend/cuda/mla/mla_decode.cu
  csrc/backend/cuda/mla/instantiations/mla_decode_narrow.cu
  csrc/backend/cuda/mla/instantiations/mla_decode_wide.cu
  csrc/backend/cuda/mla/instantiations/mla_decode_wide_wgmma.cu
  csrc/backend/cuda/mla/instantiations/mla_decode_narrow_fp8.cu
  csrc/backend/cuda/runtime/cuda_stream.cpp
  csrc/backend/cuda/runtime/device_buffer.cpp
  csrc/backend/cpu/mla.cpp
  csrc/backend/cpu/dense.cpp
  csrc/backend/cpu/gemm.cpp
  csrc/backend/cpu/weight_values.cpp
  csrc/backend/ops_validate.cpp
  csrc/backend/latent_fp8.cpp
  csrc/core/fp8.cpp
  csrc/core/int4.cpp
  csrc/core/tensor.cpp
)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$NVCC" --version | tail -n 2
  compile_objects "${SOURCES[@]}" || exit 1
  grep -h -E "registers|spill" "$BUILD"/mla_decode*.o.log || true
  "$NVCC" "${FLAGS[@]}" "$BUILD"/*.o -o "$BUILD/mla_decode_bench"
  for k in narrow wide wide_wgmma narrow_fp8; do  # the instructions each kernel really uses
    echo "sass $k: $(cuobjdump --dump-sass "$BUILD/mla_decode_$k.o" 2>/dev/null |
      grep -oE '\b(HGMMA|HMMA|LDSM|LDGSTS|LDS|STS|LOP3|HMUL2|PRMT|LDL|STL|BAR)\b' | sort | uniq -c | tr -s ' \n' ' ')"
  done
} 2>&1 | tee "$OUT/build.log"
if [[ "${BUILD_ONLY:-0}" == 1 ]]; then echo "built $BUILD/mla_decode_bench; not run (BUILD_ONLY=1)"; exit 0; fi

"$BUILD/mla_decode_bench" --json "$OUT/mla_decode_h200.json" ${MLA_BENCH_ARGS:-} 2>&1 | tee "$OUT/run.log"
