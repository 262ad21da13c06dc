// The backend of a device name, among the backends this build has.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace deepinfer {

// "cpu", or "cuda" (GPU `index`) when this build has the CUDA backend and that device is visible; throws
// InvalidArgument otherwise. The CPU ignores `index` (each CPU rank is a backend of its own on the same host).
std::unique_ptr<Backend> make_backend(const std::string& device, int index = 0);

// The device collectives of `backend` for the group `host` belongs to: NCCL on a GPU (created collectively: every
// rank of the group calls this at the same point), nullptr on the CPU, whose ranks compute in host memory and use
// `host` itself. `backend` and `host` must outlive the result.
std::unique_ptr<Communicator> make_device_communicator(Backend& backend, Communicator& host,
                                                       std::chrono::milliseconds timeout);

}  // namespace deepinfer
