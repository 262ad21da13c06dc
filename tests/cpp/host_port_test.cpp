// The ranks' addresses: one parser for the bootstrap store, gloo and NCCL's init address.
#include "core/host_port.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace deepinfer {
namespace {

TEST(HostPort, ParsesNamesIPv4AndBracketedIPv6) {
  const HostPort name = parse_host_port("node0.cluster:5000");
  EXPECT_EQ(name.host, "node0.cluster");
  EXPECT_EQ(name.port, 5000);
  EXPECT_EQ(name.str(), "node0.cluster:5000");
  const HostPort v4 = parse_host_port("127.0.0.1:1");
  EXPECT_EQ(v4.host, "127.0.0.1");
  EXPECT_EQ(v4.port, 1);
  const HostPort v6 = parse_host_port("[::1]:65535");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 65535);
  EXPECT_EQ(v6.str(), "[::1]:65535");
}

TEST(HostPort, RefusesWhatIsNotHostColonPortNamingTheText) {
  for (const std::string bad : {"host", "host:", ":5000", "host:0", "host:65536", "host:12345678", "host:5x",
                                "::1:5000", "[::1:5000", "[]:5000"}) {
    try {
      (void)parse_host_port(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("\"" + bad + "\""), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace deepinfer
