// Test helpers shared by the checkpoint-reading tests: temp directories, a safetensors writer, error matching.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "deepinfer_test") {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() / str_cat(prefix, "_", ::getpid(), "_", counter.fetch_add(1));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline void write_raw(const fs::path& path, uint64_t header_len, const std::string& header,
                      const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// kAligned pads the header to 8 bytes, as writers usually do; kOdd pads it to an odd length, so tensor data is not
// aligned in the mapping (the reader must not assume alignment).
enum class HeaderPadding : uint8_t { kAligned, kOdd };

// Writes a well-formed file: tensors packed in the given order.
inline void write_safetensors(const fs::path& path, const std::vector<RawTensor>& tensors,
                              const nlohmann::json& metadata = nullptr,
                              HeaderPadding padding = HeaderPadding::kAligned) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::vector<uint8_t> data;
  for (const RawTensor& t : tensors) {
    const size_t begin = data.size();
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  if (padding == HeaderPadding::kAligned) {
    while (text.size() % 8 != 0) text += ' ';
  } else if (text.size() % 2 == 0) {
    text += ' ';
  }
  write_raw(path, text.size(), text, data);
}

// Runs `fn`, expects a deepinfer::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nmissing: " << part;
    }
  }
}

}  // namespace deepinfer::test
