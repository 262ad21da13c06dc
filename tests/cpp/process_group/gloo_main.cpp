// The gloo communicator on several ranks, each a process that run_gloo_test.sh starts with its rank, the number of
// ranks and the address they meet at (DEEPINFER_TEST_RANK, DEEPINFER_TEST_SIZE, DEEPINFER_TEST_ADDR): the shared cases
// (communicator_cases.h) and gloo's own failure cases.
//
// --timeout-case: rank 1 skips a collective the others wait in; they must throw CollectiveError within the timeout,
// and rank 1's next collective must then fail at once (the failed ranks closed their connections), not at its own
// timeout. --killed-case: rank 1's process ends without a word before a collective; the others must throw at once,
// naming it. --abort-case: rank 1 aborts with a reason; the others must throw at once with it.
#include "parallel/gloo_communicator.h"

#include <cstdlib>

#include "communicator_cases.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

int32_t env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    std::fprintf(stderr, "%s is not set: run this program through run_gloo_test.sh\n", name);
    std::exit(2);
  }
  return std::atoi(value);
}

TEST(GlooCommunicator, RankAndSize) {
  EXPECT_EQ(comm().name(), "gloo");
  EXPECT_EQ(comm().rank(), env_int("DEEPINFER_TEST_RANK"));
  EXPECT_EQ(comm().size(), env_int("DEEPINFER_TEST_SIZE"));
}

TEST(GlooCommunicator, RefusesABadAddressOrRank) {
  EXPECT_THROW(make_gloo_communicator(0, 2, "no-port", std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(make_gloo_communicator(0, 2, "host:0", std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(make_gloo_communicator(0, 2, "::1:29500", std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(make_gloo_communicator(2, 2, "127.0.0.1:29500", std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(make_gloo_communicator(0, 2, "127.0.0.1:29500", std::chrono::milliseconds(0)), InvalidArgument);
}

bool says(const std::string& message, std::string_view what) { return message.find(what) != std::string::npos; }

// Prints a case's verdict; then waits a second before the process ends, so that rank 0's bootstrap store outlives
// the other ranks' reading of it.
int report(int32_t me, const char* name, bool passed, Clock::duration waited, const std::string& message) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
  std::fprintf(stderr, "rank %d: the %s %s after %lld ms: %s\n", me, name, passed ? "passed" : "FAILED",
               static_cast<long long>(ms), message.c_str());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return passed ? 0 : 1;
}

int run_timeout_case(Communicator& group) {
  constexpr auto kTimeout = std::chrono::milliseconds(1000);
  const int32_t me = group.rank();
  group.barrier();  // every rank is up before the clock starts
  Tensor x = Tensor::zeros({64});
  const auto start = Clock::now();
  if (me == 1) {
    // Joins late: by then the others have timed out and closed their connections.
    std::this_thread::sleep_for(kTimeout * 3);
    const auto joined = Clock::now();
    try {
      group.barrier();
      return report(me, "timeout case", false, Clock::now() - joined, "the barrier completed without the others");
    } catch (const CollectiveError& e) {
      return report(me, "timeout case", Clock::now() - joined < kTimeout / 2, Clock::now() - joined, e.what());
    }
  }
  try {
    group.all_reduce(x.view());
    return report(me, "timeout case", false, Clock::now() - start, "all_reduce completed without rank 1");
  } catch (const CollectiveError& e) {
    const auto waited = Clock::now() - start;
    const std::string message = e.what();
    const bool names_it = says(message, str_cat("rank ", me, " of ", group.size())) && says(message, "all_reduce") &&
                          says(message, "1000 ms");
    bool later_fails_at_once = false;
    try {
      group.barrier();
    } catch (const CollectiveError& later) {
      later_fails_at_once = says(later.what(), "earlier failure");
    }
    const bool in_time = waited >= kTimeout * 9 / 10 && waited < kTimeout + std::chrono::seconds(5);
    return report(me, "timeout case", names_it && in_time && later_fails_at_once, waited, message);
  }
}

int run_killed_case(Communicator& group) {
  const int32_t me = group.rank();
  group.barrier();
  if (me == 1) std::_Exit(0);  // as a killed process: no destructor, no goodbye
  Tensor x = Tensor::zeros({64});
  const auto start = Clock::now();
  try {
    for (int i = 0; i < 1000; ++i) group.all_reduce(x.view());
    return report(me, "killed case", false, Clock::now() - start, "all_reduce completed without rank 1");
  } catch (const CollectiveError& e) {
    // Far sooner than the 60 s timeout: the dead process's connections closed, and the bootstrap store saw its own
    // close, so every rank's message names it.
    const auto waited = Clock::now() - start;
    const bool named = says(e.what(), "rank 1 has exited");
    return report(me, "killed case", says(e.what(), "all_reduce") && named && waited < std::chrono::seconds(10),
                  waited, e.what());
  }
}

// Rank 1 aborts with a reason while the others wait in a collective: theirs fails at once, with rank 1's reason.
int run_abort_case(Communicator& group) {
  const int32_t me = group.rank();
  group.barrier();
  if (me == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    group.abort("the abort case's reason");
    return 0;
  }
  Tensor x = Tensor::zeros({64});
  const auto start = Clock::now();
  try {
    group.all_reduce(x.view());
    return report(me, "abort case", false, Clock::now() - start, "all_reduce completed without rank 1");
  } catch (const CollectiveError& e) {
    const auto waited = Clock::now() - start;
    return report(me, "abort case", says(e.what(), "rank 1 aborted: the abort case's reason") &&
                                        waited < std::chrono::seconds(10), waited, e.what());
  }
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  using namespace deepinfer;
  ::testing::InitGoogleTest(&argc, argv);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const char* address = std::getenv("DEEPINFER_TEST_ADDR");
  if (address == nullptr) {
    std::fprintf(stderr, "DEEPINFER_TEST_ADDR is not set: run this program through run_gloo_test.sh\n");
    return 2;
  }
  const auto timeout = mode == "--timeout-case" ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(60000);
  std::unique_ptr<Communicator> group =
      make_gloo_communicator(env_int("DEEPINFER_TEST_RANK"), env_int("DEEPINFER_TEST_SIZE"), address, timeout);
  if (mode == "--timeout-case") return run_timeout_case(*group);
  if (mode == "--killed-case") return run_killed_case(*group);
  if (mode == "--abort-case") return run_abort_case(*group);
  const int status = run_cases_on_every_rank(*group);
  group.reset();
  return status;
}
