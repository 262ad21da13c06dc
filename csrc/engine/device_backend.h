// The backend of a device name, among the backends this build has.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace deepinfer {

// "cpu", or "cuda" (GPU `index`) when this build has the CUDA backend and that device is visible; throws
// InvalidArgument otherwise. The CPU ignores `index` (each CPU rank is a backend of its own on the same host).
std::unique_ptr<Backend> make_backend(const std::string& device, int index = 0);

}  // namespace deepinfer
