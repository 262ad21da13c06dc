#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer {
namespace {

struct DTypeTag {
  std::string_view tag;
  uint32_t bits;  // per element
  std::optional<DType> dtype;
};

// The dtypes safetensors defines. Those without a DType are recorded but cannot be read as values.
constexpr DTypeTag kDTypeTags[] = {
    {"F32", 32, DType::kF32},      {"F16", 16, DType::kF16},     {"BF16", 16, DType::kBF16},
    {"F8_E4M3", 8, DType::kF8E4M3}, {"I32", 32, DType::kI32},     {"I64", 64, DType::kI64},
    {"F64", 64, std::nullopt},     {"F8_E5M2", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt},
    {"F6_E2M3", 6, std::nullopt},  {"F6_E3M2", 6, std::nullopt}, {"F4", 4, std::nullopt},
    {"I16", 16, std::nullopt},     {"I8", 8, std::nullopt},      {"U64", 64, std::nullopt},
    {"U32", 32, std::nullopt},     {"U16", 16, std::nullopt},    {"U8", 8, std::nullopt},
    {"BOOL", 8, std::nullopt},     {"C64", 64, std::nullopt},
};

const DTypeTag* find_dtype_tag(std::string_view tag) {
  for (const DTypeTag& t : kDTypeTags) {
    if (t.tag == tag) return &t;
  }
  return nullptr;
}

struct Placement {
  const TensorInfo* tensor;
  uint64_t begin;
  uint64_t end;
};

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  std::error_code ec;
  DI_CHECK(std::filesystem::exists(path, ec), "safetensors file ", path, " does not exist");
  DI_CHECK(std::filesystem::is_regular_file(path, ec), "safetensors file ", path, " is not a regular file");

  SafetensorsFile file;
  file.path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DI_CHECK(fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DI_CHECK(false, "cannot stat safetensors file ", path, ": ", std::strerror(err));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    DI_CHECK(false, "file ", path, " is too short for a safetensors header (", file_bytes, " bytes)");
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  DI_CHECK(mapping != MAP_FAILED, "cannot mmap safetensors file ", path, ": ", std::strerror(mmap_errno));
  file.mapping_ = mapping;
  file.mapped_bytes_ = file_bytes;

  const auto* base = static_cast<const std::byte*>(mapping);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | std::to_integer<uint64_t>(base[i]);
  }
  DI_CHECK(header_bytes <= file_bytes - 8, "file ", path, " has a header length of ", header_bytes,
           " bytes, but only ", file_bytes - 8, " bytes follow the length field (not a safetensors file?)");
  const auto* header_begin = reinterpret_cast<const char*>(base + 8);
  const std::byte* data = base + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    DI_CHECK(false, "file ", path, " has an invalid JSON header: ", e.what());
  }
  DI_CHECK(header.is_object(), "file ", path, " has a JSON header that is not an object");

  const auto non_negative_ints = [](const nlohmann::json& j, size_t required_size) {
    if (!j.is_array()) return false;
    if (required_size != 0 && j.size() != required_size) return false;
    return std::all_of(j.begin(), j.end(), [](const nlohmann::json& v) { return v.is_number_unsigned(); });
  };

  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  file.tensors_.reserve(header.size());
  offsets.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      DI_CHECK(entry.is_object(), "file ", path, ": __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        file.metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
      }
      continue;
    }
    DI_CHECK(entry.is_object(), "tensor ", name, " in file ", path, ": header entry is not an object");
    DI_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), "tensor ", name, " in file ", path,
             ": missing or non-string 'dtype'");
    DI_CHECK(entry.contains("shape") && non_negative_ints(entry["shape"], 0), "tensor ", name, " in file ",
             path, ": 'shape' must be an array of non-negative integers");
    DI_CHECK(entry.contains("data_offsets") && non_negative_ints(entry["data_offsets"], 2), "tensor ", name,
             " in file ", path, ": 'data_offsets' must be two non-negative integers");

    TensorInfo info;
    info.name = name;
    info.dtype_tag = entry["dtype"].get<std::string>();
    int64_t numel = 1;
    bool numel_overflow = false;
    for (const auto& d : entry["shape"]) {
      const uint64_t dim = d.get<uint64_t>();
      numel_overflow |= dim > static_cast<uint64_t>(INT64_MAX) ||
                        __builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel);
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    DI_CHECK(!numel_overflow, "tensor ", name, " in file ", path, " has an absurd shape (element count overflows)");
    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t end = entry["data_offsets"][1].get<uint64_t>();
    DI_CHECK(begin <= end, "tensor ", name, " in file ", path, " has data_offsets [", begin, ", ", end,
             ") out of order");
    DI_CHECK(end <= data_bytes, "file ", path, " is truncated: tensor ", name, " needs bytes [", begin, ", ",
             end, ") but the data section has ", data_bytes, " bytes");

    const DTypeTag* tag = find_dtype_tag(info.dtype_tag);
    info.supported = tag != nullptr && tag->dtype.has_value();
    if (info.supported) info.dtype = *tag->dtype;
    if (tag != nullptr) {  // unknown dtypes: no element size to check against
      uint64_t bits = 0;
      const bool bits_overflow = __builtin_mul_overflow(static_cast<uint64_t>(numel), uint64_t{tag->bits}, &bits);
      const uint64_t expected = bits / 8 + (bits % 8 != 0);
      DI_CHECK(!bits_overflow && expected == end - begin, "tensor ", name, " in file ", path, " has ",
               end - begin, " bytes, but shape ", shape_str(info.shape), " of ", info.dtype_tag, " needs ",
               bits_overflow ? std::string("more than 2^64") : std::to_string(expected), " bytes");
    }
    info.bytes = std::span<const std::byte>(data + begin, end - begin);
    file.tensors_.push_back(std::move(info));
  }

  // No two tensors may share bytes.
  std::vector<Placement> placements;
  placements.reserve(file.tensors_.size());
  for (const TensorInfo& t : file.tensors_) {
    if (t.bytes.empty()) continue;
    const auto begin = static_cast<uint64_t>(t.bytes.data() - data);
    placements.push_back({&t, begin, begin + t.bytes.size()});
  }
  std::sort(placements.begin(), placements.end(),
            [](const Placement& a, const Placement& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < placements.size(); ++i) {
    const Placement& prev = placements[i - 1];
    const Placement& cur = placements[i];
    DI_CHECK(cur.begin >= prev.end, "tensors ", prev.tensor->name, " (bytes [", prev.begin, ", ", prev.end,
             ")) and ", cur.tensor->name, " (bytes [", cur.begin, ", ", cur.end, ")) overlap in file ", path);
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() noexcept {
  if (mapping_ != nullptr) {
    ::munmap(mapping_, mapped_bytes_);
    mapping_ = nullptr;
    mapped_bytes_ = 0;
  }
  tensors_.clear();
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  DI_CHECK(t != nullptr, "tensor ", name, " not found in file ", path_);
  return *t;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

}  // namespace deepinfer
