#!/usr/bin/env bash
# Before/after on one GPU in one call: the same benchmarks on two trees of the repository, alternating, so that a
# change is measured against its base on the same machine and clocks. The base is another checkout (e.g.
# `git worktree add /tmp/base <commit>`, or `git archive <commit> | tar -x -C DIR`) holding its own scripts.
#
#   BASE=DIR OUT=/some/dir bash benchmarks/gpu/run_ab.sh
#
# Steps: builds both trees with their own run_all.sh (STEPS=build; this tree into run_all's default build folder,
# the base into build/ab-base*, so a warm machine reuses both), measures the floors once, then ROUNDS rounds of
# engine_bench.py (base, then this tree, ENGINE_ARGS), then KERNEL_ROUNDS rounds of each tree's kernel
# benchmarks (run_mla_decode.sh, run_moe.sh; a tree's binaries are built in its first round and reused). ab_report.py writes OUT/ab.md and OUT/ab.json: every decode case and kernel case side by side, the
# change in %, and the cases beyond TOLERANCE_PCT. Per-tree logs and results go under OUT/base and OUT/new, packed
# into OUT/ab_runs.tgz (what comes back from a remote machine is limited in files and depth).
#
# Environment:
#   BASE           the base tree (required)
#   OUT            output folder (default out/ab)
#   ROUNDS         engine_bench rounds per tree (default 2); KERNEL_ROUNDS: kernel benchmark rounds (default 1)
#   ENGINE_ARGS    engine_bench.py arguments (default: the v2-lite decode table, batch 1/8/32/128 x context 1k/8k)
#   STEPS_AB       any of "build engine kernels" (default all three)
#   TOLERANCE_PCT  the change that ab_report.py flags (default 2)
#   BASE_COMMIT, BENCH_COMMIT   the commits to record (the trees may come without .git)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
: "${BASE:?set BASE to the base tree}"
BASE=$(realpath "$BASE")
OUT=$(realpath -m "${OUT:-out/ab}")
ROUNDS=${ROUNDS:-2}
KERNEL_ROUNDS=${KERNEL_ROUNDS:-1}
STEPS_AB=${STEPS_AB:-"build engine kernels"}
ENGINE_ARGS=${ENGINE_ARGS:-"--shapes v2-lite --modes graphs --batches 1 8 32 128 --contexts 1024 8192 --ttft-contexts 1024"}
export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BASE_COMMIT=${BASE_COMMIT:-$(git -C "$BASE" rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1 DEEPINFER_NO_PROGRESS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT/base" "$OUT/new"
want() { [[ " $STEPS_AB " == *" $1 "* ]]; }

# The two trees: where each is built and installed, and its commit.
declare -A TREE=([base]=$BASE [new]=$REPO) SITE=([base]=$REPO/build/ab-base-site [new]=$REPO/build/gpu-site)
declare -A BUILD=([base]=$REPO/build/ab-base [new]=$REPO/build/gpu-all) COMMIT=([base]=$BASE_COMMIT [new]=$BENCH_COMMIT)

# The base reads GoogleTest, the json headers, the wheels and the assets from its own root: lend it this tree's.
for d in .gpu_deps .whl .data; do
  [[ -e "$BASE/$d" || ! -e "$REPO/$d" ]] || ln -s "$REPO/$d" "$BASE/$d"
done

if want build; then
  for t in base new; do
    echo "== build $t (${COMMIT[$t]}) $(date -u +%H:%M:%S)"
    (cd "${TREE[$t]}" && OUT="$OUT/$t/build" STEPS=build SITE="${SITE[$t]}" BUILD_DIR="${BUILD[$t]}" BUDGET_S=0 \
       BENCH_COMMIT="${COMMIT[$t]}" bash benchmarks/gpu/run_all.sh > "$OUT/$t/build.log" 2>&1) ||
      { tail -n 30 "$OUT/$t/build.log"; echo "build of $t failed"; exit 1; }
    grep -E "^deepinfer build" "$OUT/$t/build/build.log" | tail -n 1
  done
fi

if want engine; then
  PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/gpu/floors.py --out "$OUT" > "$OUT/floors.log" 2>&1 ||
    echo "floors.py failed: engine_bench uses its default copy bandwidth"
  for r in $(seq 1 "$ROUNDS"); do
    for t in base new; do
      echo "== engine_bench $t round $r $(date -u +%H:%M:%S)"
      mkdir -p "$OUT/$t/engine_r$r"
      # shellcheck disable=SC2086
      (cd "${TREE[$t]}" && PYTHONPATH="${SITE[$t]}" BENCH_COMMIT="${COMMIT[$t]}" python3 benchmarks/gpu/engine_bench.py \
         --out "$OUT/$t/engine_r$r" --floors "$OUT/floors.json" $ENGINE_ARGS > "$OUT/$t/engine_r$r/log" 2>&1) ||
        { tail -n 20 "$OUT/$t/engine_r$r/log"; echo "engine_bench of $t failed"; }
    done
  done
fi

if want kernels; then
  for r in $(seq 1 "$KERNEL_ROUNDS"); do
    for t in base new; do
      for k in mla_decode moe; do
        echo "== $k kernels $t round $r $(date -u +%H:%M:%S)"
        (cd "${TREE[$t]}" && OUT="$OUT/$t/${k}_r$r" BUILD="$REPO/build/ab-$t-$k" BENCH_COMMIT="${COMMIT[$t]}" \
           bash benchmarks/gpu/run_$k.sh > "$OUT/$t/${k}_r$r.log" 2>&1) ||
          { tail -n 20 "$OUT/$t/${k}_r$r.log"; echo "$k of $t failed"; }
      done
    done
  done
fi

rc=0
if want engine || want kernels; then  # a build-only call has nothing to compare
  python3 benchmarks/gpu/ab_report.py --out "$OUT" --base-commit "$BASE_COMMIT" --new-commit "$BENCH_COMMIT" \
    --tolerance-pct "${TOLERANCE_PCT:-2}"
  rc=$?
fi
tar -czf "$OUT/ab_runs.tgz" -C "$OUT" base new floors.json 2>/dev/null
exit $rc
