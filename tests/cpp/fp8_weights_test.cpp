// FP8 weights on the host: the e4m3 encoder against the decoder's table, block quantization, and load_weights into
// FP8 sinks (stored FP8 placed as stored, bf16 quantized per block, float32 emulation, the layers an FP8 checkpoint
// or DeepSeek's FP8 release leaves unquantized kept plain).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "core/weight.h"
#include "model/sharded_source.h"
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
  bool fp8_checkpoint() const override { return inner_.fp8_checkpoint(); }
  bool stored_fp8(const std::string& name) const override { return inner_.stored_fp8(name); }
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

// A checkpoint of `c` (and its MTP layer where c.num_nextn_predict_layers > 0) from `values` with every linear layer
// quantized to FP8 (codes and scales from quantize_fp8_block_rows) but the tensors named in `bf16`, stored in
// bfloat16 without scales (as DeepSeek-V3 stores its MTP eh_proj), the rest float32.
void write_fp8_checkpoint(const std::filesystem::path& dir, const ModelConfig& c, const WeightSource& values,
                          const std::set<std::string>& bf16 = {}) {
  CountingSource recording(values);
  const std::unique_ptr<WeightSink> f32 = make_host_sink();
  (void)load_weights(c, recording, *f32, {}, {}, /*with_mtp=*/c.num_nextn_predict_layers > 0);
  std::vector<RawTensor> tensors;
  for (const auto& [name, shape] : recording.shapes()) {
    std::vector<float> v(static_cast<size_t>(Shape(shape).numel()));
    values.read(name, shape, v);
    if (bf16.contains(name)) {
      std::vector<uint16_t> bits(v.size());
      std::transform(v.begin(), v.end(), bits.begin(), float_to_bf16);
      tensors.push_back({name, "BF16", shape, to_bytes(bits)});
      continue;
    }
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

// The linear weights of decoder layer `l` into `out`, by name after `p`.
void add_layer_linears(const LayerWeights& l, const std::string& p, std::map<std::string, const Weight*>& out) {
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

// Every linear weight of `w`'s main layers (and of its MTP layer's block, as "mtp.*"; eh_proj apart), by name.
std::map<std::string, const Weight*> linear_weights(const ModelWeights& w) {
  std::map<std::string, const Weight*> out;
  for (size_t i = 0; i < w.layers.size(); ++i) add_layer_linears(w.layers[i], "layers." + std::to_string(i) + ".", out);
  if (w.mtp) add_layer_linears(w.mtp->block, "mtp.", out);
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

// ---------------------------------------------------------------------------------------------- unquantized layers

// fp8_config with DeepSeek-V3's MTP layer (model.layers.2.*, a MoE block).
ModelConfig fp8_config_with_mtp() {
  ModelConfig c = fp8_config();
  c.num_nextn_predict_layers = 1;
  return c;
}

// The stored codes and scales of 2-D FP8 tensor `name` of `checkpoint`.
std::pair<std::vector<uint8_t>, std::vector<float>> stored_codes(const WeightSource& checkpoint,
                                                                 const std::string& name, const Shape& shape) {
  std::vector<uint8_t> codes(static_cast<size_t>(shape.numel()));
  std::vector<float> scales(static_cast<size_t>(fp8_blocks(shape[0]) * fp8_blocks(shape[1])));
  checkpoint.read_fp8_rows(name, shape.dims(), 0, shape[0], codes, scales);
  return {codes, scales};
}

// A layer an FP8 checkpoint stores in bf16 without a scale (an ignore list's o_proj; DeepSeek-V3's MTP eh_proj) goes
// into an FP8 sink as a plain matrix holding exactly its stored values, rather than being rounded to FP8 at load;
// its FP8 neighbours keep their stored codes and scales bit for bit. On one rank and on a tensor-parallel rank, whose
// o_proj is a slice of the stored columns.
class Fp8CheckpointWithBf16Layers : public ::testing::TestWithParam<ModelShard> {};

INSTANTIATE_TEST_SUITE_P(Shards, Fp8CheckpointWithBf16Layers,
                         ::testing::Values(ModelShard{}, ModelShard{.rank = 1, .size = 2}),
                         [](const auto& info) { return info.param.whole() ? "Whole" : "TpRank1Of2"; });

TEST_P(Fp8CheckpointWithBf16Layers, KeepThoseLayersInTheModelDtype) {
  ModelConfig c = fp8_config_with_mtp();
  c.fp8.enabled = true;
  const std::string o_proj_name = "model.layers.0.self_attn.o_proj.weight";
  const std::string eh_proj_name = "model.layers.2.eh_proj.weight";
  TempDir dir("deepinfer_fp8_bf16_test");
  const auto values = make_dummy_source(5);
  write_fp8_checkpoint(dir.path(), c, *values, {o_proj_name, eh_proj_name});
  const ModelShard shard = GetParam();
  const ModelConfig local = local_config(c, shard);
  const auto checkpoint = open_checkpoint_source(dir.path(), c);
  const auto source = make_sharded_source(*checkpoint, shard);
  const std::unique_ptr<WeightSink> fp8_sink = make_host_sink({.fp8 = true}), f32_sink = make_host_sink();
  const ModelWeights fp8 = load_weights(local, *source, *fp8_sink, {}, shard, /*with_mtp=*/true);
  const ModelWeights f32 = load_weights(local, *source, *f32_sink, {}, shard, /*with_mtp=*/true);  // as stored

  const Weight& o_proj = fp8.layers[0].attn.o_proj;
  ASSERT_FALSE(o_proj.is_fp8());
  EXPECT_FALSE(fp8_sink->is_fp8_weight(o_proj));
  EXPECT_EQ(o_proj.dtype(), DType::kF32);  // the host sink's matrix dtype (bf16 on a GPU)
  EXPECT_EQ(values_of(o_proj.values), values_of(f32.layers[0].attn.o_proj.values));
  ASSERT_TRUE(fp8.mtp.has_value());
  const Weight& eh_proj = fp8.mtp->eh_proj;
  ASSERT_FALSE(eh_proj.is_fp8());
  // The checkpoint's values: the source's, rounded to bf16 once when the checkpoint was written, and nothing else.
  std::vector<float> eh_values(static_cast<size_t>(eh_proj.numel()));
  values->read(eh_proj_name, eh_proj.shape().dims(), eh_values);
  for (float& v : eh_values) v = bf16_to_float(float_to_bf16(v));
  EXPECT_EQ(values_of(eh_proj.values), eh_values);

  // Every other linear weight is FP8: on one rank exactly the stored FP8 values (a TP rank's slices off the 128 x 128
  // blocks are quantized again); the replicated q_a_proj keeps its stored codes and scales bit for bit.
  int64_t fp8_elements = 0;
  for (const auto& [name, w] : linear_weights(fp8)) {
    if (name == "layers.0.o_proj") continue;
    SCOPED_TRACE(name);
    ASSERT_TRUE(w->is_fp8());
    fp8_elements += w->numel();
    if (shard.whole()) {
      EXPECT_EQ(dequantized(*w), values_of(linear_weights(f32).at(name)->values));
    }
  }
  for (const std::string layer : {"0", "2"}) {
    const std::string name = "model.layers." + layer + ".self_attn.q_a_proj.weight";
    SCOPED_TRACE(name);
    const Weight& q_a = layer == "0" ? fp8.layers[0].attn.q_a_proj : fp8.mtp->block.attn.q_a_proj;
    const auto [codes, scales] = stored_codes(*checkpoint, name, q_a.shape());
    ASSERT_TRUE(q_a.is_fp8());
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), q_a.values.view().as<uint8_t>()));
    EXPECT_TRUE(std::equal(scales.begin(), scales.end(), q_a.scale_inv.f32()));
  }
  // The load log's bytes: the two plain layers count in the matrix dtype, not as FP8.
  std::map<DType, int64_t> bytes;
  for (const auto& [dtype, n] : weight_bytes_by_dtype(fp8)) bytes[dtype] = n;
  EXPECT_EQ(bytes.at(DType::kF8E4M3), fp8_elements);
}

// Quantizing at load (a bf16 checkpoint into an FP8 sink) rounds every linear weight DeepSeek's FP8 release stores in
// FP8, the MTP layer's block included, and keeps eh_proj in the model dtype as that release does; the emulating sink
// holds the same FP8 values in float32 and eh_proj as read.
TEST(LoadFp8Weights, QuantizingAtLoadKeepsEhProjInTheModelDtype) {
  const ModelConfig c = fp8_config_with_mtp();
  const auto source = make_dummy_source(6);
  const std::unique_ptr<WeightSink> fp8_sink = make_host_sink({.fp8 = true});
  const std::unique_ptr<WeightSink> emulating = make_fp8_emulating_host_sink();
  const std::unique_ptr<WeightSink> f32_sink = make_host_sink();
  const ModelWeights fp8 = load_weights(c, *source, *fp8_sink, {}, {}, /*with_mtp=*/true);
  const ModelWeights emulated = load_weights(c, *source, *emulating, {}, {}, /*with_mtp=*/true);
  const ModelWeights f32 = load_weights(c, *source, *f32_sink, {}, {}, /*with_mtp=*/true);
  const auto fp8_linears = linear_weights(fp8), emulated_linears = linear_weights(emulated);
  ASSERT_TRUE(fp8_linears.contains("mtp.experts_gate_up"));
  for (const auto& [name, w] : fp8_linears) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(w->is_fp8());
    const Weight& e = *emulated_linears.at(name);
    EXPECT_TRUE(emulating->is_fp8_weight(e));
    EXPECT_EQ(values_of(e.values), dequantized(*w));
    EXPECT_NE(values_of(e.values), values_of(linear_weights(f32).at(name)->values));  // the rounding is real
  }
  const std::vector<float> eh_proj = values_of(f32.mtp->eh_proj.values);
  ASSERT_FALSE(fp8.mtp->eh_proj.is_fp8());
  EXPECT_EQ(values_of(fp8.mtp->eh_proj.values), eh_proj);
  EXPECT_FALSE(emulating->is_fp8_weight(emulated.mtp->eh_proj));
  EXPECT_EQ(values_of(emulated.mtp->eh_proj.values), eh_proj);
}

