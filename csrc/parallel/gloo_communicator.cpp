// The gloo communicator (see gloo_communicator.h).
#include "parallel/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "parallel/host_views.h"
#include "parallel/tcp_store.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

// gloo's rendezvous reads and writes its pair addresses through this; a read waits for the key until the deadline.
class BootstrapStore final : public gloo::rendezvous::Store {
 public:
  BootstrapStore(TcpStoreClient& client, Clock::time_point deadline) : client_(client), deadline_(deadline) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return client_.get(key, deadline_); }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) client_.get(key, deadline_);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const Clock::time_point until = std::min(deadline_, Clock::now() + timeout);
    for (const std::string& key : keys) client_.get(key, until);
  }

 private:
  TcpStoreClient& client_;
  Clock::time_point deadline_;
};

// gloo moves bytes of a fixed element size: bfloat16 as uint16_t, float32 as float.
template <typename Fn>
void with_element_type(DType dtype, Fn&& fn) {
  if (dtype == DType::kF32) {
    fn(float{});
  } else {
    fn(uint16_t{});
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int32_t rank, int32_t size, const HostPort& at, std::chrono::milliseconds timeout);
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override = default;

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  std::string_view name() const override { return "gloo"; }

  void all_reduce(TensorView inout) override;
  void all_gather(ConstTensorView in, TensorView out) override;
  void reduce_scatter(ConstTensorView in, TensorView out) override;
  void all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                  std::span<const int64_t> recv_rows) override;
  void broadcast(std::vector<int32_t>& words, int32_t root) override;
  void all_reduce_host(std::span<int64_t> values, HostReduce op) override;
  void barrier() override;
  void abort(const std::string& reason) override;

 private:
  std::string where() const { return str_cat("rank ", rank_, " of ", size_); }
  // Runs one gloo operation: an earlier failure, or this one's (gloo throws on a timeout and on a closed peer),
  // throws CollectiveError naming the rank and the collective.
  template <typename Op>
  void run(const char* collective, Op&& op);
  // What the bootstrap store knows of the ranks that failed ("; rank 1 has exited", "; rank 2 aborted: ..."), for a
  // failure's message; "" when it knows nothing (a rank that is alive but stuck).
  std::string who_failed();
  void alltoallv_bytes(const void* in, std::span<const int64_t> send_elements, void* out,
                       std::span<const int64_t> recv_elements, DType dtype);

  int32_t rank_;
  int32_t size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::rendezvous::Context> context_;  // gloo's options hold the context by shared_ptr
  std::mutex mutex_;  // one collective at a time: a gloo context serves one thread
  std::vector<std::byte> scratch_;
  std::vector<std::byte> block_;
  std::string failure_;  // non-empty once a collective failed
  std::atomic<bool> closed_{false};
  // The bootstrap store, kept for the group's life: rank 0 serves it; every rank's connection is owned by its rank,
  // so that the store lists who has left, and a rank that aborts leaves its reason there.
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::mutex store_mutex_;  // the client's connection serves one request at a time
};

GlooCommunicator::GlooCommunicator(int32_t rank, int32_t size, const HostPort& at, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  // gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that died would end this process with SIGPIPE
  // instead of failing the collective with EPIPE. (Python ignores SIGPIPE already; a C++ program may not.)
  std::signal(SIGPIPE, SIG_IGN);
  if (rank == 0) server_ = std::make_unique<TcpStoreServer>(at);
  try {
    client_ = std::make_unique<TcpStoreClient>(at, deadline);
    client_->own(str_cat("rank ", rank));
    TcpStoreClient& client = *client_;
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
      attr.iface = iface;
    } else {
      attr.hostname = client.local_address();
    }
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(timeout);
    BootstrapStore store(client, deadline);
    context_->connectFullMesh(store, device);
    gloo::BarrierOptions done(context_);
    gloo::barrier(done);
  } catch (const gloo::Exception& e) {
    throw CollectiveError(str_cat("gloo ", where(), ": the ranks did not connect at ", at.str(), ": ", e.what()));
  } catch (const CollectiveError& e) {
    throw CollectiveError(str_cat("gloo ", where(), ": ", e.what()));
  }
}

template <typename Op>
void GlooCommunicator::run(const char* collective, Op&& op) {
  if (!failure_.empty()) {
    throw CollectiveError(str_cat(where(), ": ", collective, " after an earlier failure: ", failure_));
  }
  if (closed_.load()) {
    failure_ = str_cat(where(), ": ", collective, " after this rank aborted");
    throw CollectiveError(failure_);
  }
  try {
    op();
  } catch (const gloo::Exception& e) {
    failure_ = str_cat(where(), ": ", collective, " failed (a rank exited, aborted, or did not join it within ",
                       timeout_.count(), " ms): ", e.what(), who_failed());
    if (!closed_.exchange(true)) context_->closeConnections();  // the others stop at once, not at their timeout
    throw CollectiveError(failure_);
  }
}

