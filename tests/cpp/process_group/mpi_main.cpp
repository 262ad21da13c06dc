// The MPI communicator on several ranks (run_mpi_test.sh starts this program under mpirun on 2 and on 4): the shared
// cases (communicator_cases.h) and MPI's own.
//
// With --timeout-case, rank 1 skips a collective the others wait in: they must throw CollectiveError within the
// timeout, and rank 0 then ends the job with abort(), which ends rank 1 too.
#include "parallel/mpi_communicator.h"

#include "communicator_cases.h"

namespace deepinfer {
namespace {

TEST(MpiCommunicator, RankAndSize) {
  EXPECT_EQ(comm().name(), "mpi");
  EXPECT_GE(comm().size(), 2);
  EXPECT_GE(comm().rank(), 0);
  EXPECT_LT(comm().rank(), comm().size());
  EXPECT_TRUE(mpi_launched());
}

TEST(MpiCommunicator, ASecondCommunicatorIsItsOwnGroup) {
  // MPI is initialized once per process; a second communicator duplicates the world again.
  std::unique_ptr<Communicator> other = make_mpi_communicator(std::chrono::seconds(30));
  EXPECT_EQ(other->rank(), comm().rank());
  EXPECT_EQ(other->size(), comm().size());
  std::array<int64_t, 1> one{1};
  other->all_reduce_host(one, HostReduce::kSum);
  EXPECT_EQ(one[0], comm().size());
  other.reset();
  comm().barrier();
}

int run_timeout_case(Communicator& group) {
  constexpr auto kTimeout = std::chrono::milliseconds(1000);
  const int32_t me = group.rank();
  group.barrier();  // every rank is up before the clock starts
  const auto wait_for_the_end = [me] {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::fprintf(stderr, "rank %d: no abort arrived\n", me);
    return 1;
  };
  if (me == 1) return wait_for_the_end();  // never joins the all_reduce below
  Tensor x = Tensor::zeros({64});
  const auto start = std::chrono::steady_clock::now();
  try {
    group.all_reduce(x.view());
    std::fprintf(stderr, "rank %d: the timeout case FAILED: all_reduce completed without rank 1\n", me);
    return 1;
  } catch (const CollectiveError& e) {
    const auto waited = std::chrono::steady_clock::now() - start;
    const std::string message = e.what();
    const bool names_it = message.find(str_cat("rank ", me, " of ", group.size())) != std::string::npos &&
                          message.find("all_reduce") != std::string::npos &&
                          message.find("1000 ms") != std::string::npos;
    const bool in_time = waited >= kTimeout && waited < kTimeout + std::chrono::seconds(5);
    bool later_fails_at_once = false;
    try {
      group.barrier();
    } catch (const CollectiveError& later) {
      later_fails_at_once = std::string_view(later.what()).find("earlier failure") != std::string_view::npos;
    }
    const auto waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    if (!names_it || !in_time || !later_fails_at_once) {
      std::fprintf(stderr, "rank %d: the timeout case FAILED after %lld ms (names it %d, later call fails %d): %s\n",
                   me, static_cast<long long>(waited_ms), names_it, later_fails_at_once, message.c_str());
      return 1;
    }
    std::fprintf(stderr, "rank %d: the timeout case passed after %lld ms: %s\n", me,
                 static_cast<long long>(waited_ms), message.c_str());
  }
  // One rank ends the job (the others would race it to print); MPI_Abort ends rank 1 too.
  if (me == 0) group.abort("the timeout case is done");
  return wait_for_the_end();
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  using namespace deepinfer;
  ::testing::InitGoogleTest(&argc, argv);
  const bool timeout_case = argc > 1 && std::string_view(argv[1]) == "--timeout-case";
  std::unique_ptr<Communicator> group =
      make_mpi_communicator(timeout_case ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(60000));
  if (group->size() < 2) {
    std::fprintf(stderr, "run under mpirun with 2 ranks or more (tests/cpp/process_group/run_mpi_test.sh)\n");
    return 1;
  }
  if (timeout_case) return run_timeout_case(*group);

  const int status = run_cases_on_every_rank(*group);
  group.reset();
  return status;
}
