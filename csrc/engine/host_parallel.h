// Independent pieces of host work on OpenMP's threads: the step's grammar masks, the scheduler's grammar advances.
#pragma once

#include <cstddef>
#include <functional>

namespace deepinfer {

// body(i) for every i in [0, n), in any order and at once where threads are free; an exception of one body is
// rethrown here after the others ran (none escapes a thread).
void parallel_for_on_host_threads(size_t n, const std::function<void(size_t)>& body);

}  // namespace deepinfer
