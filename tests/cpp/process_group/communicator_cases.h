// The collectives' cases for a communicator whose ranks are processes (MPI, gloo): every collective with
// rank-dependent inputs, each rank checking its result exactly against the rank-order sum or the rows it must hold.
// Every rank computes every rank's inputs, so it knows the exact expected values. Included by one program a
// communicator (mpi_main.cpp, gloo_main.cpp), whose main makes the communicator and sets g_comm.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace deepinfer {
namespace {

Communicator* g_comm = nullptr;  // the process's communicator, made by the program's main

Communicator& comm() { return *g_comm; }

uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Rank `rank`'s input element `i`: signs and magnitudes that vary (2^-12 .. 2^11), so that float sums depend on
// their order and a sum in another order would show.
float input_value(int32_t rank, int64_t i, uint32_t salt) {
  const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(rank) * 40503u ^ salt);
  const float mantissa = static_cast<float>(static_cast<int32_t>(h % 20001u) - 10000) / 10000.0f;
  return std::ldexp(mantissa, static_cast<int>((h >> 16) % 24u) - 12);
}

Tensor f32_input(Shape shape, int32_t rank, uint32_t salt) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = input_value(rank, i, salt);
  return t;
}

Tensor bf16_input(Shape shape, int32_t rank, uint32_t salt) {
  Tensor t = Tensor::empty(shape, DType::kBF16);
  for (int64_t i = 0; i < t.numel(); ++i) t.view().as<uint16_t>()[i] = float_to_bf16(input_value(rank, i, salt));
  return t;
}

// Element i of ((rank 0's + rank 1's) + rank 2's) + ..., in float32.
float rank_order_sum(int64_t i, uint32_t salt, DType dtype) {
  const auto value = [&](int32_t r) {
    const float v = input_value(r, i, salt);
    return dtype == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v;
  };
  float sum = value(0);
  for (int32_t r = 1; r < comm().size(); ++r) sum += value(r);
  return sum;
}

uint32_t f32_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// An FNV-1a hash of a tensor's bytes: equal on every rank exactly when the ranks hold the same bits (checked with a
// min and a max over the ranks, which do not go through the device collectives under test).
void expect_same_bits_on_every_rank(const Tensor& t) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = static_cast<const unsigned char*>(t.view().data);
  for (size_t b = 0; b < t.view().bytes(); ++b) hash = (hash ^ bytes[b]) * 1099511628211ull;
  std::array<int64_t, 1> low{static_cast<int64_t>(hash >> 1)};
  std::array<int64_t, 1> high = low;
  comm().all_reduce_host(low, HostReduce::kMin);
  comm().all_reduce_host(high, HostReduce::kMax);
  EXPECT_EQ(low[0], high[0]) << "the ranks hold different bits";
}

TEST(ProcessGroup, AllReduceHostSumMinMax) {
  const int64_t r = comm().rank();
  const int64_t n = comm().size();
  std::array<int64_t, 4> sum{1, r, r * r, (r - 1) * (int64_t{1} << 40)};
  comm().all_reduce_host(sum, HostReduce::kSum);
  EXPECT_EQ(sum[0], n);
  EXPECT_EQ(sum[1], n * (n - 1) / 2);
  EXPECT_EQ(sum[2], (n - 1) * n * (2 * n - 1) / 6);
  EXPECT_EQ(sum[3], (n * (n - 1) / 2 - n) * (int64_t{1} << 40));
  std::array<int64_t, 2> low{r - 5, -r};
  comm().all_reduce_host(low, HostReduce::kMin);
  EXPECT_EQ(low[0], -5);
  EXPECT_EQ(low[1], -(n - 1));
  std::array<int64_t, 2> high{r - 5, -r};
  comm().all_reduce_host(high, HostReduce::kMax);
  EXPECT_EQ(high[0], n - 6);
  EXPECT_EQ(high[1], 0);
  comm().all_reduce_host(std::span<int64_t>(), HostReduce::kSum);
}

TEST(ProcessGroup, AllReduceF32IsTheRankOrderSum) {
  // Fewer elements than ranks, uneven blocks, several dimensions, and empty tensors.
  for (const Shape& shape : {Shape{1}, Shape{3}, Shape{1001}, Shape{7, 13}, Shape{2, 3, 50}, Shape{0}, Shape{3, 0}}) {
    const uint32_t salt = static_cast<uint32_t>(shape.numel()) * 31u + 1u;
    Tensor x = f32_input(shape, comm().rank(), salt);
    comm().all_reduce(x.view());
    for (int64_t i = 0; i < x.numel(); ++i) {
      ASSERT_EQ(f32_bits(x.f32()[i]), f32_bits(rank_order_sum(i, salt, DType::kF32)))
          << "element " << i << " of " << shape.str() << " on rank " << comm().rank();
    }
    expect_same_bits_on_every_rank(x);
  }
}

