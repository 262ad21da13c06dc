// Where loaded weights go. The loader reads a checkpoint piece by piece (a tensor, a chunk of rows, one expert)
// and hands each piece to a sink right away, so the host never holds a whole model in float32.
//
// A sink also decides how linear layers' weights are stored (WeightFormat): in the matrix dtype, or as block-scaled
// FP8 (core/weight.h). An FP8 sink takes FP8 checkpoints' codes and scales as they are (write_fp8), and quantizes
// float32 values it is given (a bf16 checkpoint, or a piece whose blocks do not line up with the stored ones) into
// 128 x 128 blocks once every row of a block row has arrived. The loader may still give an FP8 sink's linear layers
// a plain matrix (allocate with kMatrix): the layers an FP8 checkpoint stores unquantized, and MTP's eh_proj.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/dummy_normal.h"
#include "core/fp8.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "model/int4.h"

namespace deepinfer {

class Backend;

// What a weight is to the ops: a matrix kept in the sink's matrix dtype (embeddings, the router, MLA's absorbed
// per-head matrices), a norm weight / bias (float32), or a linear layer's weight, which the sink's WeightFormat
// applies to. The FP8 weights are those DeepSeek's own FP8 release quantizes: every projection of attention and of
// the MLPs and experts; embeddings, lm_head, norms, the router and the MTP layer's eh_proj stay in the model dtype.
// An FP8 checkpoint's own choice stands over this list (weights.cpp, Loader::fp8_weight).
enum class WeightRole : uint8_t { kMatrix, kVector, kLinear };

// How linear weights are stored.
struct WeightFormat {
  bool fp8 = false;                                 // block-scaled FP8; otherwise the matrix dtype
  // 4-bit weights stay packed (core/weight.h) where the source has them in 4 bits (WeightSource::int4_form): the
  // device computes with them. Otherwise a source's 4-bit weights arrive dequantized, as float32 values.
  bool int4 = false;
  bool fp8_activations = true;                      // W8A8 (prefill GEMMs quantize activations); false: W8A16
  Fp8ScaleFormat scale_format = Fp8ScaleFormat::kFloat;  // for values the sink quantizes itself
};

// A piece of an FP8 weight as a checkpoint stores it: whole block rows of one matrix.
struct Fp8Rows {
  std::span<const uint8_t> codes;  // [rows, cols] e4m3
  std::span<const float> scale_inv;  // [ceil(rows / 128), ceil(cols / 128)]
  int64_t rows = 0;
};

class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // An uninitialized destination for a weight of `shape` (kMatrix or kVector): matrices in the sink's matrix dtype,
  // vectors float32.
  virtual Tensor allocate(Shape shape, WeightRole role) = 0;
  // Writes `values` (float32, host) into elements [offset, offset + values.size()) of `dst` (row-major, counted
  // over the whole tensor), narrowing to dst's dtype. Returns once `values` may be changed or freed.
  virtual void write(Tensor& dst, int64_t offset, std::span<const float> values) = 0;

  // A linear layer's weight of `shape` ([N, K], or [E, N, K] stacked experts) in the sink's format. The default is a
  // matrix (allocate with kMatrix).
  virtual Weight allocate_linear(Shape shape) { return Weight(allocate(shape, WeightRole::kMatrix)); }
  // Float32 values into a linear weight, as write() does; one of the sink's FP8 weights (is_fp8_weight) quantizes
  // them (whole rows only, every row of the weight written exactly once), a plain one takes them as a matrix.
  virtual void write(Weight& dst, int64_t offset, std::span<const float> values) { write(dst.values, offset, values); }
  // Whether linear weights are FP8 (stored as FP8, or emulated in float32).
  virtual bool fp8_linear() const { return false; }
  // Whether `w` is one of this sink's FP8 weights (allocate_linear's where fp8_linear()), rather than a plain matrix.
  virtual bool is_fp8_weight(const Weight& w) const { return w.is_fp8(); }
  // Whether write_fp8 places stored FP8 pieces as they are (the sink's weights are FP8).
  virtual bool takes_fp8() const { return false; }
  // Stored FP8 block rows into matrix `matrix` (0 for a 2-D weight) of `dst` from row `first_row` on (a multiple of
  // 128), codes and scales as they are. Only where takes_fp8().
  virtual void write_fp8(Weight& dst, int64_t matrix, int64_t first_row, const Fp8Rows& rows);
  // Whether linear weights the source holds in 4 bits are kept packed (allocate_int4, write_int4).
  virtual bool takes_int4() const { return false; }
  // A packed INT4 weight of logical `shape` ([N, K] or [E, N, K]) in `form` (core/weight.h); only where takes_int4().
  virtual Weight allocate_int4(Shape shape, const Int4Form& form);
  // Whole rows of matrix `matrix` of an INT4 weight from row `first_row` on, packed as they are written.
  virtual void write_int4(Weight& dst, int64_t matrix, int64_t first_row, const Int4Rows& rows);
  // Dummy weights made where `dst` lives: its elements [offset, offset + count) get the values `range` places
  // (core/dummy_normal.h; WeightSource::normal_stream), an FP8 weight's quantized as write() would quantize them.
  // Returns false, writing nothing, where the sink cannot (host memory, a backend without the kernels, FP8 rows off
  // whole 128-row blocks of one matrix, packed 4-bit and emulated FP8 weights): the loader then writes the values.
  virtual bool fill_normal(Tensor& /*dst*/, int64_t /*offset*/, int64_t /*count*/,
                           const dummy_normal::StreamRange& /*range*/) {
    return false;
  }
  virtual bool fill_normal(Weight& /*dst*/, int64_t /*offset*/, int64_t /*count*/,
                           const dummy_normal::StreamRange& /*range*/) {
    return false;
  }
  // Checks that every FP8 weight was written whole (no block row left waiting for rows); the loader calls it last.
  virtual void finish() {}
};

// Host float32 tensors, written with memcpy: what load_weights returned before sinks existed. With format.fp8, linear
// weights are kept as FP8 codes and scales in host memory (the CPU backend's reference for the FP8 kernels).
std::unique_ptr<WeightSink> make_host_sink(WeightFormat format = {});

// Host float32 tensors whose linear weights are quantized to FP8 and dequantized again as they are written: a float32
// model that computes with exactly the FP8 weights (the CPU engine's quantization="fp8" on a bf16 checkpoint).
std::unique_ptr<WeightSink> make_fp8_emulating_host_sink(Fp8ScaleFormat scale_format = Fp8ScaleFormat::kFloat);

// Tensors of `backend` (Backend::empty): matrices in backend.activation_dtype() (float32 or bfloat16), vectors in
// float32, linear weights per `format`. A write to a bfloat16 tensor narrows on the host (round to nearest even)
// through a bounded staging buffer, a chunk at a time, then copies each chunk with backend.copy_to_device.
// `backend` must outlive the sink.
std::unique_ptr<WeightSink> make_backend_sink(Backend& backend, WeightFormat format = {});

}  // namespace deepinfer
