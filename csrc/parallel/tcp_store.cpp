// The bootstrap store (tcp_store.h). A request is one byte (S: set, G: get, O: own), the key's length (uint32,
// network order) and key, and for a set the value's length and value; a set or an own is answered with one byte, a
// get with a found byte and, when found, the value's length and value. A get of a key not set yet answers "not
// found" at once, and the client asks again: the server never holds a request open.
#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "parallel/communicator.h"

namespace deepinfer {
namespace {

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 64u << 20;
constexpr auto kRetry = std::chrono::milliseconds(10);

std::string errno_text() { return std::strerror(errno); }

// cancel_bootstrap_waits' reason, once given.
std::mutex cancel_mutex;
std::string cancel_reason;
std::atomic<bool> cancelled{false};

void throw_if_cancelled() {
  if (!cancelled.load()) return;
  std::lock_guard lock(cancel_mutex);
  throw CollectiveError(str_cat("the ranks' bootstrap was cancelled: ", cancel_reason));
}

// Writes all of `bytes`; false when the peer is gone.
bool write_all(int fd, const void* bytes, size_t size) {
  const auto* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes; false when the peer closed or failed first.
bool read_all(int fd, void* bytes, size_t size) {
  auto* p = static_cast<char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool write_u32(int fd, uint32_t value) {
  const uint32_t wire = htonl(value);
  return write_all(fd, &wire, sizeof wire);
}

bool read_u32(int fd, uint32_t& value) {
  uint32_t wire = 0;
  if (!read_all(fd, &wire, sizeof wire)) return false;
  value = ntohl(wire);
  return true;
}

// The addresses `at` resolves to (for a listener: of this machine).
struct AddressList {
  addrinfo* head = nullptr;
  AddressList(const HostPort& at, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const std::string port = std::to_string(at.port);
    const int rc = ::getaddrinfo(at.host.c_str(), port.c_str(), &hints, &head);
    if (rc != 0) {
      throw InvalidArgument(str_cat("tcp store: cannot resolve ", at.str(), ": ", ::gai_strerror(rc)));
    }
  }
  AddressList(const AddressList&) = delete;
  AddressList& operator=(const AddressList&) = delete;
  ~AddressList() { ::freeaddrinfo(head); }
};

}  // namespace

void cancel_bootstrap_waits(const std::string& reason) {
  std::lock_guard lock(cancel_mutex);
  cancel_reason = reason;
  cancelled.store(true);
}

void clear_bootstrap_cancel() {
  std::lock_guard lock(cancel_mutex);
  cancelled.store(false);
  cancel_reason.clear();
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

int FileDescriptor::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

TcpStoreServer::TcpStoreServer(const HostPort& at) {
  const AddressList addresses(at, /*passive=*/true);
  std::string failures;
  for (const addrinfo* a = addresses.head; a != nullptr && listener_.get() < 0; a = a->ai_next) {
    FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 1024) == 0) {
      listener_ = std::move(fd);
    } else {
      failures = errno_text();
    }
  }
  if (listener_.get() < 0) {
    throw InvalidArgument(str_cat("tcp store: cannot listen at ", at.str(), " (", failures,
                                  "): rank 0 must run on that host, with the port free"));
  }
  int pipe_fds[2];
  DI_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "tcp store: pipe: ", errno_text());
  stop_read_ = FileDescriptor(pipe_fds[0]);
  stop_write_ = FileDescriptor(pipe_fds[1]);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);  // their threads' reads return
  }
  stop_write_ = FileDescriptor();  // the accept loop's poll sees the pipe closed
  acceptor_.join();
  for (std::thread& t : handlers_) t.join();
}

void TcpStoreServer::accept_loop() {
  while (true) {
    pollfd fds[2] = {{.fd = listener_.get(), .events = POLLIN, .revents = 0},
                     {.fd = stop_read_.get(), .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    handlers_.emplace_back([this, fd] { serve(fd); });
  }
}

// One connection's requests until it closes, or a request breaks the protocol (it is then dropped).
void TcpStoreServer::serve(int fd) {
  const FileDescriptor owned(fd);
  std::string owner;
  while (true) {
    char op = 0;
    uint32_t key_size = 0;
    if (!read_all(fd, &op, 1) || !read_u32(fd, key_size) || key_size > kMaxKeyBytes) break;
    std::string key(key_size, '\0');
    if (!read_all(fd, key.data(), key.size())) break;
    if (op == 'S') {
      uint32_t value_size = 0;
      if (!read_u32(fd, value_size) || value_size > kMaxValueBytes) break;
      std::vector<char> value(value_size);
      if (!read_all(fd, value.data(), value.size())) break;
      {
        std::lock_guard lock(mutex_);
        values_[std::move(key)] = std::move(value);
      }
      const char done = 1;
      if (!write_all(fd, &done, 1)) break;
    } else if (op == 'G') {
      std::vector<char> value;
      char found = 0;
      {
        std::lock_guard lock(mutex_);
        if (const auto it = values_.find(key); it != values_.end()) {
          value = it->second;
          found = 1;
        }
      }
      if (!write_all(fd, &found, 1)) break;
      if (found && (!write_u32(fd, static_cast<uint32_t>(value.size())) ||
                    !write_all(fd, value.data(), value.size()))) {
        break;
      }
    } else if (op == 'O') {
      owner = std::move(key);
      const char done = 1;
      if (!write_all(fd, &done, 1)) break;
    } else {
      break;
    }
  }
  std::lock_guard lock(mutex_);
  std::erase(clients_, fd);  // `owned` closes it after this
  if (!owner.empty() && !stopping_) {
    std::vector<char>& departed = values_[std::string(kDepartedKey)];
    departed.insert(departed.end(), owner.begin(), owner.end());
    departed.push_back('\n');
  }
}

TcpStoreClient::TcpStoreClient(const HostPort& at, Clock::time_point deadline) : at_(at) {
  std::string last_error;
  while (true) {
    const AddressList addresses(at, /*passive=*/false);
    for (const addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
      FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) continue;
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        socket_ = std::move(fd);
        return;
      }
      last_error = errno_text();
    }
    throw_if_cancelled();
    if (Clock::now() >= deadline) {
      throw CollectiveError(str_cat("tcp store: no rank 0 answered at ", at.str(), " within the timeout (", last_error,
                                    "): is rank 0 started, on that host, with the same address?"));
    }
    std::this_thread::sleep_for(kRetry * 10);
  }
}

