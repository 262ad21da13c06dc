// make_mpi_communicator in a build without MPI: says so, and how to get a build with it.
#include "parallel/mpi_communicator.h"

namespace deepinfer {

std::unique_ptr<Communicator> make_mpi_communicator(std::chrono::milliseconds timeout) {
  throw InvalidArgument(
      "this build of deepinfer has no MPI, so ranks cannot run as separate processes: install OpenMPI "
      "(apt-get install libopenmpi-dev openmpi-bin) and rebuild; CMake finds it (-DDEEPINFER_MPI=ON makes it "
      "required)");
}

}  // namespace deepinfer