TEST(ProcessGroup, AllReduceBf16SumsInF32AndRoundsOnce) {
  for (const Shape& shape : {Shape{5}, Shape{4096}, Shape{9, 33}}) {
    const uint32_t salt = static_cast<uint32_t>(shape.numel()) * 17u + 3u;
    Tensor x = bf16_input(shape, comm().rank(), salt);
    comm().all_reduce(x.view());
    for (int64_t i = 0; i < x.numel(); ++i) {
      ASSERT_EQ(x.view().as<uint16_t>()[i], float_to_bf16(rank_order_sum(i, salt, DType::kBF16)))
          << "element " << i << " of " << shape.str() << " on rank " << comm().rank();
    }
    expect_same_bits_on_every_rank(x);
  }
}

TEST(ProcessGroup, AllGatherStacksTheRanksInOrder) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      const uint32_t salt = static_cast<uint32_t>(rows) + 100u;
      const Shape in_shape{rows, 5};
      Tensor in = dtype == DType::kF32 ? f32_input(in_shape, comm().rank(), salt)
                                       : bf16_input(in_shape, comm().rank(), salt);
      Tensor out = Tensor::zeros({comm().size() * rows, 5}, dtype);
      comm().all_gather(in.cview(), out.view());
      const size_t row_bytes = 5 * dtype_size(dtype);
      for (int32_t r = 0; r < comm().size(); ++r) {
        Tensor expected = dtype == DType::kF32 ? f32_input(in_shape, r, salt) : bf16_input(in_shape, r, salt);
        EXPECT_EQ(std::memcmp(out.view().rows(r * rows, rows).data, expected.view().data, rows * row_bytes), 0)
            << "rank " << r << "'s rows, " << dtype_name(dtype) << ", on rank " << comm().rank();
      }
    }
  }
}

TEST(ProcessGroup, ReduceScatterGivesEachRankItsRowsOfTheSum) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{4}}) {
      const uint32_t salt = static_cast<uint32_t>(rows) + 200u;
      const int64_t cols = 6;
      const Shape in_shape{comm().size() * rows, cols};
      Tensor in = dtype == DType::kF32 ? f32_input(in_shape, comm().rank(), salt)
                                       : bf16_input(in_shape, comm().rank(), salt);
      Tensor out = Tensor::zeros({rows, cols}, dtype);
      comm().reduce_scatter(in.cview(), out.view());
      for (int64_t i = 0; i < out.numel(); ++i) {
        const float sum = rank_order_sum(comm().rank() * rows * cols + i, salt, dtype);
        if (dtype == DType::kF32) {
          ASSERT_EQ(f32_bits(out.f32()[i]), f32_bits(sum)) << "element " << i << " on rank " << comm().rank();
        } else {
          ASSERT_EQ(out.view().as<uint16_t>()[i], float_to_bf16(sum)) << "element " << i << " on rank "
                                                                      << comm().rank();
        }
      }
    }
  }
}

// Rows rank `from` sends to rank `to` in the uneven pattern: 0, 1 or 2 (so some pairs send nothing).
int64_t rows_between(int32_t from, int32_t to, int32_t pattern) { return (from + 2 * to + pattern) % 3; }

// Element `col` of the `j`-th row rank `from` sends to rank `to`: names its source, destination and place.
float sent_value(int32_t from, int32_t to, int64_t j, int64_t col) {
  return static_cast<float>(from * 1000 + to * 100 + j * 10 + col);
}

