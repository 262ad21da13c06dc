#include "model/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/fp8.h"

namespace deepinfer {
namespace {

constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
// An FP8 weight's scales: DeepSeek's checkpoints name them NAME_scale_inv, compressed-tensors' NAME_scale (the same
// multiplier of the e4m3 values: w = q * s).
constexpr std::string_view kScaleSuffix = "_scale_inv";
constexpr std::string_view kCompressedTensorsScaleSuffix = "_scale";
constexpr int64_t kParallelElements = int64_t{1} << 18;

// 16-bit floats -> fp32. The mapping may leave tensors unaligned, so elements are loaded with memcpy.
template <float (*kWiden)(uint16_t)>
void widen_16bit(std::span<const std::byte> bytes, std::span<float> out) {
  const std::byte* src = bytes.data();
  float* dst = out.data();
  const auto n = static_cast<int64_t>(out.size());
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, sizeof(bits));
    dst[i] = kWiden(bits);
  }
}

float bf16_bits_to_float(uint16_t bits) { return bf16_to_float(bits); }
float half_bits_to_float(uint16_t bits) { return half_to_float(bits); }

// F32 / F16 / BF16 elements -> fp32; the caller checked the sizes (`bytes` holds out.size() elements).
void widen_float(DType dtype, std::span<const std::byte> bytes, std::span<float> out) {
  switch (dtype) {
    case DType::kF32:
      if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
      return;
    case DType::kF16: widen_16bit<half_bits_to_float>(bytes, out); return;
    case DType::kBF16: widen_16bit<bf16_bits_to_float>(bytes, out); return;
    default: break;
  }
  DI_CHECK(false, "internal: widen_float called for ", dtype_name(dtype));
}

bool is_16_or_32_bit_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in.good(), "cannot open ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DI_CHECK(false, "file ", path, " is not valid JSON: ", e.what());
  }
  return {};  // unreachable
}

}  // namespace

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  std::error_code ec;
  DI_CHECK(std::filesystem::is_directory(dir, ec), "checkpoint directory ", dir,
           " does not exist or is not a directory");
  Checkpoint ckpt;
  ckpt.dir_ = dir;

  const std::filesystem::path index_path = dir / kIndexFileName;
  if (std::filesystem::exists(index_path, ec)) {
    const nlohmann::json index = read_json_file(index_path);
    DI_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "file ",
             index_path, " has no \"weight_map\" object");
    const nlohmann::json& weight_map = index["weight_map"];

    // Open each referenced shard once, in name order.
    std::map<std::string, size_t> shard_index;
    for (const auto& [name, shard] : weight_map.items()) {
      DI_CHECK(shard.is_string(), "file ", index_path, ": weight_map entry for ", name, " is not a string");
      const std::filesystem::path shard_rel(shard.get<std::string>());
      DI_CHECK(shard_rel.is_relative() && !shard_rel.empty(), "file ", index_path, ": shard ", shard_rel,
               " for tensor ", name, " is not a relative path");
      shard_index.emplace(shard.get<std::string>(), 0);
    }
    for (auto& [shard, file_index] : shard_index) {
      const std::filesystem::path shard_path = dir / shard;
      DI_CHECK(std::filesystem::exists(shard_path, ec), "shard ", shard_path, " listed in ", index_path,
               " does not exist");
      file_index = ckpt.files_.size();
      ckpt.files_.push_back(SafetensorsFile::open(shard_path));
    }
    for (const auto& [name, shard] : weight_map.items()) {
      const size_t file_index = shard_index.at(shard.get<std::string>());
      const TensorInfo* tensor = ckpt.files_[file_index].find(name);
      DI_CHECK(tensor != nullptr, "tensor ", name, " is listed in ", index_path, " but missing from shard ",
               ckpt.files_[file_index].path());
      ckpt.tensors_.emplace(name, Entry{tensor, file_index});
    }
    return ckpt;
  }

  std::vector<std::filesystem::path> paths;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    if (item.path().extension() == ".safetensors" && item.is_regular_file()) paths.push_back(item.path());
  }
  std::sort(paths.begin(), paths.end());
  DI_CHECK(!paths.empty(), "no *.safetensors files in ", dir);
  ckpt.files_.reserve(paths.size());
  for (const auto& path : paths) ckpt.files_.push_back(SafetensorsFile::open(path));
  for (size_t file_index = 0; file_index < ckpt.files_.size(); ++file_index) {
    for (const TensorInfo& tensor : ckpt.files_[file_index].tensors()) {
      const auto [it, inserted] = ckpt.tensors_.emplace(tensor.name, Entry{&tensor, file_index});
      DI_CHECK(inserted, "tensor ", tensor.name, " appears in both ", ckpt.files_[it->second.file_index].path(),
               " and ", ckpt.files_[file_index].path());
    }
  }
  return ckpt;
}

