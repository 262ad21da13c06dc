// Error messages: str_cat formats text and numbers without streams (the numbers through std::to_chars, so no global
// locale of the host process is involved), and the check macros carry them.
#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace deepinfer {
namespace {

TEST(StrCat, FormatsTextAndNumbers) {
  const std::string name = "top_p";
  EXPECT_EQ(str_cat(name, " must be in (0, 1], got ", 1.5f), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(str_cat("page ", 812, " of ", int64_t{800}, ", ", uint64_t{1} << 40), "page 812 of 800, 1099511627776");
  EXPECT_EQ(str_cat(0.3, " ", 1e-6, " ", -2.0, " ", 0.1f), "0.3 1e-06 -2 0.1");
  EXPECT_EQ(str_cat('[', true, false, ']', std::string_view("!")), "[10]!");
  EXPECT_EQ(str_cat(), "");
}

TEST(StrCat, ChecksCarryTheirMessage) {
  try {
    DI_CHECK_ARG(false, "gpu_memory_utilization ", 0.3, " leaves no room");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "gpu_memory_utilization 0.3 leaves no room");
  }
}

}  // namespace
}  // namespace deepinfer
