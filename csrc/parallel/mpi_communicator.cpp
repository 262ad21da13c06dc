// The MPI communicator (see mpi_communicator.h). Every collective posts MPI's non-blocking form and polls it against
// the group's timeout: MPI's blocking calls have no timeout and would wait forever for a rank that never comes.
#include "parallel/mpi_communicator.h"

#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/host_views.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

// A decode step's collectives complete in microseconds: spin on MPI_Test first, then yield, then sleep, because the
// ranks of a CPU run often share cores and a spinning rank slows the one it waits for.
constexpr int64_t kSpinPolls = 2000;
constexpr auto kYieldFor = std::chrono::milliseconds(20);
constexpr auto kSleep = std::chrono::microseconds(100);

// MPI for the whole process: initialized by the first communicator, finalized when the process exits (this is a
// function-local static, destroyed after main returns and after every communicator made before it).
class MpiProcess {
 public:
  static MpiProcess& get() {
    static MpiProcess process;
    return process;
  }

  // A rank with a timed-out collective still has it posted: MPI_Finalize would wait for the ranks that never joined
  // it, so the process then ends the job instead of finalizing.
  void mark_failed() { failed_.store(true); }

  MpiProcess(const MpiProcess&) = delete;
  MpiProcess& operator=(const MpiProcess&) = delete;

 private:
  MpiProcess() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);  // someone else in the process (mpi4py) initialized it, and will finalize it
    } else {
      // The communicator may be made on one thread and used on the engine's step thread, and abort() may come from
      // a third: MULTIPLE allows that. SERIALIZED is enough for the collectives, which the communicator serializes.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        throw CollectiveError("MPI_Init_thread failed");
      }
      owns_ = true;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw CollectiveError(str_cat("MPI provides thread level ", provided,
                                    " below MPI_THREAD_SERIALIZED, which the engine's step thread needs"));
    }
  }

  ~MpiProcess() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owns_ || finalized) return;
    if (failed_.load()) {
      std::fputs("deepinfer: a collective failed in this process; ending the job instead of finalizing MPI\n", stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  }

  bool owns_ = false;
  std::atomic<bool> failed_{false};
};

MPI_Datatype element_type(DType dtype) { return dtype == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

// MPI counts and displacements are int.
int to_count(int64_t count, const char* collective) {
  DI_CHECK(count >= 0 && count <= INT_MAX, "mpi ", collective, ": count ", count, " does not fit an MPI int count");
  return static_cast<int>(count);
}

// A committed contiguous datatype of one row, so that counts and displacements are in rows (they stay within int).
class RowType {
 public:
  RowType(MPI_Datatype element, int64_t row_elements, const char* collective) {
    MPI_Type_contiguous(to_count(row_elements, collective), element, &type_);
    MPI_Type_commit(&type_);
  }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  // Freeing a type that a posted operation uses is allowed: MPI keeps it until the operation is done.
  ~RowType() { MPI_Type_free(&type_); }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::chrono::milliseconds timeout);
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override;

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  std::string_view name() const override { return "mpi"; }

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
  Clock::time_point deadline() const;
  // Throws CollectiveError when an earlier collective failed: the group is out of step from then on.
  void check_usable(const char* collective) const;
  // Throws CollectiveError for an MPI error code, and marks the communicator failed.
  void check_mpi(int code, const char* collective);
  // Polls `request` until it completes; past `deadline`, marks the communicator failed and throws CollectiveError.
  void wait(MPI_Request& request, const char* collective, Clock::time_point deadline);
  [[noreturn]] void fail(std::string message);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int32_t rank_ = 0;
  int32_t size_ = 1;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one collective at a time, in the order the calls arrive (MPI_THREAD_SERIALIZED)
  // Receive space of the sums. A member, not a local: a timed-out collective stays posted with it as its target.
  std::vector<std::byte> scratch_;
  std::string failure_;  // non-empty once a collective failed
};

MpiCommunicator::MpiCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {
  DI_CHECK_ARG(timeout.count() > 0, "the MPI communicator's timeout must be positive, got ", timeout.count(), " ms");
  MpiProcess::get();
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  rank_ = rank;
  size_ = size;
  // A duplicate, so the engine's collectives never match messages of other code in the process using the world.
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request), "communicator creation");
  wait(request, "communicator creation", deadline());
  // Errors come back as codes, so that they become CollectiveError with the rank instead of ending the process.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || comm_ == MPI_COMM_NULL) return;
  if (!failure_.empty()) {
    // The failed collective is still posted and the other ranks are out of step: the job cannot go on.
    std::fputs(str_cat("deepinfer: ", where(), " ends the job: ", failure_, "\n").c_str(), stderr);
    MPI_Abort(comm_, 1);
  }
  MPI_Comm_free(&comm_);
}