std::string GlooCommunicator::who_failed() {
  // A killed rank's store connection closes as its pairs do; the store may take a moment to see it.
  const Clock::time_point until = Clock::now() + std::chrono::milliseconds(500);
  std::lock_guard lock(store_mutex_);
  try {
    while (true) {
      std::string found;
      for (int32_t r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (const auto reason = client_->try_get(str_cat("deepinfer/failure/", r))) {
          found += str_cat("; rank ", r, " aborted: ", std::string_view(reason->data(), reason->size()));
        }
      }
      if (const auto departed = client_->try_get(kDepartedKey)) {
        std::string_view rest(departed->data(), departed->size());
        for (size_t end = rest.find('\n'); end != std::string_view::npos; end = rest.find('\n')) {
          found += str_cat("; ", rest.substr(0, end), " has exited");
          rest.remove_prefix(end + 1);
        }
      }
      if (!found.empty() || Clock::now() >= until) return found;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error&) {
    return "; rank 0's bootstrap store is gone too (rank 0 has exited)";
  }
}

void GlooCommunicator::alltoallv_bytes(const void* in, std::span<const int64_t> send_elements, void* out,
                                       std::span<const int64_t> recv_elements, DType dtype) {
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    gloo::AlltoallvOptions options(context_);
    options.setInput(static_cast<T*>(const_cast<void*>(in)),
                     std::vector<int64_t>(send_elements.begin(), send_elements.end()));
    options.setOutput(static_cast<T*>(out), std::vector<int64_t>(recv_elements.begin(), recv_elements.end()));
    options.setTimeout(timeout_);
    gloo::alltoallv(options);
  });
}

// Block p of the elements is summed on rank p in rank order (an all-to-all of the blocks), then every rank gathers
// every block, as the MPI communicator does.
void GlooCommunicator::all_reduce(TensorView inout) {
  constexpr const char* kName = "all_reduce";
  std::lock_guard lock(mutex_);
  check_host_view(inout, "gloo", kName, "inout");
  const int64_t count = inout.numel();
  if (count == 0) return;
  const size_t element_bytes = dtype_size(inout.dtype);
  std::vector<int64_t> counts(static_cast<size_t>(size_));
  std::vector<int64_t> offsets(static_cast<size_t>(size_));
  int64_t next = 0;
  for (int32_t p = 0; p < size_; ++p) {  // near-equal blocks, the first count % size one element longer
    counts[p] = count / size_ + (p < count % size_ ? 1 : 0);
    offsets[p] = next;
    next += counts[p];
  }
  const int64_t mine = counts[rank_];
  const std::vector<int64_t> recv_counts(static_cast<size_t>(size_), mine);
  scratch_.resize(static_cast<size_t>(size_ * mine) * element_bytes);
  block_.resize(static_cast<size_t>(mine) * element_bytes);
  run(kName, [&] {
    alltoallv_bytes(inout.data, counts, scratch_.data(), recv_counts, inout.dtype);
    sum_blocks_in_rank_order(scratch_.data(), size_, mine, inout.dtype, block_.data());
    with_element_type(inout.dtype, [&](auto element) {
      using T = decltype(element);
      gloo::AllgathervOptions options(context_);
      options.setInput(reinterpret_cast<T*>(block_.data()), static_cast<size_t>(mine));
      options.setOutput(static_cast<T*>(inout.data), std::vector<size_t>(counts.begin(), counts.end()));
      options.setTimeout(timeout_);
      gloo::allgatherv(options);
    });
  });
}

void GlooCommunicator::all_gather(ConstTensorView in, TensorView out) {
  constexpr const char* kName = "all_gather";
  std::lock_guard lock(mutex_);
  check_all_gather("gloo", in, out, size_);
  if (in.numel() == 0) return;
  run(kName, [&] {
    with_element_type(in.dtype, [&](auto element) {
      using T = decltype(element);
      gloo::AllgatherOptions options(context_);
      options.setInput(static_cast<T*>(const_cast<void*>(in.data)), static_cast<size_t>(in.numel()));
      options.setOutput(static_cast<T*>(out.data), static_cast<size_t>(out.numel()));
      options.setTimeout(timeout_);
      gloo::allgather(options);
    });
  });
}

