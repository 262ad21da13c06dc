// The environment switches' rule: set, not empty and not "0" turns a switch on.
#include "core/env_flag.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace deepinfer {
namespace {

TEST(EnvFlag, OnWhenSetToAnythingButEmptyOrZero) {
  EXPECT_FALSE(env_flag_on(nullptr));
  EXPECT_FALSE(env_flag_on(""));
  EXPECT_FALSE(env_flag_on("0"));
  EXPECT_TRUE(env_flag_on("1"));
  EXPECT_TRUE(env_flag_on("yes"));
  EXPECT_TRUE(env_flag_on("true"));
}

TEST(EnvFlag, ReadsTheNamedVariable) {
  constexpr const char* kName = "DEEPINFER_ENV_FLAG_TEST_SWITCH";
  ::unsetenv(kName);
  EXPECT_FALSE(env_flag(kName));
  ::setenv(kName, "1", 1);
  EXPECT_TRUE(env_flag(kName));
  ::setenv(kName, "0", 1);
  EXPECT_FALSE(env_flag(kName));
  ::unsetenv(kName);
}

}  // namespace
}  // namespace deepinfer
