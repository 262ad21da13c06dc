// Errors with context. Library code throws; it never exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace deepinfer {

// The one exception type of the library. nanobind maps it to a Python RuntimeError.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Invalid user input (bad request parameters, a config the engine cannot serve). Mapped to ValueError.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable values: str_cat("page ", 812, " of ", 800).
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

namespace detail {
[[noreturn]] inline void throw_check_failure(const char* file, int line, const char* condition,
                                             const std::string& message) {
  throw Error(str_cat(file, ":", line, ": check `", condition, "` failed: ", message));
}
}  // namespace detail

}  // namespace deepinfer

// DI_CHECK(page < num_pages, "page ", page, " out of range [0, ", num_pages, ")") throws deepinfer::Error
// carrying file, line, condition and the values.
#define DI_CHECK(cond, ...)                                                                          \
  do {                                                                                               \
    if (!(cond)) [[unlikely]] {                                                                      \
      ::deepinfer::detail::throw_check_failure(__FILE__, __LINE__, #cond,                            \
                                               ::deepinfer::str_cat(__VA_ARGS__));                   \
    }                                                                                                \
  } while (false)

// DI_CHECK_ARG throws InvalidArgument with just the message: validation of user input.
#define DI_CHECK_ARG(cond, ...)                                                    \
  do {                                                                             \
    if (!(cond)) [[unlikely]] {                                                    \
      throw ::deepinfer::InvalidArgument(::deepinfer::str_cat(__VA_ARGS__));       \
    }                                                                              \
  } while (false)