// Rank p's rows of every rank's `in` go to rank p, which sums them in rank order.
void GlooCommunicator::reduce_scatter(ConstTensorView in, TensorView out) {
  constexpr const char* kName = "reduce_scatter";
  std::lock_guard lock(mutex_);
  check_reduce_scatter("gloo", in, out, size_);
  const int64_t count = out.numel();
  if (count == 0) return;
  const std::vector<int64_t> blocks(static_cast<size_t>(size_), count);
  scratch_.resize(static_cast<size_t>(size_ * count) * dtype_size(in.dtype));
  run(kName, [&] {
    alltoallv_bytes(in.data, blocks, scratch_.data(), blocks, in.dtype);
    sum_blocks_in_rank_order(scratch_.data(), size_, count, in.dtype, out.data);
  });
}

void GlooCommunicator::all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                                  std::span<const int64_t> recv_rows) {
  constexpr const char* kName = "all_to_all";
  std::lock_guard lock(mutex_);
  check_all_to_all("gloo", in, send_rows, out, recv_rows, size_);
  const int64_t row_elems = row_elements(in.shape);
  std::vector<int64_t> send_elements(static_cast<size_t>(size_));
  std::vector<int64_t> recv_elements(static_cast<size_t>(size_));
  for (int32_t p = 0; p < size_; ++p) {
    send_elements[p] = send_rows[p] * row_elems;
    recv_elements[p] = recv_rows[p] * row_elems;
  }
  if (row_elems == 0) return;  // rows of no elements, on every rank (the row shape is the group's)
  run(kName, [&] { alltoallv_bytes(in.data, send_elements, out.data, recv_elements, in.dtype); });
}

// The size first (the other ranks do not know it), then the words.
void GlooCommunicator::broadcast(std::vector<int32_t>& words, int32_t root) {
  constexpr const char* kName = "broadcast";
  std::lock_guard lock(mutex_);
  DI_CHECK(root >= 0 && root < size_, "gloo broadcast: root ", root, " is not a rank of ", size_);
  run(kName, [&] {
    int64_t count = rank_ == root ? static_cast<int64_t>(words.size()) : 0;
    gloo::BroadcastOptions size_options(context_);
    size_options.setOutput(&count, 1);
    size_options.setRoot(root);
    size_options.setTimeout(timeout_);
    gloo::broadcast(size_options);
    if (rank_ != root) words.resize(static_cast<size_t>(count));
    if (count == 0) return;
    gloo::BroadcastOptions options(context_);
    options.setOutput(words.data(), words.size());
    options.setRoot(root);
    options.setTimeout(timeout_);
    gloo::broadcast(options);
  });
}

void GlooCommunicator::all_reduce_host(std::span<int64_t> values, HostReduce op) {
  constexpr const char* kName = "all_reduce_host";
  std::lock_guard lock(mutex_);
  if (values.empty()) return;
  using Reduce = void (*)(void*, const void*, const void*, size_t);
  const Reduce reduce = op == HostReduce::kSum   ? static_cast<Reduce>(&gloo::sum<int64_t>)
                        : op == HostReduce::kMin ? static_cast<Reduce>(&gloo::min<int64_t>)
                                                 : static_cast<Reduce>(&gloo::max<int64_t>);
  run(kName, [&] {
    gloo::AllreduceOptions options(context_);
    options.setOutput(values.data(), values.size());
    options.setReduceFunction(reduce);
    options.setTimeout(timeout_);
    gloo::allreduce(options);
  });
}

void GlooCommunicator::barrier() {
  std::lock_guard lock(mutex_);
  run("barrier", [&] {
    gloo::BarrierOptions options(context_);
    options.setTimeout(timeout_);
    gloo::barrier(options);
  });
}

// No lock: abort may come while another thread waits in a collective; closing the connections ends that wait too.
// The reason goes to the store first, where the others' failure messages read it.
void GlooCommunicator::abort(const std::string& reason) {
  std::fputs(str_cat("deepinfer: ", where(), " aborts: ", reason, "\n").c_str(), stderr);
  std::fflush(stderr);
  try {
    std::lock_guard lock(store_mutex_);
    client_->set(str_cat("deepinfer/failure/", rank_), std::span(reason.data(), std::min<size_t>(reason.size(), 4096)));
  } catch (const Error&) {
    // rank 0 is gone: the others learn of the failure from their connections alone
  }
  if (!closed_.exchange(true)) context_->closeConnections();
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(int32_t rank, int32_t size, const std::string& init_addr,
                                                     std::chrono::milliseconds timeout) {
  DI_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "gloo: rank ", rank, " of ", size, " ranks");
  DI_CHECK_ARG(timeout.count() > 0, "gloo: the timeout must be positive, got ", timeout.count(), " ms");
  return std::make_unique<GlooCommunicator>(rank, size, parse_host_port(init_addr), timeout);
}

}  // namespace deepinfer
