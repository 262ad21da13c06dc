// A Hugging Face model directory: one or more safetensors files, memory-mapped, addressed by tensor name.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/safetensors.h"

namespace deepinfer {

class Checkpoint {
 public:
  // With `model.safetensors.index.json` in `dir`, its weight_map decides which tensors exist and where
  // (every referenced shard must exist and hold its tensors; other tensors in the shards are ignored).
  // Without it, every `*.safetensors` file in `dir` is opened (in name order) and a tensor name may
  // appear in only one of them. Throws deepinfer::Error naming the directory, file and tensor.
  static Checkpoint open(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  ~Checkpoint() = default;

  const std::filesystem::path& dir() const { return dir_; }
  bool contains(std::string_view name) const;
  // Throws "tensor NAME not found in checkpoint DIR".
  const TensorInfo& get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  // The file holding tensor `name`; throws like get().
  const std::filesystem::path& file_of(std::string_view name) const;
  // The opened files, in name order.
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // Reads tensor `name` as fp32 into `out` (row-major, product(expected_shape) floats).
  // Checks the shape ("tensor NAME in FILE has shape [a, b], expected [c, d]") and the size of `out`.
  // F32 is copied; F16 and BF16 are widened exactly. F8_E4M3 requires a 2-D shape and the companion
  // tensor NAME + "_scale_inv" (e.g. "...weight" -> "...weight_scale_inv") of shape
  // [ceil(rows / fp8_block[0]), ceil(cols / fp8_block[1])] (F32, BF16 or F16), and is dequantized:
  //   out[r][c] = e4m3(w[r][c]) * scale_inv[r / fp8_block[0]][c / fp8_block[1]].
  // Integer and unsupported dtypes throw.
  void read_f32(std::string_view name, std::span<const int64_t> expected_shape, std::span<float> out,
                std::array<int64_t, 2> fp8_block = {128, 128}) const;
  // Same, so that `read_f32(name, {rows, cols}, out)` compiles.
  void read_f32(std::string_view name, std::initializer_list<int64_t> expected_shape, std::span<float> out,
                std::array<int64_t, 2> fp8_block = {128, 128}) const {
    read_f32(name, std::span<const int64_t>(expected_shape.begin(), expected_shape.size()), out, fp8_block);
  }
  // Rows [first_row, first_row + num_rows) of dimension 0 of the same read (a 0-D tensor is one row), for
  // callers that place a large tensor piece by piece (one expert of a fused [E, 2I, D] tensor). `expected_shape`
  // is the whole tensor's shape; `out` holds num_rows * (elements per row) floats. Equals the matching part of
  // read_f32's output bit for bit, for any range (FP8 ranges need not align to the scale blocks).
  void read_rows_f32(std::string_view name, std::span<const int64_t> expected_shape, int64_t first_row,
                     int64_t num_rows, std::span<float> out, std::array<int64_t, 2> fp8_block = {128, 128}) const;

  // The stored e4m3 codes of rows [first_row, first_row + num_rows) of 2-D FP8 tensor `name` (first_row on a block
  // boundary), and the float32 scale_inv of their block rows ([ceil(num_rows / fp8_block[0]), ceil(cols /
  // fp8_block[1])]), as they are. Throws on another dtype, a shape other than expected_shape, or a range off the blocks.
  void read_fp8_rows(std::string_view name, std::span<const int64_t> expected_shape, int64_t first_row,
                     int64_t num_rows, std::span<uint8_t> codes, std::span<float> scale_inv,
                     std::array<int64_t, 2> fp8_block = {128, 128}) const;

 private:
  // The whole scale_inv of FP8 tensor `name`, widened, after the checks of its presence, dtype and shape.
  std::vector<float> fp8_scales(std::string_view name, std::array<int64_t, 2> fp8_block) const;

  struct Entry {
    const TensorInfo* tensor;  // owned by files_[file_index]
    size_t file_index;
  };

  Checkpoint() = default;
  const Entry& entry(std::string_view name) const;

  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

}  // namespace deepinfer
