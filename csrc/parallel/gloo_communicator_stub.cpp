// make_gloo_communicator in a build without gloo: says so, and how to get a build with it.
#include "parallel/gloo_communicator.h"

namespace deepinfer {

std::unique_ptr<Communicator> make_gloo_communicator(int32_t rank, int32_t size, const std::string& init_addr,
                                                     std::chrono::milliseconds timeout) {
  throw InvalidArgument(
      "this build of deepinfer has no gloo, so ranks cannot meet at an address (--dist-init-addr, torchrun, "
      "LeaderWorkerSet): install it (apt-get install libgloo-dev) and rebuild; CMake finds it (-DDEEPINFER_GLOO=ON "
      "makes it required); or start the ranks with mpirun");
}

}  // namespace deepinfer