// Dummy weights of an FP8 config that leaves modules unquantized (modules_to_not_convert): quantizing at load keeps
// those in the model dtype, as the memory plan counts them, and rounds the rest.
TEST(LoadFp8Weights, QuantizingAtLoadFollowsTheConfigsList) {
  ModelConfig c = fp8_config();
  c.fp8.enabled = true;
  c.quantized_modules = QuantizedModules(QuantizedModules::Matching::kSubstring, {}, {"self_attn"}, "test");
  const auto source = make_dummy_source(12);
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  const std::unique_ptr<WeightSink> f32_sink = make_host_sink();
  const ModelWeights w = load_weights(c, *source, *sink);
  const ModelWeights f32 = load_weights(c, *source, *f32_sink);
  const auto plain = linear_weights(f32);
  int attention = 0, fp8 = 0;
  for (const auto& [name, weight] : linear_weights(w)) {
    SCOPED_TRACE(name);
    const bool in_attention = name.find("q_") != std::string::npos || name.find("kv_a") != std::string::npos ||
                              name.find("o_proj") != std::string::npos;
    EXPECT_EQ(weight->is_fp8(), !in_attention);
    if (in_attention) {
      EXPECT_EQ(values_of(weight->values), values_of(plain.at(name)->values));
      ++attention;
    } else {
      ++fp8;
    }
  }
  EXPECT_GT(attention, 0);
  EXPECT_GT(fp8, 0);
}

