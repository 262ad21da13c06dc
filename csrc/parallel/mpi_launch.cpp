// mpi_launched(): compiled in every build, with or without MPI, so that a process started by mpirun can be told
// the build lacks MPI instead of silently running as one rank.
#include <cstdlib>

#include "parallel/mpi_communicator.h"

namespace deepinfer {

bool mpi_launched() {
  // OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx launchers (OpenMPI's prterun, Slurm's srun --mpi=pmix) set
  // PMIX_RANK.
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace deepinfer
