#include "parallel/local_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/rank_order_sum.h"

namespace deepinfer {

// One meeting point: every rank publishes what it contributes (pointers and counts into its own memory), waits for
// the others, reads what it needs, and meets them again before its memory may change.
struct LocalGroup::State {
  struct Slot {
    const void* data = nullptr;
    const int64_t* counts = nullptr;  // all_to_all: the rank's send counts
    size_t num_words = 0;             // broadcast: the root's word count
  };

  int32_t size;
  std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t generation = 0;
  std::vector<uint64_t> arrived;  // per rank: the generation it last arrived at + 1
  int32_t num_arrived = 0;
  std::string error;              // set once: every later meeting throws it
  std::vector<Slot> slots;

  State(int32_t n, std::chrono::milliseconds t) : size(n), timeout(t), arrived(static_cast<size_t>(n), 0),
                                                  slots(static_cast<size_t>(n)) {}

  // Returns once every rank has called meet() as often as this rank has; throws CollectiveError when a rank failed
  // or when the others do not arrive in time (which then fails the whole group).
  void meet(int32_t rank, const char* what) {
    std::unique_lock lock(mutex);
    if (!error.empty()) throw CollectiveError(error);
    const uint64_t gen = generation;
    arrived[static_cast<size_t>(rank)] = gen + 1;
    if (++num_arrived == size) {
      num_arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const bool met = cv.wait_for(lock, timeout, [&] { return generation != gen || !error.empty(); });
    if (generation != gen) return;  // met, even if a rank failed afterwards
    if (met) throw CollectiveError(error);
    std::string missing;
    for (int32_t r = 0; r < size; ++r) {
      if (arrived[static_cast<size_t>(r)] != gen + 1) missing += str_cat(missing.empty() ? "" : ", ", r);
    }
    error = str_cat("rank(s) ", missing, " of ", size, " did not reach ", what, " within ",
                    std::chrono::duration<double>(timeout).count(), " s (rank ", rank, " waited for them)");
    cv.notify_all();
    throw CollectiveError(error);
  }

  void fail(int32_t rank, const std::string& reason) {
    std::lock_guard lock(mutex);
    if (error.empty()) error = str_cat("rank ", rank, " of ", size, " failed: ", reason);
    cv.notify_all();
  }
};

namespace {

void check_reducible(DType dtype, const char* what) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, what, ": float32 or bfloat16 only, got ",
           dtype_name(dtype));
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup::State& state, int32_t rank) : s_(state), rank_(rank) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return s_.size; }
  std::string_view name() const override { return "local"; }

  // Every rank sums the same buffers in rank order (rank_order_sum.h), so every rank's result has the same bits.
  void all_reduce(TensorView inout) override {
    check_reducible(inout.dtype, "all_reduce");
    const int64_t n = inout.numel();
    slot().data = inout.data;
    s_.meet(rank_, "all_reduce");
    std::vector<std::byte> sum(static_cast<size_t>(n) * dtype_size(inout.dtype));
    sum_in_rank_order(parts(0), n, inout.dtype, sum.data());
    s_.meet(rank_, "all_reduce");  // everyone has read every buffer: each may now overwrite its own
    std::memcpy(inout.data, sum.data(), sum.size());
  }

  void all_gather(ConstTensorView in, TensorView out) override {
    DI_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * s_.size, "all_gather: ", in.shape.str(), " ",
             dtype_name(in.dtype), " from each of ", s_.size, " ranks into ", out.shape.str(), " ",
             dtype_name(out.dtype));
    slot().data = in.data;
    s_.meet(rank_, "all_gather");
    const size_t bytes = static_cast<size_t>(in.numel()) * dtype_size(in.dtype);
    for (int32_t r = 0; r < s_.size; ++r) {
      std::memcpy(static_cast<char*>(out.data) + static_cast<size_t>(r) * bytes,
                  s_.slots[static_cast<size_t>(r)].data, bytes);
    }
    s_.meet(rank_, "all_gather");
  }

  void reduce_scatter(ConstTensorView in, TensorView out) override {
    check_reducible(in.dtype, "reduce_scatter");
    const int64_t n = out.numel();
    DI_CHECK(out.dtype == in.dtype && in.numel() == n * s_.size, "reduce_scatter: ", in.shape.str(), " into ",
             out.shape.str(), " on ", s_.size, " ranks");
    slot().data = in.data;
    s_.meet(rank_, "reduce_scatter");
    sum_in_rank_order(parts(static_cast<size_t>(n * rank_) * dtype_size(in.dtype)), n, in.dtype, out.data);
    s_.meet(rank_, "reduce_scatter");
  }

  void all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                  std::span<const int64_t> recv_rows) override {
    const auto n = static_cast<size_t>(s_.size);
    DI_CHECK(send_rows.size() == n && recv_rows.size() == n && in.dtype == out.dtype, "all_to_all: ",
             send_rows.size(), " send and ", recv_rows.size(), " receive counts for ", n, " ranks");
    const int64_t row_elems = in.shape.ndim() > 1 ? in.numel() / std::max<int64_t>(in.shape[0], 1) : 1;
    const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(in.dtype);
    slot().data = in.data;
    slot().counts = send_rows.data();
    s_.meet(rank_, "all_to_all");
    const std::vector<int64_t> recv_offsets = row_offsets(recv_rows);
    for (size_t p = 0; p < n; ++p) {
      const LocalGroup::State::Slot& peer = s_.slots[p];
      const std::vector<int64_t> peer_offsets = row_offsets({peer.counts, n});
      const int64_t rows = peer.counts[static_cast<size_t>(rank_)];
      DI_CHECK(rows == recv_rows[p], "all_to_all: rank ", rank_, " expects ", recv_rows[p], " rows from rank ", p,
               ", which sends ", rows);
      std::memcpy(static_cast<char*>(out.data) + static_cast<size_t>(recv_offsets[p]) * row_bytes,
                  static_cast<const char*>(peer.data) +
                      static_cast<size_t>(peer_offsets[static_cast<size_t>(rank_)]) * row_bytes,
                  static_cast<size_t>(rows) * row_bytes);
    }
    s_.meet(rank_, "all_to_all");
  }

  void broadcast(std::vector<int32_t>& words, int32_t root) override {
    DI_CHECK(root >= 0 && root < s_.size, "broadcast: root ", root, " of ", s_.size, " ranks");
    if (rank_ == root) {
      slot().data = words.data();
      slot().num_words = words.size();
    }
    s_.meet(rank_, "broadcast");
    if (rank_ != root) {
      const LocalGroup::State::Slot& src = s_.slots[static_cast<size_t>(root)];
      const auto* begin = static_cast<const int32_t*>(src.data);
      words.assign(begin, begin + src.num_words);
    }
    s_.meet(rank_, "broadcast");
  }

  void all_reduce_host(std::span<int64_t> values, HostReduce op) override {
    slot().data = values.data();
    slot().num_words = values.size();
    s_.meet(rank_, "all_reduce_host");
    std::vector<int64_t> result(values.begin(), values.end());
    for (int32_t r = 0; r < s_.size; ++r) {
      const LocalGroup::State::Slot& peer = s_.slots[static_cast<size_t>(r)];
      DI_CHECK(peer.num_words == values.size(), "all_reduce_host: rank ", r, " gives ", peer.num_words,
               " values, rank ", rank_, " ", values.size());
      const auto* v = static_cast<const int64_t*>(peer.data);
      for (size_t i = 0; i < values.size(); ++i) {
        if (r == 0) {
          result[i] = v[i];
        } else if (op == HostReduce::kSum) {
          result[i] += v[i];
        } else if (op == HostReduce::kMin) {
          result[i] = std::min(result[i], v[i]);
        } else {
          result[i] = std::max(result[i], v[i]);
        }
      }
    }
    s_.meet(rank_, "all_reduce_host");
    std::copy(result.begin(), result.end(), values.begin());
  }

  void barrier() override { s_.meet(rank_, "barrier"); }

  void abort(const std::string& reason) override { s_.fail(rank_, reason); }

 private:
  LocalGroup::State::Slot& slot() { return s_.slots[static_cast<size_t>(rank_)]; }
  // Every rank's published buffer, `offset` bytes in, in rank order.
  std::vector<const void*> parts(size_t offset) const {
    std::vector<const void*> p;
    for (const LocalGroup::State::Slot& slot : s_.slots) p.push_back(static_cast<const std::byte*>(slot.data) + offset);
    return p;
  }

  LocalGroup::State& s_;
  int32_t rank_;
};

}  // namespace

LocalGroup::LocalGroup(int32_t size, std::chrono::milliseconds timeout) {
  DI_CHECK_ARG(size >= 1, "a group needs at least one rank, got ", size);
  DI_CHECK_ARG(timeout.count() > 0, "a group's timeout must be positive");
  state_ = std::make_unique<State>(size, timeout);
}

LocalGroup::~LocalGroup() = default;

int32_t LocalGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> LocalGroup::communicator(int32_t rank) {
  DI_CHECK(rank >= 0 && rank < state_->size, "rank ", rank, " of a group of ", state_->size);
  return std::make_unique<LocalCommunicator>(*state_, rank);
}

}  // namespace deepinfer