TEST(ProcessGroup, AllToAllWithUnevenAndZeroCounts) {
  const int32_t me = comm().rank();
  const int64_t cols = 4;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (int32_t pattern = 0; pattern < 3; ++pattern) {
      std::vector<int64_t> send_rows(comm().size());
      std::vector<int64_t> recv_rows(comm().size());
      for (int32_t p = 0; p < comm().size(); ++p) {
        send_rows[p] = rows_between(me, p, pattern);
        recv_rows[p] = rows_between(p, me, pattern);
      }
      const std::vector<int64_t> send_start = row_offsets(send_rows);
      const std::vector<int64_t> recv_start = row_offsets(recv_rows);
      const int64_t send_total = send_start.back() + send_rows.back();
      const int64_t recv_total = recv_start.back() + recv_rows.back();
      Tensor in = Tensor::zeros({send_total, cols}, dtype);
      for (int32_t p = 0; p < comm().size(); ++p) {
        for (int64_t j = 0; j < send_rows[p]; ++j) {
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t at = (send_start[p] + j) * cols + c;
            const float v = sent_value(me, p, j, c);
            if (dtype == DType::kF32) {
              in.f32()[at] = v;
            } else {
              in.view().as<uint16_t>()[at] = float_to_bf16(v);
            }
          }
        }
      }
      Tensor out = Tensor::zeros({recv_total, cols}, dtype);
      comm().all_to_all(in.cview(), send_rows, out.view(), recv_rows);
      for (int32_t p = 0; p < comm().size(); ++p) {
        for (int64_t j = 0; j < recv_rows[p]; ++j) {
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t at = (recv_start[p] + j) * cols + c;
            const float expected = sent_value(p, me, j, c);
            if (dtype == DType::kF32) {
              EXPECT_EQ(out.f32()[at], expected) << "from rank " << p << " row " << j << " on rank " << me;
            } else {
              EXPECT_EQ(out.view().as<uint16_t>()[at], float_to_bf16(expected))
                  << "from rank " << p << " row " << j << " on rank " << me;
            }
          }
        }
      }
    }
  }
  // Nothing sent anywhere.
  const std::vector<int64_t> none(comm().size(), 0);
  Tensor empty_in = Tensor::zeros({0, cols});
  Tensor empty_out = Tensor::zeros({0, cols});
  comm().all_to_all(empty_in.cview(), none, empty_out.view(), none);
}

TEST(ProcessGroup, BroadcastEmptySmallAndLarge) {
  const int32_t me = comm().rank();
  // Empty from the root: the others' words are cleared.
  std::vector<int32_t> words(me == 0 ? 0 : 7, 5);
  comm().broadcast(words, 0);
  EXPECT_TRUE(words.empty()) << "on rank " << me;

  const auto word = [](int64_t i, int32_t root) { return static_cast<int32_t>(mix(static_cast<uint32_t>(i)) ^ root); };
  for (const int64_t count : {int64_t{1}, int64_t{3}, (int64_t{1} << 22) + 3}) {
    for (const int32_t root : {int32_t{1}, comm().size() - 1}) {
      std::vector<int32_t> data(me == root ? static_cast<size_t>(count) : static_cast<size_t>(me + 2), -1);
      if (me == root) {
        for (int64_t i = 0; i < count; ++i) data[i] = word(i, root);
      }
      comm().broadcast(data, root);
      ASSERT_EQ(static_cast<int64_t>(data.size()), count) << "root " << root << " on rank " << me;
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(data[i], word(i, root)) << "word " << i << " of " << count << " from root " << root;
      }
    }
  }
}

TEST(ProcessGroup, BarrierReturnsOnEveryRank) {
  for (int i = 0; i < 10; ++i) comm().barrier();
  // The slowest rank arrives last; nobody leaves before it has arrived.
  const auto arrived = std::chrono::steady_clock::now();
  if (comm().rank() == comm().size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comm().barrier();
  const auto waited = std::chrono::steady_clock::now() - arrived;
  EXPECT_GE(waited, std::chrono::milliseconds(190)) << "rank " << comm().rank() << " left the barrier early";
}

TEST(ProcessGroup, RejectsWhatItCannotMove) {
  // Checked before any message, on every rank alike, so the group stays in step.
  Tensor ints = Tensor::zeros({4}, DType::kI32);
  EXPECT_THROW(comm().all_reduce(ints.view()), Error);
  Tensor x = Tensor::zeros({4});
  TensorView on_gpu = x.view();
  on_gpu.device = Device::kCuda;
  EXPECT_THROW(comm().all_reduce(on_gpu), Error);
  Tensor too_small = Tensor::zeros({3});
  EXPECT_THROW(comm().all_gather(x.cview(), too_small.view()), Error);
  std::vector<int32_t> words;
  EXPECT_THROW(comm().broadcast(words, comm().size()), Error);
  comm().barrier();  // still usable
}

// Prints a failed check with its rank; ranks other than 0 print nothing else, so the output stays readable.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int32_t rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  int32_t rank_;
};

// Runs the cases on `group` (rank 0 prints GoogleTest's report, the others only their failures); returns the exit
// status of the program: non-zero when any rank failed.
int run_cases_on_every_rank(Communicator& group) {
  g_comm = &group;
  if (group.rank() != 0) {
    // GoogleTest owns its listeners: Release hands the default printer back to be deleted, Append takes the new one.
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(group.rank()));
  }
  const int result = RUN_ALL_TESTS();
  std::array<int64_t, 1> failed{result != 0 ? 1 : 0};
  group.all_reduce_host(failed, HostReduce::kMax);
  g_comm = nullptr;
  return failed[0] != 0 ? 1 : 0;
}

}  // namespace
}  // namespace deepinfer
