# Sourced by the kernel-benchmark scripts (run_mla_decode.sh, run_moe.sh, run_sample.sh, run_fp8_skinny.sh): moves to
# the repository root and sets what they share.
#   kernel_bench_env NAME  ->  OUT (default out/NAME) and BUILD (default build/NAME_bench) created; NVCC (default
#   nvcc); BENCH_COMMIT, BENCH_DATE, BENCH_COMMAND exported for the result JSON. The GPU machine may get the tree
#   without its git history: pass BENCH_COMMIT there.
kernel_bench_env() {
  local name=$1
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
  OUT=${OUT:-out/$name}
  BUILD=${BUILD:-build/${name}_bench}
  mkdir -p "$OUT" "$BUILD"
  export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)}
  export BENCH_DATE=${BENCH_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
  export BENCH_COMMAND=${BENCH_COMMAND:-benchmarks/gpu/run_$name.sh}
  NVCC=${NVCC:-nvcc}
}

#   compile_objects SRC...  ->  each source compiled with "$NVCC" "${FLAGS[@]}" -Xptxas -v into $BUILD/<basename>.o, its
#   log in <basename>.o.log; at most JOBS at once (default: all). On a failure prints every log and returns 1.
compile_objects() {
  local pids=() src obj pid
  for src in "$@"; do
    obj="$BUILD/$(basename "${src%.*}").o"
    "$NVCC" "${FLAGS[@]}" -Xptxas -v -c "$src" -o "$obj" > "$obj.log" 2>&1 &
    pids+=($!)
    if (( ${#pids[@]} >= ${JOBS:-$#} )); then
      wait "${pids[0]}" || { cat "$BUILD"/*.o.log; return 1; }
      pids=("${pids[@]:1}")
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$BUILD"/*.o.log; return 1; }; done
}