// A sink writes a linear weight by what the weight is: a plain matrix in an FP8 sink takes any range of values as
// they are (an FP8 weight takes whole rows only, and quantizes them).
TEST(LoadFp8Weights, PlainWeightsInAnFp8SinkAreWrittenAsMatrices) {
  for (const bool emulate : {false, true}) {
    SCOPED_TRACE(emulate ? "emulating sink" : "FP8 sink");
    const std::unique_ptr<WeightSink> sink = emulate ? make_fp8_emulating_host_sink() : make_host_sink({.fp8 = true});
    Weight plain(sink->allocate({3, 5}, WeightRole::kMatrix));
    const Weight fp8 = sink->allocate_linear({3, 5});
    EXPECT_FALSE(sink->is_fp8_weight(plain));
    EXPECT_TRUE(sink->is_fp8_weight(fp8));
    const std::vector<float> values = {0.1f, -0.2f, 0.3f, 0.7f, -1.5f, 2.25f, 1e-3f};
    sink->write(plain, 4, values);  // not whole rows
    EXPECT_NO_THROW(sink->finish());
    EXPECT_TRUE(std::equal(values.begin(), values.end(), plain.values.f32() + 4));
  }
}

// A stacked weight takes the format of its first tensor; an FP8 checkpoint whose pieces of one stack disagree (gate
// FP8, up bf16; routed experts FP8, shared ones bf16) is refused, naming the two tensors, rather than having its bf16
// pieces rounded to FP8. Loaded without FP8 weights (every tensor read as float32 values) it is fine.
TEST(LoadFp8Weights, AStackOfFp8AndUnquantizedTensorsIsRefused) {
  ModelConfig c = fp8_config();
  c.fp8.enabled = true;
  const auto values = make_dummy_source(7);
  const std::vector<std::pair<std::set<std::string>, std::vector<std::string>>> cases = {
      {{"model.layers.0.mlp.up_proj.weight"},
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}},
      {{"model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
        "model.layers.1.mlp.shared_experts.down_proj.weight"},
       {"model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.shared_experts.gate_proj.weight"}},
  };
  for (const auto& [bf16, named] : cases) {
    SCOPED_TRACE(*bf16.begin());
    TempDir dir("deepinfer_fp8_mixed_test");
    write_fp8_checkpoint(dir.path(), c, *values, bf16);
    const auto checkpoint = open_checkpoint_source(dir.path(), c);
    const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
    std::vector<std::string> parts = named;
    parts.push_back("one format");
    expect_error([&] { (void)load_weights(c, *checkpoint, *sink); }, parts);
    EXPECT_NO_THROW((void)load_weights(c, *checkpoint));
  }
}

