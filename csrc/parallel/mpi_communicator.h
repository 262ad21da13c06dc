// The Communicator for ranks that are separate processes (the CPU backend across processes or machines), over MPI.
//
// Each rank is one process started by the MPI launcher (`mpirun -np 2 deepinfer ...`); the group is every process of
// the launch (a duplicate of MPI_COMM_WORLD, so the engine's messages never meet anyone else's). MPI is initialized on
// the first make_mpi_communicator of a process and finalized when the process exits.
//
// Device collectives take host (CPU backend) views of float32 or bfloat16. Sums are done here, in float32 and in rank
// order ((x0 + x1) + x2 ...; bfloat16 rounded once at the end), so every rank gets the same bits whatever algorithm
// the MPI library picks, and the same bits as one process summing the ranks' values in order.
//
// Failure: MPI has no way to raise an error on another process. A collective that does not complete within `timeout`
// throws CollectiveError on the rank that waits; that communicator is unusable from then on (its operation is still
// posted), and abort() or its destructor ends the job. abort(reason) prints the reason with the rank and calls
// MPI_Abort: the launcher then kills every rank of the job and exits non-zero. So where the interface has the other
// ranks throw, under MPI they are ended by the launcher, with the failed rank's reason on stderr.
//
// Built without MPI (CMake found none, or -DDEEPINFER_MPI=OFF), make_mpi_communicator throws InvalidArgument.
#pragma once

#include <chrono>
#include <memory>

#include "parallel/communicator.h"

namespace deepinfer {

// True when this process was started by an MPI launcher (OpenMPI's mpirun, or a PMIx launcher such as
// `srun --mpi=pmix`), read from the environment the launcher sets; MPI itself is not touched.
bool mpi_launched();

// The communicator over every process of the launch; its rank and size are MPI's. Every rank calls it, in the same
// order with respect to its other collectives. `timeout` (> 0) bounds each collective.
std::unique_ptr<Communicator> make_mpi_communicator(std::chrono::milliseconds timeout);

}  // namespace deepinfer
