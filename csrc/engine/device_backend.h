// The backend of a device name, among the backends this build has.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace deepinfer {

// "cpu", or "cuda" when this build has the CUDA backend and a device is visible; throws InvalidArgument otherwise.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace deepinfer
