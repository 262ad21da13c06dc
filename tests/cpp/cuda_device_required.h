// Which tests need a CUDA device, and what such a test does on a machine without one.
//
// The rule: a test needs a GPU exactly when its full GoogleTest name (suite.test, with a parameterized suite's
// prefix) holds "Cuda". So --gtest_filter='*Cuda*' is the GPU selection and --gtest_filter='-*Cuda*' the host-only
// rest, which CI runs in the CUDA build (`make cuda-test`); ctest labels the first "gpu" (ctest -LE gpu is the same
// host-only selection). The GPU script (benchmarks/gpu/run_all.sh) runs the whole binary.
//
// A test that needs a device starts with DEEPINFER_REQUIRE_CUDA_DEVICE(): without a device it FAILS (a GPU run that
// finds no GPU must not pass by skipping everything), and a test that asks for a device without "Cuda" in its name
// fails everywhere, so the host-only selection can never hold a test that silently needs a GPU.
#pragma once

#ifdef DEEPINFER_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace deepinfer::test {

// True when a CUDA device can be used; clears the error a machine without a GPU or driver reports.
inline bool cuda_device_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

// Why the running test cannot go on as a GPU test, or an empty string when it can.
inline std::string cuda_device_requirement_error() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info == nullptr ? std::string("(no test)")
                                           : std::string(info->test_suite_name()) + "." + info->name();
  if (name.find("Cuda") == std::string::npos) {
    return name + " needs a CUDA device but its name does not hold \"Cuda\": the GPU tests are the *Cuda* ones "
                  "(tests/cpp/cuda_device_required.h), rename it";
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (status != cudaSuccess || count == 0) {
    return std::string("no CUDA device (cudaGetDeviceCount: ") +
           (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) +
           "): this test needs one; on a machine without a GPU run --gtest_filter='-*Cuda*' (ctest -LE gpu)";
  }
  return {};
}

}  // namespace deepinfer::test

// Fails the test (and returns from it) unless it may run as a GPU test and a CUDA device is there.
#define DEEPINFER_REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                           \
    if (const std::string why = ::deepinfer::test::cuda_device_requirement_error(); !why.empty()) \
      GTEST_FAIL() << why;                                                                       \
  } while (0)

#endif  // DEEPINFER_HAVE_CUDA