const Checkpoint::Entry& Checkpoint::entry(std::string_view name) const {
  const auto it = tensors_.find(name);
  DI_CHECK(it != tensors_.end(), "tensor ", name, " not found in checkpoint ", dir_);
  return it->second;
}

bool Checkpoint::contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

const TensorInfo& Checkpoint::get(std::string_view name) const { return *entry(name).tensor; }

const std::filesystem::path& Checkpoint::file_of(std::string_view name) const {
  return files_[entry(name).file_index].path();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

void Checkpoint::read_f32(std::string_view name, std::span<const int64_t> expected_shape, std::span<float> out,
                          std::array<int64_t, 2> fp8_block) const {
  const int64_t rows = expected_shape.empty() ? 1 : expected_shape[0];
  read_rows_f32(name, expected_shape, 0, rows, out, fp8_block);
}

void Checkpoint::read_rows_f32(std::string_view name, std::span<const int64_t> expected_shape, int64_t first_row,
                               int64_t num_rows, std::span<float> out, std::array<int64_t, 2> fp8_block) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.tensor;
  const std::filesystem::path& file = files_[e.file_index].path();
  DI_CHECK(t.supported, "tensor ", name, " in file ", file, " has unsupported dtype ", t.dtype_tag);
  DI_CHECK(std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end()), "tensor ",
           name, " in ", file, " has shape ", shape_str(t.shape), ", expected ", shape_str(expected_shape));
  const int64_t numel = t.numel();
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  const int64_t row_elems = rows == 0 ? 0 : numel / rows;
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= rows, "rows [", first_row, ", ",
           first_row + num_rows, ") out of range for tensor ", name, " of shape ", shape_str(t.shape));
  const int64_t count = num_rows * row_elems;
  if (num_rows == rows) {
    DI_CHECK(static_cast<int64_t>(out.size()) == count, "output for tensor ", name, " holds ", out.size(),
             " floats, but shape ", shape_str(t.shape), " has ", count, " elements");
  } else {
    DI_CHECK(static_cast<int64_t>(out.size()) == count, "output for rows [", first_row, ", ",
             first_row + num_rows, ") of tensor ", name, " holds ", out.size(), " floats, but they have ", count,
             " elements (shape ", shape_str(t.shape), ")");
  }

  if (is_16_or_32_bit_float(t.dtype)) {
    const auto elem_bytes = static_cast<size_t>(dtype_size(t.dtype));
    widen_float(t.dtype,
                t.bytes.subspan(static_cast<size_t>(first_row * row_elems) * elem_bytes,
                                static_cast<size_t>(count) * elem_bytes),
                out);
    return;
  }
  DI_CHECK(t.dtype == DType::kF8E4M3, "tensor ", name, " in file ", file, " has dtype ", dtype_name(t.dtype),
           "; read_f32 reads floating-point tensors only");

  const std::vector<float> scale_inv = fp8_scales(name, fp8_block);
  const std::span<const uint8_t> codes(reinterpret_cast<const uint8_t*>(t.bytes.data()), t.bytes.size());
  dequantize_fp8_rows({.codes = codes, .rows = rows, .cols = t.shape[1], .scale_inv = scale_inv, .block = fp8_block},
                      first_row, num_rows, out);
}

