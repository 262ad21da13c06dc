#!/usr/bin/env bash
# Builds the Python extension with the CUDA backend on a GPU machine, runs the engine on the GPU against the CPU
# (benchmarks/gpu/engine_parity.py; RUN_PARITY=0 skips it), then the decode benchmark for each of DECODE_SHAPES.
# Needs nanobind and scikit-build-core installed; JSON_INCLUDE points at a folder with nlohmann/json.hpp where the
# CMake package is missing. Logs and the JSON go to $OUT (default out/engine_parity).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/engine_parity}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
defines=(-C cmake.define.DEEPINFER_CUDA=ON -C build-dir=build/gpu-wheel)
if [[ -n "${JSON_INCLUDE:-}" ]]; then defines+=(-C "cmake.define.DEEPINFER_JSON_INCLUDE_DIR=$(realpath "$JSON_INCLUDE")"); fi
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps --target "$OUT/../site" "${defines[@]}" . > "$OUT/build.log" 2>&1 \
  || { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
if [[ "${RUN_PARITY:-1}" == 1 ]]; then
  PYTHONPATH="$(realpath "$OUT/../site")" python3 benchmarks/gpu/engine_parity.py --out "$OUT" 2>&1 | tee "$OUT/parity.log"
fi
# Decode throughput against the roofline, when asked (DECODE_SHAPES="v2-lite-2l ..."):
for shape in ${DECODE_SHAPES:-}; do
  PYTHONPATH="$(realpath "$OUT/../site")" python3 benchmarks/gpu/decode_bench.py --shape "$shape" --out "$OUT" \
    ${DECODE_ARGS:-} 2>&1 | tee -a "$OUT/decode.log"
done
