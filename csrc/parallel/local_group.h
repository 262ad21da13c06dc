// Ranks that are threads of one process and share its memory: the CPU backend's ranks (their tensors are host
// memory, so the device collectives are plain memory reads), and the host channel of GPU ranks one process starts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "parallel/communicator.h"

namespace deepinfer {

class LocalGroup {
 public:
  // `size` ranks; a collective that some rank does not reach within `timeout` fails on every rank that waits for it,
  // naming the ranks that did not arrive.
  LocalGroup(int32_t size, std::chrono::milliseconds timeout);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int32_t size() const;
  // The communicator of `rank`, for the thread that runs it. The group must outlive the communicators.
  std::unique_ptr<Communicator> communicator(int32_t rank);

  struct State;  // shared by the group's communicators

 private:
  std::unique_ptr<State> state_;
};

}  // namespace deepinfer