Clock::time_point MpiCommunicator::deadline() const {
  const auto now = Clock::now();
  const auto longest = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout_ >= longest ? Clock::time_point::max() : now + timeout_;
}

void MpiCommunicator::check_usable(const char* collective) const {
  if (!failure_.empty()) {
    throw CollectiveError(str_cat(where(), ": ", collective, " after an earlier failure: ", failure_));
  }
}

void MpiCommunicator::fail(std::string message) {
  failure_ = std::move(message);
  MpiProcess::get().mark_failed();
  throw CollectiveError(failure_);
}

void MpiCommunicator::check_mpi(int code, const char* collective) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(str_cat(where(), ": ", collective, " failed in MPI: ", std::string_view(text, static_cast<size_t>(length))));
}

void MpiCommunicator::wait(MPI_Request& request, const char* collective, Clock::time_point deadline) {
  const auto start = Clock::now();
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), collective);
    if (done) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      fail(str_cat(where(), ": ", collective, " did not complete within the timeout of ", timeout_.count(),
                   " ms (another rank did not join it, or failed before it); the communicator is unusable and the "
                   "job must end (abort)"));
    }
    if (polls < kSpinPolls) continue;
    if (now - start < kYieldFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }
}

// Block p of the elements is summed on rank p in rank order (an all-to-all of the blocks), then every rank gathers
// every block: the traffic of MPI's own reduce-scatter + all-gather, with the sum's order fixed here.
void MpiCommunicator::all_reduce(TensorView inout) {
  constexpr const char* kName = "all_reduce";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  check_host_view(inout, "mpi", kName, "inout");
  const int64_t count = inout.numel();
  if (count == 0) return;
  const auto until = deadline();
  const MPI_Datatype type = element_type(inout.dtype);
  const size_t element_bytes = dtype_size(inout.dtype);
  std::vector<int> counts(static_cast<size_t>(size_));
  std::vector<int> offsets(static_cast<size_t>(size_));
  int64_t next = 0;
  for (int32_t p = 0; p < size_; ++p) {  // near-equal blocks, the first count % size one element longer
    counts[p] = to_count(count / size_ + (p < count % size_ ? 1 : 0), kName);
    offsets[p] = to_count(next, kName);
    next += counts[p];
  }
  const int mine = counts[rank_];
  std::vector<int> recv_counts(static_cast<size_t>(size_), mine);
  std::vector<int> recv_offsets(static_cast<size_t>(size_));
  for (int32_t p = 0; p < size_; ++p) recv_offsets[p] = to_count(int64_t{p} * mine, kName);
  scratch_.resize(static_cast<size_t>(size_) * static_cast<size_t>(mine) * element_bytes);

  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(inout.data, counts.data(), offsets.data(), type, scratch_.data(), recv_counts.data(),
                           recv_offsets.data(), type, comm_, &request),
            kName);
  wait(request, kName, until);
  std::byte* my_block = static_cast<std::byte*>(inout.data) + static_cast<size_t>(offsets[rank_]) * element_bytes;
  sum_blocks_in_rank_order(scratch_.data(), size_, mine, inout.dtype, my_block);
  check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, inout.data, counts.data(), offsets.data(), type,
                            comm_, &request),
            kName);
  wait(request, kName, until);
}

void MpiCommunicator::all_gather(ConstTensorView in, TensorView out) {
  constexpr const char* kName = "all_gather";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  check_all_gather("mpi", in, out, size_);
  if (in.numel() == 0) return;
  const auto until = deadline();
  const RowType row(element_type(in.dtype), row_elements(in.shape), kName);
  const int rows = to_count(in.shape[0], kName);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in.data, rows, row.get(), out.data, rows, row.get(), comm_, &request), kName);
  wait(request, kName, until);
}

