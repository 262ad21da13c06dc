#include "core/host_port.h"

#include <utility>

#include "core/error.h"

namespace deepinfer {

std::string HostPort::str() const {
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port) : str_cat(host, ":", port);
}

HostPort parse_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  const auto bad = [&] {
    return InvalidArgument(str_cat("the address must be HOST:PORT or [IPv6]:PORT with a port in [1, 65535], not \"",
                                   address, "\""));
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) throw bad();
  const std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) throw bad();
  const int value = std::stoi(port);
  if (value < 1 || value > 65535) throw bad();
  std::string host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') throw bad();
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    throw bad();  // an IPv6 address needs its brackets
  }
  return {.host = std::move(host), .port = static_cast<uint16_t>(value)};
}

}  // namespace deepinfer
