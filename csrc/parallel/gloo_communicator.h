// The Communicator of ranks that are separate processes started without an MPI launcher: one command a machine
// (`--nnodes / --node-rank / --dist-init-addr`), torchrun, or a Kubernetes LeaderWorkerSet. The ranks meet at one
// address, where rank 0 serves the bootstrap store (tcp_store.h), and then talk over gloo's TCP transport (gloo, the
// collectives library PyTorch uses on CPUs; Debian's libgloo-dev).
//
// Device collectives take host (CPU backend) views of float32 or bfloat16. Sums are done here, in float32 and in rank
// order, as the MPI communicator does (the same bits on every rank, and as one process summing in order). On GPU
// ranks this communicator carries the host collectives and bootstraps NCCL, which moves the tensors.
//
// Failure: every collective gives up after `timeout`, and a peer that exits or crashes closes its connections, which
// ends the others' current or next collective at once. Either throws CollectiveError on the waiting rank naming it,
// the collective, gloo's message and what the bootstrap store knows: rank 0 serves it for the group's life, every
// rank's connection to it is owned by its rank, so the store lists the ranks whose processes ended ("rank 1 has
// exited"), and a rank that aborts leaves its reason there ("rank 2 aborted: ..."). The communicator is unusable
// from then on, and closes its connections so that the others stop too. abort(reason) prints the reason with the
// rank, leaves it in the store, and closes the connections.
//
// Built without gloo (CMake found none, or -DDEEPINFER_GLOO=OFF), make_gloo_communicator throws InvalidArgument.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace deepinfer {

// Rank `rank` of `size` ranks meeting at `init_addr` ("HOST:PORT"; rank 0 listens there, so it runs on HOST). Every
// rank calls it at once; each waits for the others up to `timeout` (> 0), which also bounds each collective. A
// rank's transport listens on the address of its interface that reaches HOST (GLOO_SOCKET_IFNAME names another).
std::unique_ptr<Communicator> make_gloo_communicator(int32_t rank, int32_t size, const std::string& init_addr,
                                                     std::chrono::milliseconds timeout);

}  // namespace deepinfer