// Rank p's rows of every rank's `in` go to rank p, which sums them in rank order.
void MpiCommunicator::reduce_scatter(ConstTensorView in, TensorView out) {
  constexpr const char* kName = "reduce_scatter";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  check_reduce_scatter("mpi", in, out, size_);
  const int64_t count = out.numel();
  if (count == 0) return;
  const auto until = deadline();
  const MPI_Datatype type = element_type(in.dtype);
  scratch_.resize(static_cast<size_t>(size_) * static_cast<size_t>(count) * dtype_size(in.dtype));
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoall(in.data, to_count(count, kName), type, scratch_.data(), to_count(count, kName), type, comm_,
                          &request),
            kName);
  wait(request, kName, until);
  sum_blocks_in_rank_order(scratch_.data(), size_, count, in.dtype, out.data);
}

void MpiCommunicator::all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                                 std::span<const int64_t> recv_rows) {
  constexpr const char* kName = "all_to_all";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  check_all_to_all("mpi", in, send_rows, out, recv_rows, size_);
  std::vector<int> send_counts(static_cast<size_t>(size_));
  std::vector<int> recv_counts(static_cast<size_t>(size_));
  for (int32_t p = 0; p < size_; ++p) {
    send_counts[p] = to_count(send_rows[p], kName);
    recv_counts[p] = to_count(recv_rows[p], kName);
  }
  const int64_t row_elems = row_elements(in.shape);
  if (row_elems == 0) return;  // rows of no elements, on every rank (the row shape is the group's)
  const auto until = deadline();
  std::vector<int> send_offsets(static_cast<size_t>(size_));
  std::vector<int> recv_offsets(static_cast<size_t>(size_));
  const std::vector<int64_t> send_starts = row_offsets(send_rows);
  const std::vector<int64_t> recv_starts = row_offsets(recv_rows);
  for (int32_t p = 0; p < size_; ++p) {
    send_offsets[p] = to_count(send_starts[p], kName);
    recv_offsets[p] = to_count(recv_starts[p], kName);
  }
  const RowType row(element_type(in.dtype), row_elems, kName);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(in.data, send_counts.data(), send_offsets.data(), row.get(), out.data, recv_counts.data(),
                           recv_offsets.data(), row.get(), comm_, &request),
            kName);
  wait(request, kName, until);
}

// The size first (the other ranks do not know it), then the words.
void MpiCommunicator::broadcast(std::vector<int32_t>& words, int32_t root) {
  constexpr const char* kName = "broadcast";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  DI_CHECK(root >= 0 && root < size_, "mpi broadcast: root ", root, " is not a rank of ", size_);
  const auto until = deadline();
  int64_t count = rank_ == root ? static_cast<int64_t>(words.size()) : 0;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibcast(&count, 1, MPI_INT64_T, root, comm_, &request), kName);
  wait(request, kName, until);
  const int count_words = to_count(count, kName);  // after the size is known, so every rank throws alike
  if (rank_ != root) words.resize(static_cast<size_t>(count));
  if (count == 0) return;
  check_mpi(MPI_Ibcast(words.data(), count_words, MPI_INT32_T, root, comm_, &request), kName);
  wait(request, kName, until);
}

void MpiCommunicator::all_reduce_host(std::span<int64_t> values, HostReduce op) {
  constexpr const char* kName = "all_reduce_host";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  if (values.empty()) return;
  const auto until = deadline();
  const MPI_Op mpi_op = op == HostReduce::kSum ? MPI_SUM : op == HostReduce::kMin ? MPI_MIN : MPI_MAX;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), to_count(static_cast<int64_t>(values.size()), kName),
                           MPI_INT64_T, mpi_op, comm_, &request),
            kName);
  wait(request, kName, until);
}

void MpiCommunicator::barrier() {
  constexpr const char* kName = "barrier";
  std::lock_guard lock(mutex_);
  check_usable(kName);
  const auto until = deadline();
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &request), kName);
  wait(request, kName, until);
}

// No lock: abort may come while another thread waits in a collective. MPI_Abort makes the launcher kill every rank
// of the job (and exit non-zero): that is how the other ranks learn of the failure.
void MpiCommunicator::abort(const std::string& reason) {
  std::fputs(str_cat("deepinfer: ", where(), " aborts the job: ", reason, "\n").c_str(), stderr);
  std::fflush(stderr);
  MPI_Abort(comm_, 1);
  throw CollectiveError(str_cat(where(), ": MPI_Abort returned after: ", reason));
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(std::chrono::milliseconds timeout) {
  return std::make_unique<MpiCommunicator>(timeout);
}

}  // namespace deepinfer
