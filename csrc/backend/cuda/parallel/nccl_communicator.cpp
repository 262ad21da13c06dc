#include "backend/cuda/parallel/nccl_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/context.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/launch_ledger.h"
#include "core/host_port.h"

namespace deepinfer {
namespace cuda {

NcclComm::NcclComm(NcclComm&& other) noexcept
    : lib_(std::exchange(other.lib_, nullptr)), handle_(std::exchange(other.handle_, nullptr)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    reset();
    lib_ = std::exchange(other.lib_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

NcclComm::~NcclComm() { reset(); }

NcclResult NcclComm::async_error() const {
  if (handle_ == nullptr) return NcclResult::kInvalidUsage;
  NcclResult state = NcclResult::kSuccess;
  const NcclResult status = lib_->comm_get_async_error(handle_, &state);
  return status == NcclResult::kSuccess ? state : status;
}

void NcclComm::abort() noexcept {
  if (handle_ == nullptr) return;
  lib_->comm_abort(std::exchange(handle_, nullptr));
}

void NcclComm::reset() noexcept {
  if (handle_ == nullptr) return;
  if (async_error() == NcclResult::kSuccess) {
    lib_->comm_destroy(std::exchange(handle_, nullptr));
  } else {
    abort();
  }
}

}  // namespace cuda

namespace {

using Clock = std::chrono::steady_clock;
using cuda::NcclDataType;
using cuda::NcclRedOp;
using cuda::NcclResult;

// Until when a wait may go on, and how it pauses between polls: spinning first (a host collective of a healthy group
// completes in microseconds, which a sleep would round up), then sleeping so a long wait leaves the core alone.
class Deadline {
 public:
  explicit Deadline(std::chrono::seconds timeout) : end_(Clock::now() + timeout) {}
  bool passed() const { return Clock::now() >= end_; }
  void pause() {
    if (++polls_ < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  static constexpr int kSpinPolls = 2000;
  Clock::time_point end_;
  int polls_ = 0;
};

NcclDataType device_type(DType dtype, const char* collective) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "nccl ", collective, ": float32 or bfloat16 views, not ",
           dtype_name(dtype));
  return dtype == DType::kF32 ? NcclDataType::kFloat32 : NcclDataType::kBfloat16;
}

void check_device_view(const ConstTensorView& v, const char* collective) {
  DI_CHECK(v.device == Device::kCuda, "nccl ", collective, ": the views must be on the GPU");
  DI_CHECK(v.data != nullptr || v.numel() == 0, "nccl ", collective, ": a view without memory");
}

// Elements in one row (dimension 0) of `shape`.
int64_t row_elements(const Shape& shape) {
  int64_t n = 1;
  for (int d = 1; d < shape.ndim(); ++d) n *= shape[d];
  return n;
}

NcclRedOp host_op(HostReduce op) {
  switch (op) {
    case HostReduce::kSum: return NcclRedOp::kSum;
    case HostReduce::kMin: return NcclRedOp::kMin;
    case HostReduce::kMax: return NcclRedOp::kMax;
  }
  return NcclRedOp::kSum;
}

const char* const kBroadcast = "broadcast";
const char* const kAllReduceHost = "all_reduce_host";
const char* const kBarrier = "barrier";

class NcclCommunicator final : public Communicator {
 public:
  // `host` is null for ranks whose host collectives go through NCCL. Initializes the NCCL communicator (collective).
  NcclCommunicator(cuda::CudaContext& ctx, Communicator* host, int32_t rank, int32_t size,
                   const cuda::NcclUniqueId& id, std::chrono::seconds timeout)
      : lib_(cuda::nccl_library()), ctx_(ctx), host_(host), rank_(rank), size_(size), timeout_(timeout) {
    int current = -1;
    int stream_device = -1;
    CUDA_TRY(cudaGetDevice(&current));
    CUDA_TRY(cudaStreamGetDevice(ctx_.stream(), &stream_device));
    DI_CHECK(current == stream_device, "nccl rank ", rank_, ": the current device is ", current,
             ", the backend's is ", stream_device, ": make the communicator from the backend's thread");
    cuda::NcclConfigHead config;
    config.blocking = 0;  // so that init, like every later call, is polled with the timeout
    cuda::NcclCommHandle handle = nullptr;
    const NcclResult status = lib_.comm_init_rank_config(&handle, size_, id, rank_, &config);
    comm_ = cuda::NcclComm(lib_, handle);
    if (handle == nullptr) fail("init", lib_.describe(status));
    settle(status, "init");
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  std::string_view name() const override { return "nccl"; }

  void all_reduce(TensorView inout) override {
    constexpr const char* kWhat = "all_reduce";
    check_device_view(inout, kWhat);
    const NcclDataType type = device_type(inout.dtype, kWhat);
    check_usable(kWhat);
    if (inout.numel() == 0) return;
    const auto timed = ctx_.timed("nccl_all_reduce");
    settle(lib_.all_reduce(inout.data, inout.data, static_cast<size_t>(inout.numel()), type, NcclRedOp::kSum,
                           comm_.get(), ctx_.stream()),
           kWhat);
    ctx_.ledger().library_work(cuda::OpAccesses::exactly({{cuda::Region::of(inout), cuda::Touch::kWrite}}));
  }

  void all_gather(ConstTensorView in, TensorView out) override {
    constexpr const char* kWhat = "all_gather";
    check_device_view(in, kWhat);
    check_device_view(out, kWhat);
    const NcclDataType type = device_type(in.dtype, kWhat);
    DI_CHECK(out.dtype == in.dtype, "nccl all_gather: in is ", dtype_name(in.dtype), ", out ", dtype_name(out.dtype));
    DI_CHECK(in.shape.ndim() >= 1 && out.shape.ndim() == in.shape.ndim() && out.shape[0] == size_ * in.shape[0] &&
                 row_elements(out.shape) == row_elements(in.shape),
             "nccl all_gather: out ", out.shape.str(), " must stack ", size_, " ranks' in ", in.shape.str());
    check_usable(kWhat);
    if (in.numel() == 0) return;
    const auto timed = ctx_.timed("nccl_all_gather");
    settle(lib_.all_gather(in.data, out.data, static_cast<size_t>(in.numel()), type, comm_.get(), ctx_.stream()),
           kWhat);
    ctx_.ledger().library_work(cuda::OpAccesses::exactly(
        {{cuda::Region::of(in), cuda::Touch::kRead}, {cuda::Region::of(out), cuda::Touch::kWrite}}));
  }

  void reduce_scatter(ConstTensorView in, TensorView out) override {
    constexpr const char* kWhat = "reduce_scatter";
    check_device_view(in, kWhat);
    check_device_view(out, kWhat);
    const NcclDataType type = device_type(in.dtype, kWhat);
    DI_CHECK(out.dtype == in.dtype, "nccl reduce_scatter: in is ", dtype_name(in.dtype), ", out ",
             dtype_name(out.dtype));
    DI_CHECK(in.shape.ndim() >= 1 && out.shape.ndim() == in.shape.ndim() && in.shape[0] == size_ * out.shape[0] &&
                 row_elements(out.shape) == row_elements(in.shape),
             "nccl reduce_scatter: in ", in.shape.str(), " must hold ", size_, " ranks' out ", out.shape.str());
    check_usable(kWhat);
    if (out.numel() == 0) return;
    const auto timed = ctx_.timed("nccl_reduce_scatter");
    settle(lib_.reduce_scatter(in.data, out.data, static_cast<size_t>(out.numel()), type, NcclRedOp::kSum,
                               comm_.get(), ctx_.stream()),
           kWhat);
    ctx_.ledger().library_work(cuda::OpAccesses::exactly(
        {{cuda::Region::of(in), cuda::Touch::kRead}, {cuda::Region::of(out), cuda::Touch::kWrite}}));
  }

  void all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                  std::span<const int64_t> recv_rows) override {
    constexpr const char* kWhat = "all_to_all";
    check_device_view(in, kWhat);
    check_device_view(out, kWhat);
    const NcclDataType type = device_type(in.dtype, kWhat);
    DI_CHECK(out.dtype == in.dtype, "nccl all_to_all: in is ", dtype_name(in.dtype), ", out ", dtype_name(out.dtype));
    DI_CHECK(in.shape.ndim() >= 1 && out.shape.ndim() == in.shape.ndim() &&
                 row_elements(out.shape) == row_elements(in.shape),
             "nccl all_to_all: rows of in ", in.shape.str(), " and out ", out.shape.str(), " differ");
    DI_CHECK(send_rows.size() == static_cast<size_t>(size_) && recv_rows.size() == static_cast<size_t>(size_),
             "nccl all_to_all: ", send_rows.size(), " send and ", recv_rows.size(), " receive counts for ", size_,
             " ranks");
    int64_t sent = 0;
    int64_t received = 0;
    for (int32_t p = 0; p < size_; ++p) {
      DI_CHECK(send_rows[p] >= 0 && recv_rows[p] >= 0, "nccl all_to_all: negative row count for rank ", p);
      sent += send_rows[p];
      received += recv_rows[p];
    }
    DI_CHECK(sent == in.shape[0] && received == out.shape[0], "nccl all_to_all: ", sent, " rows sent from in ",
             in.shape.str(), ", ", received, " received into out ", out.shape.str());
    check_usable(kWhat);
    const int64_t row = row_elements(in.shape);
    if (row == 0 || (sent == 0 && received == 0)) return;
    const size_t row_bytes = static_cast<size_t>(row) * dtype_size(in.dtype);
    const auto timed = ctx_.timed("nccl_all_to_all");
    // One group: NCCL matches each pair's send and receive, in any order, and runs them together (a rank's rows to
    // itself included), so no pair waits for another.
    settle(lib_.group_start(), kWhat);
    NcclResult status = NcclResult::kSuccess;
    int64_t send_offset = 0;
    int64_t recv_offset = 0;
    for (int32_t p = 0; p < size_ && status == NcclResult::kSuccess; ++p) {
      if (send_rows[p] > 0) {
        status = lib_.send(static_cast<const char*>(in.data) + static_cast<size_t>(send_offset) * row_bytes,
                           static_cast<size_t>(send_rows[p] * row), type, p, comm_.get(), ctx_.stream());
      }
      if (status == NcclResult::kSuccess && recv_rows[p] > 0) {
        status = lib_.recv(static_cast<char*>(out.data) + static_cast<size_t>(recv_offset) * row_bytes,
                           static_cast<size_t>(recv_rows[p] * row), type, p, comm_.get(), ctx_.stream());
      }
      send_offset += send_rows[p];
      recv_offset += recv_rows[p];
    }
    const NcclResult ended = lib_.group_end();  // always, so that a failed call does not leave the group open
    settle(status, kWhat);
    settle(ended, kWhat);
    ctx_.ledger().library_work(cuda::OpAccesses::exactly(
        {{cuda::Region::of(in), cuda::Touch::kRead}, {cuda::Region::of(out), cuda::Touch::kWrite}}));
  }

  void broadcast(std::vector<int32_t>& words, int32_t root) override {
    DI_CHECK(root >= 0 && root < size_, "nccl broadcast: root ", root, " of ", size_, " ranks");
    check_usable(kBroadcast);
    if (host_ != nullptr) {
      host_->broadcast(words, root);
      return;
    }
    // The count first, so that every rank can size its words.
    int64_t count = rank_ == root ? static_cast<int64_t>(words.size()) : 0;
    through_device(&count, sizeof count, kBroadcast, [&](void* data) {
      return lib_.broadcast(data, data, sizeof count, NcclDataType::kUint8, root, comm_.get(), ctx_.stream());
    });
    DI_CHECK(count >= 0, "nccl broadcast: rank ", root, " sent a negative count");
    words.resize(static_cast<size_t>(count));
    if (count == 0) return;
    const size_t bytes = words.size() * sizeof(int32_t);
    through_device(words.data(), bytes, kBroadcast, [&](void* data) {
      return lib_.broadcast(data, data, bytes, NcclDataType::kUint8, root, comm_.get(), ctx_.stream());
    });
  }

  void all_reduce_host(std::span<int64_t> values, HostReduce op) override {
    check_usable(kAllReduceHost);
    if (host_ != nullptr) {
      host_->all_reduce_host(values, op);
      return;
    }
    if (values.empty()) return;
    through_device(values.data(), values.size_bytes(), kAllReduceHost, [&](void* data) {
      return lib_.all_reduce(data, data, values.size(), NcclDataType::kInt64, host_op(op), comm_.get(),
                             ctx_.stream());
    });
  }

  void barrier() override {
    check_usable(kBarrier);
    if (host_ != nullptr) {
      host_->barrier();
      return;
    }
    int64_t one = 1;
    through_device(&one, sizeof one, kBarrier, [&](void* data) {
      return lib_.all_reduce(data, data, 1, NcclDataType::kInt64, NcclRedOp::kSum, comm_.get(), ctx_.stream());
    });
  }

  void abort(const std::string& reason) override {
    if (failure_.empty()) failure_ = str_cat("rank ", rank_, " aborted: ", reason);
    // The host carries the reason to the other ranks; NCCL's abort only makes their device collectives fail.
    if (host_ != nullptr) host_->abort(reason);
    comm_.abort();
  }

 private:
  // Throws when the communicator has failed or NCCL has seen an error since the last call.
  void check_usable(const char* collective) {
    if (!failure_.empty()) {
      throw CollectiveError(str_cat("nccl rank ", rank_, " of ", size_, ": ", collective,
                                    " on a communicator that failed: ", failure_));
    }
    const NcclResult state = comm_.async_error();
    if (state != NcclResult::kSuccess && state != NcclResult::kInProgress) fail(collective, lib_.describe(state));
  }

  // A call's status: done, or still running (non-blocking), which is polled until it is done or the timeout passes.
  // Polling is on the host only, so it holds while a graph is recorded.
  void settle(NcclResult status, const char* collective) {
    if (status == NcclResult::kSuccess) return;
    if (status != NcclResult::kInProgress) fail(collective, lib_.describe(status));
    Deadline deadline(timeout_);
    for (;;) {
      const NcclResult state = comm_.async_error();
      if (state == NcclResult::kSuccess) return;
      if (state != NcclResult::kInProgress) fail(collective, lib_.describe(state));
      if (deadline.passed()) fail(collective, str_cat("not done after ", timeout_.count(), " s"));
      deadline.pause();
    }
  }

  // Waits for the work queued on the stream, watching NCCL for an error on the way.
  void wait_stream(const char* collective) {
    Deadline deadline(timeout_);
    for (;;) {
      const cudaError_t queued = cudaStreamQuery(ctx_.stream());
      if (queued == cudaSuccess) break;
      if (queued != cudaErrorNotReady) fail(collective, str_cat("CUDA: ", cudaGetErrorString(queued)));
      const NcclResult state = comm_.async_error();
      if (state != NcclResult::kSuccess && state != NcclResult::kInProgress) fail(collective, lib_.describe(state));
      if (deadline.passed()) fail(collective, str_cat("not done after ", timeout_.count(), " s"));
      deadline.pause();
    }
    ctx_.ledger().serialized();
  }

  // Marks the communicator failed, aborts NCCL (the other ranks' collectives then fail) and the host (which tells
  // them why), and throws.
  [[noreturn]] void fail(const char* collective, const std::string& why) {
    failure_ = str_cat("nccl rank ", rank_, " of ", size_, ": ", collective, " failed: ", why);
    comm_.abort();
    if (host_ != nullptr) {
      try {
        host_->abort(failure_);
      } catch (const Error&) {
        // The host may have failed already; the error this rank reports is the one below.
      }
    }
    throw CollectiveError(failure_);
  }

  // A host collective through NCCL: `bytes` at `values` go to the device buffer, `call(device_data)` runs NCCL on
  // it in place, and the result comes back into `values` once the stream is done.
  template <typename Call>
  void through_device(void* values, size_t bytes, const char* collective, const Call& call) {
    reserve(bytes);
    void* device = device_buffer_.view().data;
    void* pinned = host_buffer_.view().data;
    std::memcpy(pinned, values, bytes);
    CUDA_TRY(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.ledger().serialized();
    settle(call(device), collective);
    ctx_.ledger().library_work(cuda::OpAccesses::any());
    CUDA_TRY(cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    wait_stream(collective);
    std::memcpy(values, pinned, bytes);
  }

  // Grows the buffers of through_device to at least `bytes` (page-locked on the host, so the copy back is queued
  // like the rest and the wait can watch it).
  void reserve(size_t bytes) {
    const auto words = static_cast<int64_t>((bytes + sizeof(int64_t) - 1) / sizeof(int64_t));
    if (device_buffer_.numel() >= words) return;
    const int64_t capacity = std::max<int64_t>(words, 64);
    device_buffer_ = ctx_.empty({capacity}, DType::kI64);
    host_buffer_ = ctx_.staging({capacity}, DType::kI64);
  }

  const cuda::NcclLibrary& lib_;
  cuda::CudaContext& ctx_;
  Communicator* host_;
  int32_t rank_;
  int32_t size_;
  std::chrono::seconds timeout_;
  std::string failure_;  // why this communicator can no longer be used; empty while it can
  Tensor device_buffer_;
  Tensor host_buffer_;
  cuda::NcclComm comm_;  // declared last, destroyed first: nothing of NCCL's may still use the buffers above
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend, Communicator& host,
                                                     std::chrono::seconds timeout) {
  cuda::CudaContext& ctx = cuda_context_of(cuda_backend);
  const int32_t rank = host.rank();
  const int32_t size = host.size();
  std::vector<int32_t> words;
  try {
    const cuda::NcclLibrary& lib = cuda::nccl_library();
    if (rank == 0) {
      cuda::NcclUniqueId id;
      const NcclResult status = lib.get_unique_id(&id);
      if (status != NcclResult::kSuccess) {
        throw CollectiveError(str_cat("nccl rank 0: ncclGetUniqueId failed: ", lib.describe(status)));
      }
      words = cuda::unique_id_to_words(id);
    }
  } catch (const Error& e) {
    // A rank without NCCL (or rank 0 without an id) tells the others, which would otherwise wait in the broadcast
    // below until the host's timeout.
    host.abort(e.what());
    throw;
  }
  host.broadcast(words, 0);
  return std::make_unique<NcclCommunicator>(ctx, &host, rank, size, cuda::unique_id_from_words(words), timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend, int32_t rank, int32_t size,
                                                     const std::string& init_addr, std::chrono::seconds timeout) {
  DI_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "nccl: rank ", rank, " of ", size, " ranks");
  try {
    (void)parse_host_port(init_addr);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(str_cat("nccl: the init address: ", e.what()));
  }
  cuda::CudaContext& ctx = cuda_context_of(cuda_backend);
  const cuda::NcclLibrary& lib = cuda::nccl_library();
  // With NCCL_COMM_ID set, ncclGetUniqueId encodes that address instead of starting a listener, so every rank gets
  // the same id without exchanging it, and rank 0's init listens there. NCCL reads it again during init, so it stays.
  DI_CHECK(::setenv("NCCL_COMM_ID", init_addr.c_str(), 1) == 0, "nccl: cannot set NCCL_COMM_ID");
  cuda::NcclUniqueId id;
  const NcclResult status = lib.get_unique_id(&id);
  if (status != NcclResult::kSuccess) {
    throw CollectiveError(str_cat("nccl rank ", rank, ": ncclGetUniqueId for ", init_addr,
                                  " failed: ", lib.describe(status)));
  }
  return std::make_unique<NcclCommunicator>(ctx, nullptr, rank, size, id, timeout);
}

}  // namespace deepinfer