// The ops take a plain weight beside FP8 ones: the CPU backend's multi_linear (the reference of the fused CUDA op)
// over an FP8 and a plain target, one of them SwiGLU's gate_up, gives each target what linear gives it alone.
TEST(LoadFp8Weights, MultiLinearTakesFp8AndPlainTargetsTogether) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::unique_ptr<WeightSink> sink = make_host_sink({.fp8 = true});
  const int64_t m = 3, k = 128;
  Weight fp8 = sink->allocate_linear({256, k});
  Weight plain(sink->allocate({10, k}, WeightRole::kMatrix));
  const auto fill = [](std::vector<float>& v, float step) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(step * static_cast<float>(i)) * 0.05f;
  };
  std::vector<float> fp8_values(256 * k), plain_values(10 * k), x_values(m * k);
  fill(fp8_values, 0.31f);
  fill(plain_values, 0.17f);
  fill(x_values, 0.73f);
  sink->write(fp8, 0, fp8_values);
  sink->write(plain, 0, plain_values);
  sink->finish();
  Tensor x = Tensor::empty({m, k}, DType::kF32);
  std::copy(x_values.begin(), x_values.end(), x.f32());
  for (const bool fp8_gate_up : {false, true}) {
    SCOPED_TRACE(fp8_gate_up ? "FP8 gate_up, plain linear" : "FP8 linear, plain gate_up");
    const Weight& gate_up = fp8_gate_up ? fp8 : plain;
    const Weight& other = fp8_gate_up ? plain : fp8;
    Tensor act = Tensor::empty({m, gate_up.shape()[0] / 2}, DType::kF32);
    Tensor out = Tensor::empty({m, other.shape()[0]}, DType::kF32);
    const std::vector<LinearTarget> targets = {{.w = gate_up.cview(), .out = act.view(), .silu_mul = true},
                                               {.w = other.cview(), .out = out.view()}};
    cpu->multi_linear({.x = x.cview(), .targets = targets});
    Tensor act_alone = Tensor::empty(act.shape(), DType::kF32), out_alone = Tensor::empty(out.shape(), DType::kF32);
    cpu->linear_silu_mul({.x = x.cview(), .w = gate_up.cview(), .out = act_alone.view()});
    cpu->linear({.x = x.cview(), .w = other.cview(), .out = out_alone.view()});
    EXPECT_EQ(values_of(act), values_of(act_alone));
    EXPECT_EQ(values_of(out), values_of(out_alone));
  }
}

}  // namespace
}  // namespace deepinfer
