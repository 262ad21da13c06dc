# Sourced by the kernel-benchmark scripts (run_mla_decode.sh, run_moe.sh, run_sample.sh): moves to the repository
# root and sets what they share.
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
