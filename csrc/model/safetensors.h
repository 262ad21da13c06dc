// One safetensors file, memory-mapped read-only. Tensor bytes are views into the mapping; nothing is
// copied into RAM, and the mapping lives exactly as long as the SafetensorsFile.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the start of the data section; the optional "__metadata__" entry maps strings to strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace deepinfer {

struct TensorInfo {
  std::string name;
  // Valid only when `supported`. For other dtypes (F8_E5M2, I8, U8, F64, BOOL, ...) the tensor is
  // recorded (name, shape, bytes, dtype_tag) but has no DType; code that reads values must check
  // `supported` first (Checkpoint::read_f32 does).
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // into the file mapping
  std::string dtype_tag;             // the safetensors spelling: "BF16", "F8_E4M3", "F8_E5M2", ...
  bool supported = true;

  int64_t numel() const;
};

// "[2, 3]"
std::string shape_str(std::span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Maps the file and validates its header: every tensor's offsets lie inside the data section, do not
  // overlap, and cover exactly product(shape) * element size bytes. Throws deepinfer::Error naming the
  // file (and tensor) on any problem.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }

  // nullptr when the file has no tensor of that name.
  const TensorInfo* find(std::string_view name) const;
  // Throws "tensor NAME not found in file F".
  const TensorInfo& get(std::string_view name) const;

  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }

  // The "__metadata__" entry (string values; other JSON values are kept as their JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  size_t file_bytes() const { return mapped_bytes_; }

 private:
  SafetensorsFile() = default;
  void unmap() noexcept;

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

}  // namespace deepinfer
