# Developer shortcuts. `make test` is what CI runs.
BUILD_DIR ?= build/cpp
JOBS ?= 2
# One interpreter for pip, pytest and the CLI (the one .ci/run installs the test requirements into).
PYTHON ?= python3

# Every recipe line fails when any command of a pipe fails (make's default /bin/sh -c would take the last one's
# status: `pip install ... | tail` exited 0 when the build failed).
SHELL := bash
.SHELLFLAGS := -e -o pipefail -c

.PHONY: install cpp-build cpp-test cuda-build py-test test demo clean

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

# Compiles the CUDA sources for sm_90a (nvcc is enough; no GPU needed), so a CUDA build break fails CI; then builds
# the kernel benchmarks the way their GPU scripts do (BUILD_ONLY=1), so a source list that no longer links fails too.
cuda-build:
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  nvcc=$$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) && \
	  cmake -S . -B build/cuda -G Ninja -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA=ON \
	    -DCMAKE_CUDA_COMPILER=$$nvcc && \
	  cmake --build build/cuda -j $(JOBS) --target deepinfer_cuda && \
	  for bench in mla_decode moe sample; do \
	    BUILD_ONLY=1 NVCC=$$nvcc OUT=build/kernel_bench/$$bench BUILD=build/kernel_bench/$$bench \
	      bash benchmarks/gpu/run_$$bench.sh > build/kernel_bench_$$bench.log 2>&1 || \
	      { tail -n 40 build/kernel_bench_$$bench.log; echo "run_$$bench.sh does not build"; exit 1; }; \
	    tail -n 1 build/kernel_bench_$$bench.log; \
	  done; \
	else echo "nvcc not found: skipping the CUDA compile check"; fi

py-test: install
	$(PYTHON) -m pytest -q tests/python

test: cpp-test cuda-build py-test

demo: install
	$(PYTHON) -m deepinfer.cli generate "To be, or not to be" --max-tokens 48

clean:
	rm -rf build
