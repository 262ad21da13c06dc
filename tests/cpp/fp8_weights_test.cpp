// FP8 weights on the host: the e4m3 encoder against the decoder's table, block quantization, and load_weights into
// FP8 sinks (stored FP8 placed as stored, bf16 quantized per block, float32 emulation).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/weight.h"
#include "model/weight_sink.h"
#include "model/weights.h"
#include "safetensors_writer.h"

namespace deepinfer {
namespace {

using namespace test;  // NOLINT: the shared test helpers

bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// ---------------------------------------------------------------------------------------------- encoding

TEST(Fp8Encoding, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

// Between two neighbouring codes a value goes to the nearer one, and a midpoint to the one with an even mantissa.
TEST(Fp8Encoding, RoundsToNearestWithTiesToEven) {
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(code)), hi = e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float mid = 0.5f * (lo + hi);
    const int even = code % 2 == 0 ? code : code + 1;
    EXPECT_EQ(float_to_e4m3(mid), even) << "midpoint of codes " << code << " and " << code + 1;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.0f)), code) << "just below the midpoint above code " << code;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1e9f)), code + 1) << "just above the midpoint above code " << code;
    EXPECT_EQ(float_to_e4m3(-mid), 0x80 | even) << "negative midpoint above code " << code;
  }
}

TEST(Fp8Encoding, SaturatesAndKeepsNan) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(470.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

// Each 128 x 128 block gets scale amax / 448 (or that rounded up to a power of two) and codes within half a step.
TEST(Fp8Encoding, BlockQuantizationScalesEachBlockByItsLargestValue) {
  const int64_t rows = 200, cols = 300;  // partial blocks on both edges
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(0.37f * static_cast<float>(i)) * static_cast<float>(1 + (i / cols) % 7) * 0.01f;
  }
  for (const Fp8ScaleFormat format : {Fp8ScaleFormat::kFloat, Fp8ScaleFormat::kUe8m0}) {
    std::vector<uint8_t> codes(values.size());
    std::vector<float> scales(static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols)));
    quantize_fp8_block_rows(values, rows, cols, format, codes, scales);
    std::vector<float> amax(scales.size(), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float& m = amax[static_cast<size_t>((r / 128) * fp8_blocks(cols) + c / 128)];
        m = std::max(m, std::fabs(values[static_cast<size_t>(r * cols + c)]));
      }
    }
    for (size_t b = 0; b < scales.size(); ++b) {
      if (format == Fp8ScaleFormat::kFloat) {
        EXPECT_EQ(scales[b], amax[b] / 448.0f) << "block " << b;
      } else {
        EXPECT_GE(scales[b], amax[b] / 448.0f) << "block " << b;
        EXPECT_LT(scales[b], 2.0f * amax[b] / 448.0f) << "block " << b;
        int exponent = 0;
        EXPECT_EQ(std::frexp(scales[b], &exponent), 0.5f) << "block " << b << " scale is a power of two";
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<size_t>(r * cols + c);
        const float scale = scales[static_cast<size_t>((r / 128) * fp8_blocks(cols) + c / 128)];
        EXPECT_EQ(codes[i], float_to_e4m3(values[i] / scale)) << "element " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- loading

// Dimensions in whole 128-blocks where the fused layouts need them (experts, gate/up), with partial block rows
// elsewhere (kv_a_proj's 128 + 8 rows, q_b_proj's 2 * 72).
ModelConfig fp8_config() {
  ModelConfig c;
  c.version = ModelVersion::kV3;
  c.vocab_size = 64;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 64;
  c.n_routed_experts = 3;
  c.n_shared_experts = 2;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  return c;
}

// The linear layers DeepSeek's FP8 release quantizes (and kv_b_proj, which the loader widens).
bool is_fp8_in_release(const std::string& name) {
  return name.ends_with("proj.weight") || name.ends_with("proj_with_mqa.weight");
}

// Records the shape of every tensor read, and counts stored-FP8 reads.
class CountingSource final : public WeightSource {
 public:
  explicit CountingSource(const WeightSource& inner) : inner_(inner) {}
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  std::optional<std::vector<int64_t>> stored_shape(const std::string& name) const override {
    return inner_.stored_shape(name);
  }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    shapes_[name] = std::vector<int64_t>(shape.begin(), shape.end());
    inner_.read_rows(name, shape, first_row, num_rows, out);
  }
  bool stores_fp8(const std::string& name) const override { return inner_.stores_fp8(name); }
  void read_fp8_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                     std::span<uint8_t> codes, std::span<float> scale_inv) const override {
    ++fp8_reads_[name];
    inner_.read_fp8_rows(name, shape, first_row, num_rows, codes, scale_inv);
  }
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  const std::map<std::string, int>& fp8_reads() const { return fp8_reads_; }

 private:
  const WeightSource& inner_;
  mutable std::map<std::string, std::vector<int64_t>> shapes_;
  mutable std::map<std::string, int> fp8_reads_;
};

