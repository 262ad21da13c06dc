// A network endpoint as the ranks' addresses are given ("HOST:PORT", "[IPv6]:PORT"): parsed in one place for the
// bootstrap store, gloo and NCCL's init address alike.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

struct HostPort {
  std::string host;  // a name or an IPv4 / IPv6 address (without its brackets)
  uint16_t port = 0;
  std::string str() const;
};

// "HOST:PORT" or "[IPv6]:PORT" with a port in [1, 65535]; throws InvalidArgument naming the text otherwise.
HostPort parse_host_port(const std::string& address);

}  // namespace deepinfer
