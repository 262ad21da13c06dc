// The Communicator of GPU ranks, over NCCL (loaded at run time: nccl_library.h). One rank a GPU, one CUDA backend.
//
// Device collectives are queued on the backend's stream, in order with its ops, and return at once: nothing in them
// waits for the device, so a graph the backend captures (Backend::capture) records them with the ops around them.
// Float32 and bfloat16, contiguous views on the backend's device.
//
// The NCCL communicator is non-blocking: init and every call return at once and are polled to completion, so nothing
// waits without a limit. Every wait (init, a host collective) gives up after the timeout: it then aborts the NCCL
// communicator, which makes the other ranks' collectives fail too, and throws CollectiveError naming this rank, the
// collective and NCCL's error. A device collective, which cannot wait, first checks that NCCL has seen no error; one
// it has seen ends that collective the same way. After a failure or abort() every collective throws.
//
// Both factories are collective: every rank of the group calls one at once, from a thread whose current device is
// the backend's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/parallel/nccl_library.h"
#include "parallel/communicator.h"

namespace deepinfer {

inline constexpr std::chrono::seconds kNcclDefaultTimeout{300};

// Ranks that already have a host communicator (threads of one process, or MPI): rank and size are the host's; rank
// 0 makes NCCL's unique id and broadcasts it through `host`. The host collectives (broadcast, all_reduce_host,
// barrier) are the host's; abort() aborts NCCL and the host. `host` and `cuda_backend` must outlive the result.
std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend, Communicator& host,
                                                     std::chrono::seconds timeout = kNcclDefaultTimeout);

// Ranks with no other channel (several machines): NCCL's own bootstrap meets at `init_addr`, "HOST:PORT" (or
// "[IPv6]:PORT"), where rank 0 listens, so rank 0 must run on HOST. This sets NCCL_COMM_ID to init_addr in the
// process's environment, which NCCL reads (the unique id every rank then derives is the address), so the process
// should hold one such communicator. The host collectives go through NCCL on a small device buffer, on the backend's
// stream (so they also wait for the device work queued before them). `cuda_backend` must outlive the result.
std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend, int32_t rank, int32_t size,
                                                     const std::string& init_addr,
                                                     std::chrono::seconds timeout = kNcclDefaultTimeout);

namespace cuda {

// An NCCL communicator handle: destroyed with it, or aborted (abort()): move-only.
class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(const NcclLibrary& lib, NcclCommHandle handle) : lib_(&lib), handle_(handle) {}
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // ncclCommDestroy when no error was seen (it completes the queued work), ncclCommAbort otherwise: destroying a
  // communicator whose peers are gone could wait for them.
  ~NcclComm();

  NcclCommHandle get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }
  // ncclCommGetAsyncError: kSuccess, kInProgress (a call still running) or the error NCCL has seen.
  NcclResult async_error() const;
  // ncclCommAbort now (the queued NCCL work stops; the other ranks' collectives with it fail). Idempotent.
  void abort() noexcept;

 private:
  void reset() noexcept;
  const NcclLibrary* lib_ = nullptr;
  NcclCommHandle handle_ = nullptr;
};

}  // namespace cuda
}  // namespace deepinfer