// A checkpoint of `c` from `values` with every linear layer quantized to FP8 (codes and scales from
// quantize_fp8_block_rows), the rest float32.
void write_fp8_checkpoint(const std::filesystem::path& dir, const ModelConfig& c, const WeightSource& values) {
  CountingSource recording(values);
  (void)load_weights(c, recording);
  std::vector<RawTensor> tensors;
  for (const auto& [name, shape] : recording.shapes()) {
    std::vector<float> v(static_cast<size_t>(Shape(shape).numel()));
    values.read(name, shape, v);
    if (!is_fp8_in_release(name)) {
      tensors.push_back({name, "F32", shape, to_bytes(v)});
      continue;
    }
    std::vector<uint8_t> codes(v.size());
    std::vector<float> scales(static_cast<size_t>(fp8_blocks(shape[0]) * fp8_blocks(shape[1])));
    quantize_fp8_block_rows(v, shape[0], shape[1], Fp8ScaleFormat::kFloat, codes, scales);
    tensors.push_back({name, "F8_E4M3", shape, codes});
    tensors.push_back({name + "_scale_inv", "F32", {fp8_blocks(shape[0]), fp8_blocks(shape[1])}, to_bytes(scales)});
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

// Every linear weight of `w`, by name.
std::map<std::string, const Weight*> linear_weights(const ModelWeights& w) {
  std::map<std::string, const Weight*> out;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    out[p + "q_a_proj"] = &l.attn.q_a_proj;
    out[p + "q_b_proj"] = &l.attn.q_b_proj;
    out[p + "kv_a_proj"] = &l.attn.kv_a_proj;
    out[p + "o_proj"] = &l.attn.o_proj;
    if (l.mlp) {
      out[p + "mlp.gate_up"] = &l.mlp->gate_up;
      out[p + "mlp.down"] = &l.mlp->down;
    }
    if (l.moe) {
      out[p + "experts_gate_up"] = &l.moe->experts_gate_up;
      out[p + "experts_down"] = &l.moe->experts_down;
    }
  }
  return out;
}

// The float32 values of a host FP8 weight (2-D or stacked).
std::vector<float> dequantized(const Weight& w) {
  EXPECT_TRUE(w.is_fp8());
  const WeightView v = w.cview();
  const int64_t matrices = v.shape.ndim() == 3 ? v.shape[0] : 1;
  const int64_t rows = v.shape[v.shape.ndim() - 2], cols = v.shape[v.shape.ndim() - 1];
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t e = 0; e < matrices; ++e) {
    const WeightView m = v.shape.ndim() == 3 ? v.matrix(e) : v;
    dequantize_fp8_blocks({m.as<uint8_t>(), static_cast<size_t>(rows * cols)}, rows, cols,
                          {m.scale_inv.as<float>(), static_cast<size_t>(m.scale_inv.numel())}, {128, 128},
                          std::span<float>(out).subspan(static_cast<size_t>(e * rows * cols),
                                                        static_cast<size_t>(rows * cols)));
  }
  return out;
}

std::vector<float> values_of(const Tensor& t) { return {t.f32(), t.f32() + t.numel()}; }

// A stored FP8 checkpoint goes into an FP8 sink as stored: every linear weight arrives through read_fp8_rows (the
// fused gate/up, the stacked experts, the shared experts' columns of down_proj included), and its values are exactly
// those the float32 load dequantizes.
TEST(LoadFp8Weights, StoredFp8IsPlacedAsStored) {
  ModelConfig c = fp8_config();
  c.fp8.enabled = true;
  TempDir dir("deepinfer_fp8_test");
  write_fp8_checkpoint(dir.path(), c, *make_dummy_source(3));
  const auto checkpoint = open_checkpoint_source(dir.path(), c);
  CountingSource source(*checkpoint);
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  const ModelWeights fp8 = load_weights(c, source, *sink);
  const ModelWeights f32 = load_weights(c, *checkpoint);  // dequantized while read
  const auto got = linear_weights(fp8), want = linear_weights(f32);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : got) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(w->is_fp8());
    EXPECT_EQ(w->shape(), want.at(name)->shape());
    EXPECT_EQ(dequantized(*w), values_of(want.at(name)->values));
  }
  for (const auto& [name, shape] : source.shapes()) {
    if (!is_fp8_in_release(name) || name.find("kv_b_proj") != std::string::npos) continue;
    ADD_FAILURE() << name << " was read as float32";
  }
  EXPECT_GT(source.fp8_reads().count("model.layers.1.mlp.shared_experts.down_proj.weight"), 0u);
  EXPECT_FALSE(fp8.layers[1].attn.kv_b_proj.dtype() == DType::kF8E4M3);  // widened: prefill and W_UK / W_UV use it
  EXPECT_EQ(fp8.layers[1].moe->gate.dtype(), DType::kF32);               // the router stays wide
}

// A float32/bf16 source goes into an FP8 sink quantized per 128 x 128 block of the placed (fused) weight: the same
// codes and scales quantize_fp8_block_rows gives for the float32 weight.
class LoadFp8WideWeights : public ::testing::TestWithParam<int64_t> {};

