// The in-process communicator: every collective against values computed here, and the failures that must end a
// collective instead of hanging it (a rank that does not arrive, a rank that aborts).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/half.h"
#include "parallel/local_group.h"

namespace deepinfer {
namespace {

using namespace std::chrono_literals;

// Runs `body(comm)` on every rank of a group of `size`, each in its own thread; rethrows nothing (bodies assert).
void run_ranks(int32_t size, std::chrono::milliseconds timeout, const std::function<void(Communicator&)>& body) {
  LocalGroup group(size, timeout);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int32_t r = 0; r < size; ++r) comms.push_back(group.communicator(r));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < size; ++r) threads.emplace_back([&, r] { body(*comms[static_cast<size_t>(r)]); });
  for (std::thread& t : threads) t.join();
}

TensorView host_view(std::vector<float>& v, Shape shape) { return {v.data(), DType::kF32, shape, Device::kCpu}; }

TEST(LocalGroup, AllReduceSumsInRankOrderAndEveryRankGetsTheSameBits) {
  for (int32_t size : {1, 2, 4}) {
    std::vector<std::vector<float>> results(static_cast<size_t>(size));
    run_ranks(size, 10s, [&](Communicator& comm) {
      std::vector<float> v(37);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) + 1e-3f * static_cast<float>(comm.rank());
      comm.all_reduce(host_view(v, {37}));
      results[static_cast<size_t>(comm.rank())] = v;
    });
    for (size_t i = 0; i < 37; ++i) {
      float expected = 0.0f;
      for (int32_t r = 0; r < size; ++r) expected += 0.1f * static_cast<float>(i) + 1e-3f * static_cast<float>(r);
      for (int32_t r = 0; r < size; ++r) EXPECT_EQ(results[static_cast<size_t>(r)][i], expected) << size << " " << i;
    }
  }
}

TEST(LocalGroup, AllReduceBf16RoundsTheFloatSumOnce) {
  std::vector<std::vector<uint16_t>> results(3);
  run_ranks(3, 10s, [&](Communicator& comm) {
    std::vector<uint16_t> v{float_to_bf16(1.0f), float_to_bf16(0.00390625f * static_cast<float>(comm.rank() + 1))};
    comm.all_reduce({v.data(), DType::kBF16, {2}, Device::kCpu});
    results[static_cast<size_t>(comm.rank())] = v;
  });
  for (const auto& v : results) {
    EXPECT_EQ(bf16_to_float(v[0]), 3.0f);
    EXPECT_EQ(v[1], float_to_bf16(0.00390625f * 6));
  }
}

TEST(LocalGroup, AllGatherReduceScatterAndAllToAll) {
  run_ranks(3, 10s, [](Communicator& comm) {
    const int32_t r = comm.rank();
    std::vector<float> mine{static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};  // [1, 2]
    std::vector<float> all(6);
    comm.all_gather(host_view(mine, {1, 2}), host_view(all, {3, 2}));
    EXPECT_EQ(all, (std::vector<float>{0, 1, 10, 11, 20, 21}));

    std::vector<float> in(6), out(2);
    for (int i = 0; i < 6; ++i) in[static_cast<size_t>(i)] = static_cast<float>(i * (r + 1));
    comm.reduce_scatter(host_view(in, {6}), host_view(out, {2}));
    // sum over ranks of i * (r + 1) = 6 i, for this rank's elements [2 r, 2 r + 2).
    EXPECT_EQ(out, (std::vector<float>{static_cast<float>(12 * r), static_cast<float>(12 * r + 6)}));

    // Rank r sends p + r rows of width 2 to rank p (zero rows from rank 0 to rank 0), each row holding (r, p).
    std::vector<int64_t> send(3), recv(3);
    std::vector<float> rows;
    for (int32_t p = 0; p < 3; ++p) {
      send[static_cast<size_t>(p)] = p + r;
      recv[static_cast<size_t>(p)] = r + p;
      for (int32_t k = 0; k < p + r; ++k) rows.insert(rows.end(), {static_cast<float>(r), static_cast<float>(p)});
    }
    std::vector<float> got(static_cast<size_t>(2 * (3 * r + 3)));
    const int64_t sent_rows = static_cast<int64_t>(rows.size()) / 2;
    comm.all_to_all(host_view(rows, {sent_rows, 2}), send, host_view(got, {3 * r + 3, 2}), recv);
    size_t at = 0;
    for (int32_t p = 0; p < 3; ++p) {
      for (int32_t k = 0; k < r + p; ++k, at += 2) {
        EXPECT_EQ(got[at], static_cast<float>(p));
        EXPECT_EQ(got[at + 1], static_cast<float>(r));
      }
    }
  });
}

TEST(LocalGroup, HostCollectives) {
  run_ranks(4, 10s, [](Communicator& comm) {
    std::vector<int32_t> words;
    if (comm.rank() == 2) words = {7, 8, 9};
    comm.broadcast(words, 2);
    EXPECT_EQ(words, (std::vector<int32_t>{7, 8, 9}));
    std::vector<int32_t> none{1};
    if (comm.rank() == 0) none.clear();
    comm.broadcast(none, 0);
    EXPECT_TRUE(none.empty());
    int64_t v[3] = {comm.rank(), 10 - comm.rank(), 1};
    comm.all_reduce_host(v, HostReduce::kMin);
    EXPECT_EQ(v[0], 0);
    EXPECT_EQ(v[1], 7);
    int64_t s[1] = {comm.rank()};
    comm.all_reduce_host(s, HostReduce::kSum);
    EXPECT_EQ(s[0], 6);
    comm.barrier();
  });
}

TEST(LocalGroup, ARankThatNeverArrivesFailsTheOthersNamingIt) {
  std::vector<std::string> errors(3);
  const auto started = std::chrono::steady_clock::now();
  run_ranks(3, 200ms, [&](Communicator& comm) {
    if (comm.rank() == 1) return;  // skips the collective
    try {
      comm.barrier();
      ADD_FAILURE() << "rank " << comm.rank() << " passed a barrier rank 1 never reached";
    } catch (const CollectiveError& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  for (int32_t r : {0, 2}) EXPECT_NE(errors[static_cast<size_t>(r)].find("rank(s) 1 of 3 did not reach barrier"),
                                     std::string::npos) << errors[static_cast<size_t>(r)];
}

TEST(LocalGroup, AnAbortEndsTheOthersCurrentAndLaterCollectives) {
  std::vector<std::string> errors(3);
  run_ranks(3, 60s, [&](Communicator& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(50ms);  // the others are waiting by now
      comm.abort("out of memory loading layer 7");
      return;
    }
    try {
      comm.barrier();
    } catch (const CollectiveError& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
    EXPECT_THROW(comm.barrier(), CollectiveError);
  });
  for (int32_t r : {0, 1}) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "rank 2 of 3 failed: out of memory loading layer 7");
  }
}

}  // namespace
}  // namespace deepinfer
