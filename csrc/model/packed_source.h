// What the sources of checkpoints with packed linear layers (4-bit integers, model/int4_source.h; 4-bit floats,
// model/fp4_source.h) share: they answer for the plain names the loader asks for ("...q_b_proj.weight", [N, K]) with
// float32 rows of the dequantized weight, and read every other tensor as stored.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

class PackedWeightSource : public WeightSource {
 public:
  bool contains(const std::string& name) const final;
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const final;
  // A packed weight's rows, dequantized (after checking `shape` is its [N, K]); other tensors as stored.
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const final;

 protected:
  explicit PackedWeightSource(Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}

  // Records that the plain name `logical` (X.weight) is stored packed, as [rows, cols], in tensor `packed`.
  void add_packed(const std::string& logical, const std::string& packed, int64_t rows, int64_t cols);
  bool has_packed() const { return !packed_.empty(); }
  // Rows [first_row, first_row + num_rows) of packed weight `name` (one add_packed recorded), dequantized.
  virtual void read_packed_rows(const std::string& name, int64_t first_row, int64_t num_rows,
                                std::span<float> out) const = 0;

  const TensorInfo& require(const std::string& name, const std::string& of) const;  // throws naming both

  Checkpoint checkpoint_;

 private:
  struct Packed {
    std::string tensor;
    int64_t rows = 0, cols = 0;
  };
  std::map<std::string, Packed, std::less<>> packed_;  // by the plain name
};

// The {N, K} a compressed-tensors `weight_shape` tensor records (I64 or I32, two values); throws naming it otherwise.
std::array<int64_t, 2> read_weight_shape(const TensorInfo& shape_tensor);

}  // namespace deepinfer