void TcpStoreClient::set(std::string_view key, std::span<const char> value) {
  DI_CHECK_ARG(key.size() <= kMaxKeyBytes && value.size() <= kMaxValueBytes, "tcp store: key of ", key.size(),
               " bytes or value of ", value.size(), " bytes is too long");
  const int fd = socket_.get();
  const char op = 'S';
  char done = 0;
  if (!write_all(fd, &op, 1) || !write_u32(fd, static_cast<uint32_t>(key.size())) ||
      !write_all(fd, key.data(), key.size()) || !write_u32(fd, static_cast<uint32_t>(value.size())) ||
      !write_all(fd, value.data(), value.size()) || !read_all(fd, &done, 1)) {
    throw CollectiveError(str_cat("tcp store at ", at_.str(), ": the connection closed while setting ", key,
                                  " (rank 0 ended?)"));
  }
}

std::optional<std::vector<char>> TcpStoreClient::try_get(std::string_view key) {
  DI_CHECK_ARG(key.size() <= kMaxKeyBytes, "tcp store: key of ", key.size(), " bytes is too long");
  const int fd = socket_.get();
  const char op = 'G';
  char found = 0;
  if (!write_all(fd, &op, 1) || !write_u32(fd, static_cast<uint32_t>(key.size())) ||
      !write_all(fd, key.data(), key.size()) || !read_all(fd, &found, 1)) {
    throw CollectiveError(str_cat("tcp store at ", at_.str(), ": the connection closed while reading ", key,
                                  " (rank 0 ended?)"));
  }
  if (!found) return std::nullopt;
  uint32_t size = 0;
  std::vector<char> value;
  if (read_u32(fd, size) && size <= kMaxValueBytes) {
    value.resize(size);
    if (read_all(fd, value.data(), value.size())) return value;
  }
  throw CollectiveError(str_cat("tcp store at ", at_.str(), ": a broken answer for ", key));
}

void TcpStoreClient::own(std::string_view name) {
  DI_CHECK_ARG(!name.empty() && name.size() <= kMaxKeyBytes, "tcp store: an owner name of ", name.size(), " bytes");
  const int fd = socket_.get();
  const char op = 'O';
  char done = 0;
  if (!write_all(fd, &op, 1) || !write_u32(fd, static_cast<uint32_t>(name.size())) ||
      !write_all(fd, name.data(), name.size()) || !read_all(fd, &done, 1)) {
    throw CollectiveError(str_cat("tcp store at ", at_.str(), ": the connection closed while naming its owner"));
  }
}

std::vector<char> TcpStoreClient::get(std::string_view key, Clock::time_point deadline) {
  while (true) {
    if (std::optional<std::vector<char>> value = try_get(key)) return *std::move(value);
    throw_if_cancelled();
    if (Clock::now() >= deadline) {
      throw CollectiveError(str_cat("tcp store at ", at_.str(), ": ", key, " was not set within the timeout (the ",
                                    "rank that writes it did not start, or started with another address or size)"));
    }
    std::this_thread::sleep_for(kRetry);
  }
}

std::string TcpStoreClient::local_address() const {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  DI_CHECK(::getsockname(socket_.get(), reinterpret_cast<sockaddr*>(&address), &size) == 0,
           "tcp store: getsockname: ", errno_text());
  char host[NI_MAXHOST] = {};
  const int rc = ::getnameinfo(reinterpret_cast<sockaddr*>(&address), size, host, sizeof host, nullptr, 0,
                               NI_NUMERICHOST);
  DI_CHECK(rc == 0, "tcp store: getnameinfo: ", ::gai_strerror(rc));
  return host;
}

}  // namespace deepinfer