// The intermediate sizes: whole blocks (gate and up each), and 200, whose gate/up seam and end fall inside blocks.
INSTANTIATE_TEST_SUITE_P(Intermediate, LoadFp8WideWeights, ::testing::Values(int64_t{256}, int64_t{200}));

TEST_P(LoadFp8WideWeights, AreQuantizedPerBlock) {
  ModelConfig c = fp8_config();
  c.intermediate_size = GetParam();
  const auto source = make_dummy_source(8);
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  const ModelWeights fp8 = load_weights(c, *source, *sink);
  const ModelWeights f32 = load_weights(c, *source);
  for (const auto& [name, w] : linear_weights(fp8)) {
    SCOPED_TRACE(name);
    const Tensor& ref = linear_weights(f32).at(name)->values;
    const int64_t rows = ref.shape()[ref.shape().ndim() - 2], cols = ref.shape()[ref.shape().ndim() - 1];
    const int64_t matrices = ref.numel() / (rows * cols);
    std::vector<uint8_t> codes(static_cast<size_t>(ref.numel()));
    std::vector<float> scales(static_cast<size_t>(matrices * fp8_blocks(rows) * fp8_blocks(cols)));
    for (int64_t e = 0; e < matrices; ++e) {
      const auto n = static_cast<size_t>(rows * cols), nb = static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols));
      quantize_fp8_block_rows({ref.f32() + e * rows * cols, n}, rows, cols, Fp8ScaleFormat::kFloat,
                              std::span<uint8_t>(codes).subspan(e * n, n),
                              std::span<float>(scales).subspan(e * nb, nb));
    }
    ASSERT_TRUE(w->is_fp8());
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), w->values.view().as<uint8_t>()));
    EXPECT_TRUE(std::equal(scales.begin(), scales.end(), w->scale_inv.f32()));
  }
  // kv_b_proj stays float32 but holds its FP8 values, as DeepSeek's FP8 release stores it.
  const Tensor& kv_b = fp8.layers[0].attn.kv_b_proj;
  const Tensor& kv_b_ref = f32.layers[0].attn.kv_b_proj;
  const int64_t rows = kv_b.shape()[0], cols = kv_b.shape()[1];
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols))), rounded(codes.size());
  quantize_fp8_block_rows(values_of(kv_b_ref), rows, cols, Fp8ScaleFormat::kFloat, codes, scales);
  dequantize_fp8_blocks(codes, rows, cols, scales, {128, 128}, rounded);
  ASSERT_EQ(kv_b.dtype(), DType::kF32);
  EXPECT_EQ(values_of(kv_b), rounded);
  EXPECT_NE(values_of(kv_b), values_of(kv_b_ref));
}

// The emulating sink holds in float32 exactly the values of the FP8 weights.
TEST(LoadFp8Weights, EmulationHoldsTheDequantizedValues) {
  const ModelConfig c = fp8_config();
  const auto source = make_dummy_source(4);
  const std::unique_ptr<WeightSink> fp8_sink = make_host_sink({.fp8 = true});
  const std::unique_ptr<WeightSink> emulating = make_fp8_emulating_host_sink();
  const ModelWeights fp8 = load_weights(c, *source, *fp8_sink);
  const ModelWeights emulated = load_weights(c, *source, *emulating);
  for (const auto& [name, w] : linear_weights(emulated)) {
    SCOPED_TRACE(name);
    ASSERT_EQ(w->dtype(), DType::kF32);
    EXPECT_EQ(values_of(w->values), dequantized(*linear_weights(fp8).at(name)));
  }
}

// Gate and up rows that do not fill whole blocks share the block rows at their seam: such weights are assembled
// before they are quantized, and a weight left with a block row written only in part is an error.
TEST(LoadFp8Weights, BlockRowsAreQuantizedOnlyWhenWhole) {
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  Weight w = sink->allocate_linear({200, 128});
  std::vector<float> rows(100 * 128, 0.5f);
  sink->write(w, 0, rows);
  EXPECT_THROW(sink->finish(), Error);
  sink->write(w, 100 * 128, rows);
  EXPECT_NO_THROW(sink->finish());
  EXPECT_EQ(dequantized(w), std::vector<float>(200 * 128, 0.5f));
  EXPECT_THROW(sink->write(w, 64, std::span<const float>(rows).first(128)), Error);  // not a whole row
}

TEST(LoadFp8Weights, ResidentBytesAreCountedByDtype) {
  const ModelConfig c = fp8_config();
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  const ModelWeights w = load_weights(c, *make_dummy_source(1), *sink);
  int64_t fp8_elements = 0;
  for (const auto& [name, weight] : linear_weights(w)) fp8_elements += weight->numel();
  std::map<DType, int64_t> bytes;
  for (const auto& [dtype, n] : weight_bytes_by_dtype(w)) bytes[dtype] = n;
  EXPECT_EQ(bytes.at(DType::kF8E4M3), fp8_elements);
  EXPECT_GT(bytes.at(DType::kF32), 0);
}

}  // namespace
}  // namespace deepinfer
