#include "engine/host_parallel.h"

#include <cstdint>
#include <exception>

namespace deepinfer {

void parallel_for_on_host_threads(size_t n, const std::function<void(size_t)>& body) {
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    try {
      body(static_cast<size_t>(i));
    } catch (...) {
#pragma omp critical
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace deepinfer
