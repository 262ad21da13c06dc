# Developer shortcuts. `make test` is what CI runs.
BUILD_DIR ?= build/cpp
JOBS ?= 2
# One interpreter for pip, pytest and the CLI (the one .ci/run installs the test requirements into).
PYTHON ?= python3

# Every recipe line fails when any command of a pipe fails (make's default /bin/sh -c would take the last one's
# status: `pip install ... | tail` exited 0 when the build failed).
SHELL := bash
.SHELLFLAGS := -e -o pipefail -c

.PHONY: install cpp-build cpp-test cuda-build cuda-test py-test test demo clean

# The whole pip log goes to build/install.log; a failed build shows its tail and stops make (pytest never runs against
# a deepinfer installed earlier). The import afterwards checks that the extension just built is the one installed.
install:
	@mkdir -p build
	@$(PYTHON) -m pip install --no-build-isolation -v . > build/install.log 2>&1 || \
	  { tail -n 40 build/install.log; echo "make install: pip install failed (whole log: build/install.log)"; exit 1; }
	@tail -n 3 build/install.log
	@cd build && $(PYTHON) -c "import deepinfer, deepinfer._deepinfer; print('installed', deepinfer.__file__)"

cpp-build:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA=OFF
	cmake --build $(BUILD_DIR) -j $(JOBS)

cpp-test: cpp-build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Compiles the CUDA sources for sm_90a and the C++ test binary with them (nvcc and the CUDA runtime library are enough:
# no GPU, and cuBLAS may be absent), so a CUDA build break, in the library or in a test, fails CI; then builds the
# kernel benchmarks the way their GPU scripts do (BUILD_ONLY=1), so a source list that no longer links fails too.
# A kernel whose wgmma instructions ptxas serializes (its C7518 warning) fails it too: that costs the kernel its speed.
# Without nvcc it is skipped, except in CI (DEEPINFER_CI=1), where that fails.
CUDA_BUILD_DIR ?= build/cuda
NVCC ?= $(shell command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })

cuda-build:
	@if [ -z "$(NVCC)" ]; then \
	  if [ "$${DEEPINFER_CI:-0}" = 1 ]; then echo "nvcc not found, and CI (DEEPINFER_CI=1) must build the CUDA tests"; exit 1; fi; \
	  echo "nvcc not found: skipping the CUDA build"; exit 0; \
	fi; \
	cmake -S . -B $(CUDA_BUILD_DIR) -G Ninja -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA=ON \
	  -DCMAKE_CUDA_COMPILER=$(NVCC) && \
	mkdir -p build && cmake --build $(CUDA_BUILD_DIR) -j $(JOBS) --target deepinfer_cpp_tests 2>&1 | tee build/cuda_build.log && \
	if grep -q "C7518" build/cuda_build.log; then \
	  grep "C7518" build/cuda_build.log; \
	  echo "ptxas serialized a kernel's wgmma instructions (C7518: accumulators touched in divergent code)"; exit 1; \
	fi && \
	for bench in mla_decode moe sample fp8_skinny; do \
	  BUILD_ONLY=1 NVCC=$(NVCC) OUT=build/kernel_bench/$$bench BUILD=build/kernel_bench/$$bench \
	    bash benchmarks/gpu/run_$$bench.sh > build/kernel_bench_$$bench.log 2>&1 || \
	    { tail -n 40 build/kernel_bench_$$bench.log; echo "run_$$bench.sh does not build"; exit 1; }; \
	  tail -n 1 build/kernel_bench_$$bench.log; \
	done

# Every test of the CUDA test binary that needs no GPU: the host-only selection (the GPU tests are the *Cuda* ones,
# see tests/cpp/cuda_device_required.h; benchmarks/gpu/run_all.sh runs them all on a GPU). The host-side tests of
# the CUDA heuristics and switches run only here.
cuda-test: cuda-build
	@if [ -x $(CUDA_BUILD_DIR)/deepinfer_cpp_tests ]; then \
	  $(CUDA_BUILD_DIR)/deepinfer_cpp_tests --gtest_filter='-*Cuda*' \
	    --gtest_output=xml:$(CUDA_BUILD_DIR)/host_only_tests.xml; \
	else echo "no CUDA test binary: skipping its host-only tests"; fi

py-test: install
	$(PYTHON) -m pytest -q tests/python

test: cpp-test cuda-test py-test

demo: install
	$(PYTHON) -m deepinfer.cli generate "To be, or not to be" --max-tokens 48

clean:
	rm -rf build
