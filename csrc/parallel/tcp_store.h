// The rendezvous of ranks that are separate processes meeting at one address ("HOST:PORT"), as NCCL bootstraps:
// rank 0 serves a small key-value store at the address, and every rank (rank 0 too) writes its transport address
// under its key and reads the others'. Only the start of a group goes through it; the collectives then use the
// connections the transport made (gloo_communicator.h). The store trusts its network, as NCCL's and PyTorch's
// bootstrap stores do: keep the address on the cluster's private network.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/host_port.h"

namespace deepinfer {


// An open file descriptor, closed with it: move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();
  int get() const { return fd_; }
  int release() noexcept;

 private:
  int fd_ = -1;
};

// The key under which the store lists the owners (TcpStoreClient::own) of the connections that have closed, one a
// line: who has left the group, even when it died without a word.
inline constexpr std::string_view kDepartedKey = "deepinfer/departed";

// The store, served at `at` (an address of this machine) from a thread of its own until it is destroyed.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(const HostPort& at);
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  ~TcpStoreServer();  // stops serving, closes every connection and joins the threads

 private:
  void accept_loop();
  void serve(int fd);
  FileDescriptor listener_;
  FileDescriptor stop_read_;   // a pipe whose write end the destructor closes: wakes the accept loop
  FileDescriptor stop_write_;
  std::mutex mutex_;           // guards values_, clients_ and stopping_
  std::map<std::string, std::vector<char>, std::less<>> values_;
  std::vector<int> clients_;   // the connections' descriptors, shut down by the destructor to end their threads
  bool stopping_ = false;
  std::vector<std::thread> handlers_;  // touched by the accept thread only, until it is joined
  std::thread acceptor_;
};

// Ends every wait of this process's store clients (connecting, or for a key) with CollectiveError carrying `reason`,
// from any thread: a launcher that sees a rank's process die before the ranks met stops the others' wait for it,
// which would last the whole timeout. Waits that start afterwards end the same way, until clear_bootstrap_cancel()
// (a new launch in the same process).
void cancel_bootstrap_waits(const std::string& reason);
void clear_bootstrap_cancel();

// One rank's connection to the store.
class TcpStoreClient {
 public:
  using Clock = std::chrono::steady_clock;
  // Connects to the store at `at`, retrying until `deadline` (rank 0 may start after this rank); throws
  // CollectiveError naming the address past it.
  TcpStoreClient(const HostPort& at, Clock::time_point deadline);

  void set(std::string_view key, std::span<const char> value);
  // The value under `key`, waiting for a rank to set it until `deadline`; throws CollectiveError past it.
  std::vector<char> get(std::string_view key, Clock::time_point deadline);
  // The value under `key` now, if it is set.
  std::optional<std::vector<char>> try_get(std::string_view key);
  // Names this connection's owner: when it closes (its process ended, however), the store adds `name` to the lines
  // under kDepartedKey.
  void own(std::string_view name);
  // This end's IP address: that of the interface through which this machine reaches the store's.
  std::string local_address() const;

 private:
  HostPort at_;
  FileDescriptor socket_;
};

}  // namespace deepinfer
