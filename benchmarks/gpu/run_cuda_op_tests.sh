#!/usr/bin/env bash
# Builds the C++ tests with the CUDA backend (sm_90a, cuBLAS) and runs every test of the binary: the GPU ones (whose
# name holds "Cuda": the CUDA backend against the CPU reference; they fail without a device) and the host-only rest. Logs and the GoogleTest XML report go to $OUT (default
# ./out/cuda_op_tests). Run from anywhere in the repository on a Hopper GPU machine with CUDA 13, CMake and a C++20
# compiler. Arguments go to the test binary (e.g. --gtest_also_run_disabled_tests for the bandwidth figures of
# CudaBackendPerf). The exit status is the test binary's.
#   GTEST_SOURCE  GoogleTest sources (a googletest checkout, or Debian's /usr/src/googletest) to build first, for a
#                 machine without an installed GoogleTest.
#   JSON_INCLUDE  a folder holding nlohmann/json.hpp, for a machine without the nlohmann_json CMake package.
#   CMAKE_ARGS    more CMake arguments, split on spaces (e.g. cuBLAS library paths for a toolkit without it).
#   BUILD         the build folder (default build/cuda_op_tests); JOBS: parallel build jobs (default: all cores).
#   GTEST_FILTER  the tests to run (default '*': all; '*Cuda*' for the GPU ones only).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/cuda_op_tests}
BUILD=${BUILD:-build/cuda_op_tests}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$BUILD"
OUT=$(realpath "$OUT")
BUILD=$(realpath "$BUILD")

generator=()
if command -v ninja > /dev/null; then generator=(-G Ninja); fi
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_PYTHON=OFF)
if [[ -n "${JSON_INCLUDE:-}" ]]; then
  cmake_args+=(-DDEEPINFER_JSON_INCLUDE_DIR="$(realpath "$JSON_INCLUDE")")
fi
read -r -a extra_cmake_args <<< "${CMAKE_ARGS:-}"
cmake_args+=("${extra_cmake_args[@]}")

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  nvcc --version | tail -n 2
  if [[ -n "${GTEST_SOURCE:-}" ]]; then
    cmake -S "$GTEST_SOURCE" -B "$BUILD/googletest" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$BUILD/googletest-install" > /dev/null
    cmake --build "$BUILD/googletest" -j "$JOBS" > /dev/null
    cmake --install "$BUILD/googletest" > /dev/null
    cmake_args+=(-DCMAKE_PREFIX_PATH="$BUILD/googletest-install")
  fi
  start=$(date +%s)
  cmake -S . -B "$BUILD/deepinfer" "${generator[@]}" "${cmake_args[@]}"
  cmake --build "$BUILD/deepinfer" -j "$JOBS" --target deepinfer_cpp_tests
  echo "build: $(( $(date +%s) - start )) s"
} 2>&1 | tee "$OUT/build.log"

"$BUILD/deepinfer/deepinfer_cpp_tests" --gtest_filter="${GTEST_FILTER:-*}" \
  --gtest_output="xml:$OUT/cuda_op_tests.xml" "$@" 2>&1 | tee "$OUT/test.log"
