# Developer shortcuts. `make test` is what CI runs.
BUILD_DIR ?= build/cpp
JOBS ?= 2

.PHONY: install cpp-build cpp-test cuda-build py-test test demo clean

install:
	pip install --no-build-isolation -v . 2>&1 | tail -n 3

cpp-build:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA=OFF
	cmake --build $(BUILD_DIR) -j $(JOBS)

cpp-test: cpp-build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Compiles the CUDA sources for sm_90a (nvcc is enough; no GPU needed), so a CUDA build break fails CI.
cuda-build:
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  cmake -S . -B build/cuda -G Ninja -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA=ON \
	    -DCMAKE_CUDA_COMPILER=$$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) && \
	  cmake --build build/cuda -j $(JOBS) --target deepinfer_cuda; \
	else echo "nvcc not found: skipping the CUDA compile check"; fi

py-test: install
	python -m pytest -q tests/python

test: cpp-test cuda-build py-test

demo: install
	deepinfer generate "To be, or not to be" --max-tokens 48

clean:
	rm -rf build
