#!/usr/bin/env bash
# Builds the fused MoE test + microbenchmark for sm_90a with nvcc and runs it; logs and the JSON go to $OUT
# (default ./out/moe). Run from the repository root on a Hopper GPU machine (CUDA 13, gcc, no other deps; cuBLAS is
# loaded at run time for the GEMM-peak ceiling when the machine has it).
#   BUILD_ONLY=1: build (compile and link) only, no GPU needed; CI checks the source list this way.
#   BENCH_COMMIT / BENCH_DATE / BENCH_COMMAND: recorded in the JSON (git is used when available).
#   MOE_BENCH_ARGS: extra arguments for the program (e.g. --quick).
#   MOE_BENCH_BIN: a moe_bench built elsewhere with this script; used when it starts here, else rebuilt.
set -euo pipefail
source "$(dirname "$0")/kernel_bench_env.sh"
kernel_bench_env moe
FLAGS=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc --expt-relaxed-constexpr -Xcompiler -fopenmp
       -lineinfo)
SOURCES=(
  benchmarks/kernels/moe_bench.cu
  csrc/backend/cuda/moe/moe_route.cu
  csrc/backend/cuda/moe/moe_experts.cu
  csrc/backend/cuda/moe/moe_small_ffn.cu
  csrc/backend/cuda/moe/instantiations/*.cu  # every kernel instantiation: bf16, FP8 (W8A16, W8A8) and INT4
  csrc/backend/cuda/gemm/fp8_convert.cu
  csrc/backend/cuda/runtime/cuda_stream.cpp
  csrc/backend/cuda/runtime/device_buffer.cpp
)

build() {
  compile_objects "${SOURCES[@]}" || exit 1
  grep -h -E "registers|spill|C75" "$BUILD"/moe_*.o.log || true
  "$NVCC" "${FLAGS[@]}" "$BUILD"/*.o -o "$BUILD/moe_bench" -ldl
  for k in small_gate_up small_down grouped_gate_up grouped_down grouped_w8a8_gate_up grouped_w8a8_down; do  # the instructions each kernel really uses
    echo "sass $k: $(cuobjdump --dump-sass "$BUILD/moe_$k.o" 2>/dev/null |
      grep -oE '\b(HGMMA|HMMA|LDGSTS|LDG|LDL|STL|BAR|DEPBAR)\b' | sort | uniq -c | tr -s ' \n' ' ')"
  done
}

BIN="$BUILD/moe_bench"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$NVCC" --version | tail -n 2 || true
  if [[ -n "${MOE_BENCH_BIN:-}" && -x "${MOE_BENCH_BIN}" ]] && "${MOE_BENCH_BIN}" --probe; then
    BIN="$MOE_BENCH_BIN"
    echo "using prebuilt $BIN"
  else
    build
  fi
  echo "$BIN" > "$OUT/bin_path"
} 2>&1 | tee "$OUT/build.log"
BIN=$(cat "$OUT/bin_path")
if [[ "${BUILD_ONLY:-0}" == 1 ]]; then echo "built $BIN; not run (BUILD_ONLY=1)"; exit 0; fi

# cuBLAS for the GEMM-peak ceiling: the toolkit's, or the one Python's CUDA wheels carry.
for d in /usr/local/cuda/lib64 $(find /opt /usr/local /usr/lib -maxdepth 9 -name 'libcublas.so*' -path '*nvidia*' \
                                 -printf '%h\n' 2>/dev/null | sort -u | head -n 2); do
  [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done

"$BIN" --json "$OUT/moe_h200.json" ${MOE_BENCH_ARGS:-} 2>&1 | tee "$OUT/run.log"
