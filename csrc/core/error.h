// Errors with context. Library code throws; it never exits or aborts.
#pragma once

#include <charconv>
#include <sstream>
#include <string_view>
#include <type_traits>
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

namespace detail {
// Text and numbers are appended directly (numbers through std::to_chars: no stream, no locale, so a message can be
// built whatever global locale the host process installed); anything else through its operator<<.
template <typename T>
void append_part(std::string& out, const T& value) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(value);
  } else if constexpr (std::is_same_v<T, char>) {
    out += value;
  } else if constexpr (std::is_same_v<T, bool>) {
    out += value ? '1' : '0';
  } else if constexpr (std::is_integral_v<T> || std::is_floating_point_v<T>) {
    char buffer[64];
    const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
    out.append(buffer, result.ptr);
  } else {
    std::ostringstream stream;
    stream << value;
    out += stream.str();
  }
}
}  // namespace detail

// Concatenates text, numbers and other streamable values: str_cat("page ", 812, " of ", 800).
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::string out;
  (detail::append_part(out, parts), ...);
  return out;
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