std::vector<float> Checkpoint::fp8_scales(std::string_view name, std::array<int64_t, 2> fp8_block) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.tensor;
  const std::filesystem::path& file = files_[e.file_index].path();
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  DI_CHECK(t.shape.size() == 2, "FP8 tensor ", name, " in file ", file, " has shape ", shape_str(t.shape),
           "; only 2-D block-scaled FP8 weights are supported");
  DI_CHECK(fp8_block[0] > 0 && fp8_block[1] > 0, "invalid FP8 block size [", fp8_block[0], ", ",
           fp8_block[1], "]");
  std::string scale_name = str_cat(name, kScaleSuffix);
  auto scale_it = tensors_.find(scale_name);
  if (scale_it == tensors_.end()) {
    const auto other = tensors_.find(str_cat(name, kCompressedTensorsScaleSuffix));
    if (other != tensors_.end()) {
      scale_name = other->first;
      scale_it = other;
    }
  }
  DI_CHECK(scale_it != tensors_.end(), "FP8 tensor ", name, " in file ", file, " has no scale tensor ",
           scale_name, " (or ", name, kCompressedTensorsScaleSuffix, ") in checkpoint ", dir_);
  const TensorInfo& scale = *scale_it->second.tensor;
  const std::filesystem::path& scale_file = files_[scale_it->second.file_index].path();
  const int64_t cols = t.shape[1];
  const std::array<int64_t, 2> scale_shape = {(rows + fp8_block[0] - 1) / fp8_block[0],
                                              (cols + fp8_block[1] - 1) / fp8_block[1]};
  DI_CHECK(scale.supported && is_16_or_32_bit_float(scale.dtype), "scale tensor ", scale_name, " in file ",
           scale_file, " has dtype ", scale.dtype_tag, "; expected F32 (or BF16/F16)");
  DI_CHECK(std::equal(scale.shape.begin(), scale.shape.end(), scale_shape.begin(), scale_shape.end()),
           "scale tensor ", scale_name, " in file ", scale_file, " has shape ", shape_str(scale.shape),
           ", expected ", shape_str(scale_shape), " for FP8 tensor ", name, " of shape ", shape_str(t.shape),
           " in ", fp8_block[0], "x", fp8_block[1], " blocks");
  // The scales are small (one per 128x128 block): widen them all, and let the dequantization pick the rows.
  std::vector<float> scale_inv(static_cast<size_t>(scale_shape[0] * scale_shape[1]));
  widen_float(scale.dtype, scale.bytes, scale_inv);
  return scale_inv;
}

void Checkpoint::read_fp8_rows(std::string_view name, std::span<const int64_t> expected_shape, int64_t first_row,
                               int64_t num_rows, std::span<uint8_t> codes, std::span<float> scale_inv,
                               std::array<int64_t, 2> fp8_block) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.tensor;
  const std::filesystem::path& file = files_[e.file_index].path();
  DI_CHECK(t.supported && t.dtype == DType::kF8E4M3, "tensor ", name, " in file ", file, " is ", t.dtype_tag,
           ", not FP8");
  DI_CHECK(std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end()), "tensor ",
           name, " in ", file, " has shape ", shape_str(t.shape), ", expected ", shape_str(expected_shape));
  const std::vector<float> all_scales = fp8_scales(name, fp8_block);
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t scale_cols = (cols + fp8_block[1] - 1) / fp8_block[1];
  const int64_t scale_rows = (num_rows + fp8_block[0] - 1) / fp8_block[0];
  DI_CHECK(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= rows && first_row % fp8_block[0] == 0,
           "FP8 rows [", first_row, ", ", first_row + num_rows, ") of tensor ", name, " ", shape_str(t.shape),
           ": the first must start a block of ", fp8_block[0], " rows");
  DI_CHECK(static_cast<int64_t>(codes.size()) == num_rows * cols &&
               static_cast<int64_t>(scale_inv.size()) == scale_rows * scale_cols,
           "FP8 rows of tensor ", name, ": ", codes.size(), " codes and ", scale_inv.size(), " scales for ",
           num_rows, " rows");
  std::memcpy(codes.data(), t.bytes.data() + first_row * cols, codes.size());
  std::copy_n(all_scales.begin() + (first_row / fp8_block[0]) * scale_cols, scale_inv.size(), scale_inv.begin());
}

}  // namespace deepinfer
