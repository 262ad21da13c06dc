// Loading weights: row-range reads (dummy and checkpoint sources, FP8 blocks included), the dummy generator, and
// load_weights placing every tensor through a sink, one piece at a time.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dummy_normal.h"
#include "core/error.h"
#include "core/half.h"
#include "model/checkpoint.h"
#include "model/int4_source.h"
#include "model/model_shard.h"
#include "model/sharded_source.h"
#include "core/fp8.h"
#include "model/weight_sink.h"
#include "safetensors_writer.h"

#ifdef DEEPINFER_HAVE_CUDA
#include <sys/resource.h>

#include "backend/cuda/cuda_backend.h"
#include "cuda_device_required.h"
#endif

namespace deepinfer {
namespace {

using namespace test;  // NOLINT: the shared test helpers

// ---------------------------------------------------------------------------------------------- helpers

// Every width below is at most one expert's gate_up ([2 * 48, 32] = 3072 values), so that "no write is larger than
// one expert" holds for the whole model.
ModelConfig tiny_config(ModelVersion version) {
  ModelConfig c;
  c.version = version;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.moe_intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  if (version == ModelVersion::kV3) c.q_lora_rank = 24;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  return c;
}

int64_t expert_gate_up_size(const ModelConfig& c) { return 2 * c.moe_intermediate_size * c.hidden_size; }

std::vector<float> read_whole(const WeightSource& source, const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  source.read(name, shape, out);
  return out;
}

// Every tensor of `w`, named by where it sits (empty ones included).
std::vector<std::pair<std::string, const Tensor*>> tensors_of(const ModelWeights& w) {
  std::vector<std::pair<std::string, const Tensor*>> out = {{"embed", &w.embed}, {"norm", &w.norm},
                                                            {"lm_head", &w.lm_head}};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const MlaWeights& a = l.attn;
    for (const auto& [name, t] : std::vector<std::pair<std::string, const Tensor*>>{
             {"input_norm", &l.input_norm},   {"post_attention_norm", &l.post_attention_norm},
             {"attn.q_proj", &a.q_proj.values},      {"attn.q_a_proj", &a.q_a_proj.values},
             {"attn.q_a_norm", &a.q_a_norm},  {"attn.q_b_proj", &a.q_b_proj.values},
             {"attn.kv_a_proj", &a.kv_a_proj.values}, {"attn.kv_a_norm", &a.kv_a_norm},
             {"attn.kv_b_proj", &a.kv_b_proj}, {"attn.w_uk_t", &a.w_uk_t},
             {"attn.w_uv", &a.w_uv},          {"attn.o_proj", &a.o_proj.values}}) {
      out.emplace_back(p + name, t);
    }
    const auto mlp = [&](const std::string& q, const MlpWeights& m) {
      out.emplace_back(p + q + "gate_up", &m.gate_up.values);
      out.emplace_back(p + q + "down", &m.down.values);
    };
    if (l.mlp) mlp("mlp.", *l.mlp);
    if (l.moe) {
      out.emplace_back(p + "moe.gate", &l.moe->gate);
      out.emplace_back(p + "moe.correction_bias", &l.moe->correction_bias);
      out.emplace_back(p + "moe.experts_gate_up", &l.moe->experts_gate_up.values);
      out.emplace_back(p + "moe.experts_down", &l.moe->experts_down.values);
    }
  }
  return out;
}

struct RefTensor {
  Shape shape;
  std::vector<float> values;
};

// What ModelWeights must hold, built the plain way: whole reads, concatenations and per-head loops.
std::map<std::string, RefTensor> reference_weights(const ModelConfig& c, const WeightSource& s) {
  std::map<std::string, RefTensor> ref;
  const int64_t d = c.hidden_size, v = c.vocab_size, h = c.num_attention_heads, rank = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim, e = c.n_routed_experts, mi = c.moe_intermediate_size;
  const auto put = [&](const std::string& key, Shape shape, std::vector<float> values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), shape.numel()) << key;
    ref[key] = {shape, std::move(values)};
  };
  const auto concat = [](std::vector<float> a, const std::vector<float>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  put("embed", {v, d}, read_whole(s, "model.embed_tokens.weight", {v, d}));
  put("norm", {d}, read_whole(s, "model.norm.weight", {d}));
  const bool tied = c.tie_word_embeddings && !s.contains("lm_head.weight");
  put("lm_head", {v, d}, read_whole(s, tied ? "model.embed_tokens.weight" : "lm_head.weight", {v, d}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string k = "layers." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    put(k + "input_norm", {d}, read_whole(s, p + "input_layernorm.weight", {d}));
    put(k + "post_attention_norm", {d}, read_whole(s, p + "post_attention_layernorm.weight", {d}));
    if (c.q_lora_rank) {
      const int64_t q = *c.q_lora_rank;
      put(k + "attn.q_a_proj", {q, d}, read_whole(s, a + "q_a_proj.weight", {q, d}));
      put(k + "attn.q_a_norm", {q}, read_whole(s, a + "q_a_layernorm.weight", {q}));
      const int64_t qk = h * c.qk_head_dim();
      put(k + "attn.q_b_proj", {qk, q}, read_whole(s, a + "q_b_proj.weight", {qk, q}));
    } else {
      put(k + "attn.q_proj", {h * c.qk_head_dim(), d}, read_whole(s, a + "q_proj.weight", {h * c.qk_head_dim(), d}));
    }
    put(k + "attn.kv_a_proj", {c.latent_dim(), d}, read_whole(s, a + "kv_a_proj_with_mqa.weight", {c.latent_dim(), d}));
    put(k + "attn.kv_a_norm", {rank}, read_whole(s, a + "kv_a_layernorm.weight", {rank}));
    const std::vector<float> kv_b = read_whole(s, a + "kv_b_proj.weight", {h * (nope + vd), rank});
    std::vector<float> uk_t(static_cast<size_t>(h * rank * nope)), uv(static_cast<size_t>(h * vd * rank));
    for (int64_t head = 0; head < h; ++head) {
      const float* rows = kv_b.data() + head * (nope + vd) * rank;
      for (int64_t n = 0; n < nope; ++n) {
        for (int64_t r = 0; r < rank; ++r) uk_t[static_cast<size_t>((head * rank + r) * nope + n)] = rows[n * rank + r];
      }
      std::copy(rows + nope * rank, rows + (nope + vd) * rank, uv.begin() + head * vd * rank);
    }
    put(k + "attn.kv_b_proj", {h * (nope + vd), rank}, kv_b);
    put(k + "attn.w_uk_t", {h, rank, nope}, uk_t);
    put(k + "attn.w_uv", {h, vd, rank}, uv);
    put(k + "attn.o_proj", {d, h * vd}, read_whole(s, a + "o_proj.weight", {d, h * vd}));
    const auto mlp = [&](const std::string& key, const std::string& prefix, int64_t inter) {
      put(key + "gate_up", {2 * inter, d},
          concat(read_whole(s, prefix + "gate_proj.weight", {inter, d}),
                 read_whole(s, prefix + "up_proj.weight", {inter, d})));
      put(key + "down", {d, inter}, read_whole(s, prefix + "down_proj.weight", {d, inter}));
    };
    if (!c.is_moe_layer(i)) {
      mlp(k + "mlp.", p + "mlp.", c.intermediate_size);
      continue;
    }
    put(k + "moe.gate", {e, d}, read_whole(s, p + "mlp.gate.weight", {e, d}));
    if (c.version == ModelVersion::kV3) {
      put(k + "moe.correction_bias", {e}, read_whole(s, p + "mlp.gate.e_score_correction_bias", {e}));
    }
    std::vector<float> gate_up, down;
    for (int64_t x = 0; x < e; ++x) {
      const std::string ep = p + "mlp.experts." + std::to_string(x) + ".";
      gate_up = concat(concat(gate_up, read_whole(s, ep + "gate_proj.weight", {mi, d})),
                       read_whole(s, ep + "up_proj.weight", {mi, d}));
      down = concat(down, read_whole(s, ep + "down_proj.weight", {d, mi}));
    }
    // Shared expert j after the routed ones: rows j * mi .. of gate_proj and up_proj, columns j * mi .. of down_proj.
    const int64_t sh = c.n_shared_experts;
    if (sh > 0) {
      const std::string sp = p + "mlp.shared_experts.";
      const std::vector<float> gate = read_whole(s, sp + "gate_proj.weight", {sh * mi, d});
      const std::vector<float> up = read_whole(s, sp + "up_proj.weight", {sh * mi, d});
      const std::vector<float> shared_down = read_whole(s, sp + "down_proj.weight", {d, sh * mi});
      for (int64_t j = 0; j < sh; ++j) {
        gate_up.insert(gate_up.end(), gate.begin() + j * mi * d, gate.begin() + (j + 1) * mi * d);
        gate_up.insert(gate_up.end(), up.begin() + j * mi * d, up.begin() + (j + 1) * mi * d);
        for (int64_t r = 0; r < d; ++r) {
          const auto row = shared_down.begin() + r * sh * mi + j * mi;
          down.insert(down.end(), row, row + mi);
        }
      }
    }
    put(k + "moe.experts_gate_up", {e + sh, 2 * mi, d}, gate_up);
    put(k + "moe.experts_down", {e + sh, d, mi}, down);
  }
  return ref;
}

void expect_bits_equal(std::span<const float> got, std::span<const float> expected, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(expected[i]))
        << what << " element " << i << ": " << got[i] << " vs " << expected[i];
  }
}

// Host float32 weights equal the reference, tensor by tensor; tensors the model does not use stay empty.
void expect_matches_reference(const ModelWeights& w, const std::map<std::string, RefTensor>& ref) {
  size_t compared = 0;
  for (const auto& [name, t] : tensors_of(w)) {
    const auto it = ref.find(name);
    if (it == ref.end()) {
      EXPECT_EQ(t->numel(), 0) << name << " should be empty";
      continue;
    }
    ASSERT_EQ(t->shape(), it->second.shape) << name;
    ASSERT_EQ(t->dtype(), DType::kF32) << name;
    expect_bits_equal(t->f32_span(), it->second.values, name);
    ++compared;
  }
  EXPECT_EQ(compared, ref.size());
}

// Records the (name, shape) of every tensor read, and forwards to another source.
class RecordingSource final : public WeightSource {
 public:
  explicit RecordingSource(const WeightSource& inner) : inner_(inner) {}
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    shapes_[name] = std::vector<int64_t>(shape.begin(), shape.end());
    inner_.read_rows(name, shape, first_row, num_rows, out);
  }
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }

 private:
  const WeightSource& inner_;
  mutable std::map<std::string, std::vector<int64_t>> shapes_;
};

// Host float32 tensors, counting how often each element is written and recording every write.
class RecordingSink final : public WeightSink {
 public:
  struct Write {
    const void* tensor;
    int64_t offset;
    int64_t count;
  };

  Tensor allocate(Shape shape, WeightRole role) override {
    EXPECT_GT(shape.numel(), 0) << "the loader allocated an empty tensor " << shape.str();
    Tensor t = host_->allocate(shape, role);
    writes_per_element_[t.view().data].assign(static_cast<size_t>(shape.numel()), 0);
    return t;
  }
  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    auto it = writes_per_element_.find(dst.view().data);
    ASSERT_NE(it, writes_per_element_.end()) << "a write into a tensor this sink did not allocate";
    ASSERT_LE(offset + static_cast<int64_t>(values.size()), dst.numel());
    for (size_t i = 0; i < values.size(); ++i) ++it->second[static_cast<size_t>(offset) + i];
    writes_.push_back({dst.view().data, offset, static_cast<int64_t>(values.size())});
    host_->write(dst, offset, values);
  }

  bool allocated(const Tensor& t) const { return writes_per_element_.contains(t.view().data); }
  // Elements written other than exactly once, over every tensor allocated.
  int64_t elements_not_written_once() const {
    int64_t bad = 0;
    for (const auto& [tensor, counts] : writes_per_element_) {
      bad += std::count_if(counts.begin(), counts.end(), [](uint8_t n) { return n != 1; });
    }
    return bad;
  }
  int64_t largest_write() const {
    int64_t largest = 0;
    for (const Write& w : writes_) largest = std::max(largest, w.count);
    return largest;
  }
  const std::vector<Write>& writes() const { return writes_; }

 private:
  std::unique_ptr<WeightSink> host_ = make_host_sink();
  std::map<const void*, std::vector<uint8_t>> writes_per_element_;
  std::vector<Write> writes_;
};

// Every tensor of `w` came from `sink` and was written exactly once, element by element.
void expect_every_element_written_once(const ModelWeights& w, const RecordingSink& sink) {
  for (const auto& [name, t] : tensors_of(w)) {
    if (t->numel() > 0) {
      EXPECT_TRUE(sink.allocated(*t)) << name << " did not go through the sink";
    }
  }
  EXPECT_EQ(sink.elements_not_written_once(), 0);
}

// Each write into the stacked expert tensors stays inside one expert, and no write is larger than one expert.
void expect_expert_sized_writes(const ModelConfig& c, const ModelWeights& w, const RecordingSink& sink) {
  std::map<const void*, int64_t> expert_size;
  for (const LayerWeights& l : w.layers) {
    if (!l.moe) continue;
    expert_size[l.moe->experts_gate_up.values.view().data] = expert_gate_up_size(c);
    expert_size[l.moe->experts_down.values.view().data] = c.hidden_size * c.moe_intermediate_size;
  }
  ASSERT_FALSE(expert_size.empty());
  for (const RecordingSink::Write& write : sink.writes()) {
    const auto it = expert_size.find(write.tensor);
    if (it == expert_size.end()) continue;
    EXPECT_EQ(write.offset / it->second, (write.offset + write.count - 1) / it->second)
        << "a write of " << write.count << " values at " << write.offset << " spans two experts";
  }
  EXPECT_LE(sink.largest_write(), expert_gate_up_size(c));
}

// Matrices in bfloat16 host memory, vectors in float32: what the CUDA backend's sink does, without a GPU.
class Bf16HostSink final : public WeightSink {
 public:
  Tensor allocate(Shape shape, WeightRole role) override {
    return Tensor::empty(shape, role == WeightRole::kMatrix ? DType::kBF16 : DType::kF32);
  }
  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    if (dst.dtype() == DType::kF32) {
      std::copy(values.begin(), values.end(), dst.f32() + offset);
      return;
    }
    uint16_t* bits = dst.view().as<uint16_t>() + offset;
    for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  }
};

// Norm weights and the router's bias stay float32; every other weight is a matrix.
bool is_vector_weight(const std::string& name) {
  return name.ends_with("norm") || name.ends_with("correction_bias");
}

using NamedTensors = std::vector<std::pair<std::string, const Tensor*>>;

// `got` (host memory, bfloat16 matrices and float32 vectors) holds `ref` (host float32) rounded to bfloat16.
void expect_bf16_rounding_of(const NamedTensors& got, const NamedTensors& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const std::string& name = ref[k].first;
    const Tensor& g = *got[k].second;
    const Tensor& r = *ref[k].second;
    ASSERT_EQ(g.shape(), r.shape()) << name;
    if (r.numel() == 0) continue;
    if (is_vector_weight(name)) {
      ASSERT_EQ(g.dtype(), DType::kF32) << name;
      expect_bits_equal(g.f32_span(), r.f32_span(), name);
      continue;
    }
    ASSERT_EQ(g.dtype(), DType::kBF16) << name;
    const uint16_t* bits = g.view().as<uint16_t>();
    const float* values = r.f32();
    for (int64_t i = 0; i < r.numel(); ++i) ASSERT_EQ(bits[i], float_to_bf16(values[i])) << name << " element " << i;
  }
}

// How write_checkpoint stores the routed experts: three tensors per expert, or fused as transformers 5 may store
// them (experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]).
enum class ExpertLayout : uint8_t { kSeparate, kFused };

// Writes every tensor the model `c` reads from `source` into DIR/model.safetensors, as float32; a tensor named in
// `replacements` is written as given there instead (which may add tensors, such as FP8 scales).
void write_checkpoint(const fs::path& dir, const ModelConfig& c, const WeightSource& source, ExpertLayout layout,
                      const std::vector<RawTensor>& replacements = {}) {
  RecordingSource recording(source);
  (void)load_weights(c, recording);
  std::vector<RawTensor> tensors = replacements;
  std::map<std::string, std::vector<float>> fused;  // name -> values, filled expert by expert
  const int64_t e = c.n_routed_experts, mi = c.moe_intermediate_size, d = c.hidden_size;
  for (const auto& [name, shape] : recording.shapes()) {
    if (std::any_of(replacements.begin(), replacements.end(), [&](const RawTensor& t) { return t.name == name; })) {
      continue;
    }
    std::vector<float> values = read_whole(source, name, shape);
    const size_t experts = name.find(".mlp.experts.");
    if (layout == ExpertLayout::kFused && experts != std::string::npos) {
      const std::string prefix = name.substr(0, experts + std::string(".mlp.experts.").size());
      const std::string rest = name.substr(prefix.size());  // "X.gate_proj.weight"
      const int64_t x = std::stoll(rest.substr(0, rest.find('.')));
      const std::string part = rest.substr(rest.find('.') + 1);
      const bool down = part == "down_proj.weight";
      std::vector<float>& all = fused[prefix + (down ? "down_proj" : "gate_up_proj")];
      all.resize(static_cast<size_t>(e * 2 * mi * d));  // large enough for either
      const int64_t offset = down ? x * d * mi : x * 2 * mi * d + (part == "up_proj.weight" ? mi * d : 0);
      std::copy(values.begin(), values.end(), all.begin() + offset);
      continue;
    }
    tensors.push_back({name, "F32", shape, to_bytes(values)});
  }
  for (auto& [name, values] : fused) {
    const bool down = name.ends_with("down_proj");
    values.resize(static_cast<size_t>(down ? e * d * mi : e * 2 * mi * d));
    tensors.push_back({name, "F32", down ? std::vector<int64_t>{e, d, mi} : std::vector<int64_t>{e, 2 * mi, d},
                       to_bytes(values)});
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

// ---------------------------------------------------------------------------------------------- row ranges

TEST(WeightSource, DummyRowRangesEqualTheWholeRead) {
  const auto source = make_dummy_source(7);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"a.weight", {1000, 37}}, {"experts.gate_up_proj", {5, 300, 7}}, {"v.weight", {4099}}};
  for (const auto& [name, shape] : tensors) {
    const std::vector<float> whole = read_whole(*source, name, shape);
    const int64_t row = static_cast<int64_t>(whole.size()) / shape[0];
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, shape[0]}, {0, 1}, {1, 1}, {3, 2}, {shape[0] - 1, 1}, {shape[0] / 3, shape[0] / 2}, {2, 0}}) {
      std::vector<float> part(static_cast<size_t>(count * row));
      source->read_rows(name, shape, first, count, part);
      expect_bits_equal(part, std::span<const float>(whole).subspan(static_cast<size_t>(first * row), part.size()),
                        name + " rows from " + std::to_string(first));
    }
  }
  std::vector<float> out(37);
  expect_error([&] { source->read_rows("a.weight", std::vector<int64_t>{1000, 37}, 1000, 1, out); },
               {"a.weight", "out of range"});
  expect_error([&] { source->read_rows("a.weight", std::vector<int64_t>{1000, 37}, 0, 2, out); },
               {"a.weight", "holds 37 floats"});
}

TEST(WeightSource, CheckpointRowRangesEqualTheWholeRead) {
  TempDir dir("deepinfer_weights_test");
  const int64_t rows = 300, cols = 200;  // FP8 scale grid 3 x 2, both last blocks partial
  std::vector<float> f32(7 * 5 * 3);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i) * 0.25f - 3.0f;
  std::vector<uint16_t> bf16(static_cast<size_t>(rows * 7)), f16(9 * 4);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = float_to_bf16(std::sin(static_cast<float>(i)));
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint16_t>(0x3c00 + i * 17);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((i * 37 + i / 11) % 256);
    if ((codes[i] & 0x7f) == 0x7f) codes[i] = 0x38;  // no NaN codes
  }
  const std::vector<float> scale = {0.5f, 2.0f, 0.125f, 3.0f, 1.5f, 0.25f};  // [3, 2]
  std::vector<uint16_t> scale_bf16(scale.size());
  for (size_t i = 0; i < scale.size(); ++i) scale_bf16[i] = float_to_bf16(scale[i]);
  write_safetensors(dir.path() / "model.safetensors",
                    {{"f32", "F32", {7, 5, 3}, to_bytes(f32)},
                     {"bf16", "BF16", {rows, 7}, to_bytes(bf16)},
                     {"f16", "F16", {9, 4}, to_bytes(f16)},
                     {"fp8.weight", "F8_E4M3", {rows, cols}, codes},
                     {"fp8.weight_scale_inv", "F32", {3, 2}, to_bytes(scale)},
                     {"fp8b.weight", "F8_E4M3", {rows, cols}, codes},
                     {"fp8b.weight_scale_inv", "BF16", {3, 2}, to_bytes(scale_bf16)}},
                    nullptr, HeaderPadding::kOdd);
  ModelConfig config;  // FP8 blocks of 128 x 128
  const auto source = open_checkpoint_source(dir.path(), config);
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"f32", {7, 5, 3}}, {"bf16", {rows, 7}}, {"f16", {9, 4}}, {"fp8.weight", {rows, cols}},
           {"fp8b.weight", {rows, cols}}}) {
    const std::vector<float> whole = read_whole(*source, name, shape);
    const int64_t n = shape[0], row = static_cast<int64_t>(whole.size()) / n;
    // Ranges inside one scale block, across block boundaries (127 | 128, 255 | 256) and into the partial last one.
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, n}, {0, 1}, {5, 1}, {2, n - 3}, {127, 2}, {100, 50}, {130, 170}, {257, 43}, {n - 1, 1}, {0, 0}}) {
      if (first + count > n) continue;
      std::vector<float> part(static_cast<size_t>(count * row));
      source->read_rows(name, shape, first, count, part);
      expect_bits_equal(part, std::span<const float>(whole).subspan(static_cast<size_t>(first * row), part.size()),
                        name + " rows from " + std::to_string(first));
    }
  }
  // The FP8 rows honour their own scale blocks: rows [100, 150) cross from scale row 0 into scale row 1.
  std::vector<float> part(static_cast<size_t>(50 * cols));
  source->read_rows("fp8.weight", std::vector<int64_t>{rows, cols}, 100, 50, part);
  for (int64_t r = 100; r < 150; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float expected = e4m3_to_float(codes[static_cast<size_t>(r * cols + c)]) * scale[(r / 128) * 2 + c / 128];
      ASSERT_EQ(part[static_cast<size_t>((r - 100) * cols + c)], expected) << "row " << r << " col " << c;
    }
  }
  expect_error([&] { source->read_rows("fp8.weight", std::vector<int64_t>{rows, cols}, 299, 2, part); },
               {"fp8.weight", "out of range"});
  expect_error([&] { source->read_rows("bf16", std::vector<int64_t>{rows, 7}, 3, 2, part); },
               {"rows [3, 5)", "bf16", "14 elements"});
  expect_error([&] { source->read_rows("bf16", std::vector<int64_t>{rows, 8}, 0, 1, part); }, {"expected [300, 8]"});
}

// ---------------------------------------------------------------------------------------------- dummy weights

uint64_t reference_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TEST(DummyWeights, FollowTheSpecifiedStream) {
  // value i of `name` = 0.02 * sqrt(-2 ln u1) cos(2 pi u2), (u1, u2) from the halves of
  // mix64(key + i * golden), key = mix64(fnv1a64(name) ^ mix64(seed)): the same on every platform.
  const uint64_t seed = 42;
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (const char ch : name) fnv = (fnv ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  const uint64_t key = reference_mix64(fnv ^ reference_mix64(seed));
  const auto source = make_dummy_source(seed);
  const std::vector<float> values = read_whole(*source, name, {64, 160});
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t h = reference_mix64(key + i * 0x9e3779b97f4a7c15ull);
    const double u1 = (static_cast<double>(h >> 40) + 0.5) / 16777216.0;
    const double u2 = static_cast<double>((h >> 8) & 0xffffffu) / 16777216.0;
    const double expected = 0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    ASSERT_NEAR(values[i], expected, 2e-7) << "element " << i;
  }
}

// The stream a device is given (WeightSource::normal_stream) makes the values the host reads, bit for bit; norm
// weights and biases are constants, with no stream; a source that transforms values has none either.
TEST(DummyWeights, NormalStreamGivesTheValuesRead) {
  const auto source = make_dummy_source(9);
  const std::string name = "model.layers.1.mlp.experts.3.up_proj.weight";
  const std::vector<float> values = read_whole(*source, name, {24, 130});
  const std::vector<int64_t> shape{24, 130};
  const std::optional<dummy_normal::StreamRange> range = source->normal_stream(name, shape);
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->key, dummy_normal::tensor_key(9, name));
  EXPECT_EQ(range->first, 0);
  EXPECT_EQ(range->row_length, 130);
  EXPECT_EQ(range->row_stride, 130);  // whole rows
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(dummy_normal::value(range->key, i)), std::bit_cast<uint32_t>(values[i])) << i;
  }
  const std::vector<int64_t> vector_shape{130};
  EXPECT_FALSE(source->normal_stream("model.layers.1.input_layernorm.weight", vector_shape).has_value());
  EXPECT_FALSE(source->normal_stream("model.layers.1.mlp.gate.e_score_correction_bias", vector_shape).has_value());
  const auto rounded = make_int4_rounding_source(make_dummy_source(9), {});
  EXPECT_FALSE(rounded->normal_stream(name, shape).has_value());
}

// A host sink that makes dummy values from the streams the loader hands it (as a GPU's sink does in its kernels):
// the loader's stream ranges, a shard's included, must give every tensor the values the host path writes.
class StreamMakingSink final : public WeightSink {
 public:
  explicit StreamMakingSink(WeightFormat format) : inner_(make_host_sink(format)) {}
  Tensor allocate(Shape shape, WeightRole role) override { return inner_->allocate(shape, role); }
  void write(Tensor& dst, int64_t offset, std::span<const float> values) override {
    inner_->write(dst, offset, values);
  }
  Weight allocate_linear(Shape shape) override { return inner_->allocate_linear(shape); }
  void write(Weight& dst, int64_t offset, std::span<const float> values) override {
    inner_->write(dst, offset, values);
  }
  bool fp8_linear() const override { return inner_->fp8_linear(); }
  bool is_fp8_weight(const Weight& w) const override { return inner_->is_fp8_weight(w); }
  bool takes_fp8() const override { return inner_->takes_fp8(); }
  void write_fp8(Weight& dst, int64_t matrix, int64_t first_row, const Fp8Rows& rows) override {
    inner_->write_fp8(dst, matrix, first_row, rows);
  }
  void finish() override { inner_->finish(); }
  bool fill_normal(Tensor& dst, int64_t offset, int64_t count, const dummy_normal::StreamRange& range) override {
    inner_->write(dst, offset, values(count, range));
    ++fills_;
    return true;
  }
  bool fill_normal(Weight& dst, int64_t offset, int64_t count, const dummy_normal::StreamRange& range) override {
    inner_->write(dst, offset, values(count, range));
    ++fills_;
    return true;
  }
  int64_t fills() const { return fills_; }

 private:
  static std::vector<float> values(int64_t count, const dummy_normal::StreamRange& range) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t j = 0; j < count; ++j) v[static_cast<size_t>(j)] = dummy_normal::value_at(range, j);
    return v;
  }
  std::unique_ptr<WeightSink> inner_;
  int64_t fills_ = 0;
};

TEST(DummyWeights, StreamsTheLoaderHandsASinkMakeTheHostsValues) {
  const ModelConfig whole = tiny_config(ModelVersion::kV3);
  const auto dummy = make_dummy_source(13);
  for (const bool fp8 : {false, true}) {
    for (const ModelShard shard : {ModelShard{}, ModelShard{.rank = 1, .size = 2}}) {
      SCOPED_TRACE("rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.size) + (fp8 ? ", FP8" : ""));
      const ModelConfig c = local_config(whole, shard);
      const auto source = make_sharded_source(*dummy, shard);
      StreamMakingSink streams({.fp8 = fp8});
      const std::unique_ptr<WeightSink> host = make_host_sink({.fp8 = fp8});
      const ModelWeights made = load_weights(c, *source, streams, {}, shard);
      const ModelWeights written = load_weights(c, *source, *host, {}, shard);
      EXPECT_GT(streams.fills(), 0);
      const auto a = tensors_of(made), b = tensors_of(written);
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        SCOPED_TRACE(a[k].first);
        EXPECT_EQ(a[k].second->dtype(), b[k].second->dtype());
        ASSERT_EQ(a[k].second->numel(), b[k].second->numel());
        EXPECT_EQ(std::memcmp(a[k].second->cview().data, b[k].second->cview().data,
                              static_cast<size_t>(a[k].second->numel()) * dtype_size(a[k].second->dtype())),
                  0);
      }
    }
  }
}

TEST(DummyWeights, DeterministicWithNormalStatistics) {
  const auto a = make_dummy_source(1), b = make_dummy_source(1), c = make_dummy_source(2);
  const std::vector<int64_t> shape = {1024, 1024};
  const std::vector<float> x = read_whole(*a, "model.layers.3.self_attn.o_proj.weight", shape);
  EXPECT_EQ(x, read_whole(*b, "model.layers.3.self_attn.o_proj.weight", shape));
  EXPECT_NE(x, read_whole(*c, "model.layers.3.self_attn.o_proj.weight", shape));
  EXPECT_NE(x, read_whole(*a, "model.layers.4.self_attn.o_proj.weight", shape));

  double sum = 0, sum_sq = 0, largest = 0;
  int64_t within_one_std = 0;
  for (const float v : x) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    largest = std::max(largest, std::fabs(static_cast<double>(v)));
    within_one_std += std::fabs(v) < 0.02f;
  }
  const auto n = static_cast<double>(x.size());
  const double mean = sum / n, stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::fabs(mean), 1e-4);  // 5 standard errors (0.02 / 1024)
  EXPECT_NEAR(stddev, 0.02, 1e-4);
  EXPECT_NEAR(static_cast<double>(within_one_std) / n, 0.6827, 3e-3);
  EXPECT_GT(largest, 4 * 0.02);
  EXPECT_LT(largest, 6 * 0.02);

  for (const float v : read_whole(*a, "model.layers.0.input_layernorm.weight", {300})) ASSERT_EQ(v, 1.0f);
  for (const float v : read_whole(*a, "model.layers.1.mlp.gate.e_score_correction_bias", {300})) ASSERT_EQ(v, 0.0f);
}

// A timing, not a test: run with --gtest_also_run_disabled_tests.
TEST(DummyWeights, DISABLED_GenerationRate) {
  const auto source = make_dummy_source(3);
  const int64_t n = int64_t{1} << 26;
  std::vector<float> out(static_cast<size_t>(n));
  const std::vector<int64_t> shape = {n};
  source->read("warmup.weight", shape, out);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    source->read("bench.weight", shape, out);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("dummy weights: %.0f M values/s (%lld values in %.3f s)\n", static_cast<double>(n) / best / 1e6,
              static_cast<long long>(n), best);
}

// ---------------------------------------------------------------------------------------------- load_weights

TEST(LoadWeights, HostSinkHoldsWhatTheSourceHolds) {
  const auto source = make_dummy_source(11);
  for (const ModelVersion version : {ModelVersion::kV3, ModelVersion::kV2}) {
    ModelConfig c = tiny_config(version);
    c.tie_word_embeddings = version == ModelVersion::kV2;  // the dummy source has lm_head, so still untied
    SCOPED_TRACE(version == ModelVersion::kV3 ? "v3" : "v2");
    int64_t last_done = 0, calls = 0;
    const ModelWeights w = load_weights(c, *source, [&](int64_t done, int64_t total) {
      EXPECT_EQ(done, last_done + 1);
      EXPECT_EQ(total, c.num_hidden_layers + 2);
      last_done = done;
      ++calls;
    });
    EXPECT_EQ(calls, c.num_hidden_layers + 2);
    expect_matches_reference(w, reference_weights(c, *source));
  }
}

TEST(LoadWeights, EveryElementIsWrittenOnceAndNoWriteExceedsOneExpert) {
  const ModelConfig c = tiny_config(ModelVersion::kV3);
  const auto source = make_dummy_source(5);
  RecordingSink sink;
  const ModelWeights w = load_weights(c, *source, sink);
  expect_every_element_written_once(w, sink);
  expect_expert_sized_writes(c, w, sink);
  expect_matches_reference(w, reference_weights(c, *source));
}

TEST(LoadWeights, FusedExpertsAreReadOneExpertAtATime) {
  const ModelConfig c = tiny_config(ModelVersion::kV3);
  const auto dummy = make_dummy_source(9);
  TempDir fused_dir("deepinfer_weights_test"), separate_dir("deepinfer_weights_test");
  write_checkpoint(fused_dir.path(), c, *dummy, ExpertLayout::kFused);
  write_checkpoint(separate_dir.path(), c, *dummy, ExpertLayout::kSeparate);
  const auto fused = open_checkpoint_source(fused_dir.path(), c);
  ASSERT_TRUE(fused->contains("model.layers.1.mlp.experts.gate_up_proj"));
  ASSERT_FALSE(fused->contains("model.layers.1.mlp.experts.0.gate_proj.weight"));

  RecordingSink sink;
  const ModelWeights w = load_weights(c, *fused, sink);
  expect_every_element_written_once(w, sink);
  expect_expert_sized_writes(c, w, sink);
  expect_matches_reference(w, reference_weights(c, *dummy));
  expect_matches_reference(load_weights(c, *open_checkpoint_source(separate_dir.path(), c)),
                           reference_weights(c, *dummy));
}

// The shared experts as experts E and E + 1 of the stacked tensors, from a checkpoint whose shared MLP is FP8 in
// 32 x 32 blocks: each 48-wide shared expert's rows (gate, up) and columns (down) start or end inside scale blocks.
TEST(LoadWeights, SharedExpertsAreStackedAfterTheRoutedOnes) {
  ModelConfig c = tiny_config(ModelVersion::kV2);
  c.n_shared_experts = 2;
  c.fp8.block_rows = c.fp8.block_cols = 32;
  const int64_t e = c.n_routed_experts, mi = c.moe_intermediate_size, d = c.hidden_size, sh = c.n_shared_experts;
  const std::string prefix = "model.layers.1.mlp.shared_experts.";
  std::vector<RawTensor> fp8_tensors;
  // An FP8 tensor [rows, cols] with its scales into fp8_tensors; returns its values, dequantized here.
  const auto add_fp8 = [&](const std::string& name, int64_t rows, int64_t cols, uint32_t salt) {
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < codes.size(); ++i) {
      codes[i] = static_cast<uint8_t>((i * 37 + salt) % 256);
      if ((codes[i] & 0x7f) == 0x7f) codes[i] = 0x38;  // no NaN codes
    }
    const int64_t block_rows = (rows + 31) / 32, block_cols = (cols + 31) / 32;
    std::vector<float> scale(static_cast<size_t>(block_rows * block_cols));
    for (size_t b = 0; b < scale.size(); ++b) scale[b] = 0.25f * static_cast<float>(1 + b + salt % 3);
    std::vector<float> values(codes.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < cols; ++col) {
        values[static_cast<size_t>(r * cols + col)] = e4m3_to_float(codes[static_cast<size_t>(r * cols + col)]) *
                                                      scale[static_cast<size_t>((r / 32) * block_cols + col / 32)];
      }
    }
    fp8_tensors.push_back({name, "F8_E4M3", {rows, cols}, codes});
    fp8_tensors.push_back({name + "_scale_inv", "F32", {block_rows, block_cols}, to_bytes(scale)});
    return values;
  };
  const std::vector<float> gate = add_fp8(prefix + "gate_proj.weight", sh * mi, d, 1);         // [2 mi, d]
  const std::vector<float> up = add_fp8(prefix + "up_proj.weight", sh * mi, d, 2);             // [2 mi, d]
  const std::vector<float> shared_down = add_fp8(prefix + "down_proj.weight", d, sh * mi, 3);  // [d, 2 mi]
  TempDir dir("deepinfer_weights_test");
  const auto dummy = make_dummy_source(21);
  write_checkpoint(dir.path(), c, *dummy, ExpertLayout::kSeparate, fp8_tensors);
  const auto source = open_checkpoint_source(dir.path(), c);

  RecordingSink sink;
  const ModelWeights w = load_weights(c, *source, sink);
  expect_every_element_written_once(w, sink);
  expect_expert_sized_writes(c, w, sink);
  expect_matches_reference(w, reference_weights(c, *source));
  for (const int64_t layer : {1, 2}) {
    const MoeWeights& moe = *w.layers[static_cast<size_t>(layer)].moe;
    EXPECT_EQ(moe.num_shared_experts, sh);
    EXPECT_EQ(moe.experts_gate_up.shape(), (Shape{e + sh, 2 * mi, d}));
    EXPECT_EQ(moe.experts_down.shape(), (Shape{e + sh, d, mi}));
  }
  const MoeWeights& moe = *w.layers[1].moe;
  const float* gate_up_got = moe.experts_gate_up.values.f32();  // [e + sh, 2 mi, d]
  const float* down_got = moe.experts_down.values.f32();        // [e + sh, d, mi]
  for (int64_t j = 0; j < sh; ++j) {
    for (int64_t i = 0; i < mi; ++i) {
      for (int64_t col = 0; col < d; ++col) {
        ASSERT_EQ(gate_up_got[((e + j) * 2 * mi + i) * d + col], gate[static_cast<size_t>((j * mi + i) * d + col)])
            << "gate of shared expert " << j << " row " << i << " col " << col;
        ASSERT_EQ(gate_up_got[((e + j) * 2 * mi + mi + i) * d + col], up[static_cast<size_t>((j * mi + i) * d + col)])
            << "up of shared expert " << j << " row " << i << " col " << col;
      }
    }
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t i = 0; i < mi; ++i) {
        ASSERT_EQ(down_got[((e + j) * d + r) * mi + i], shared_down[static_cast<size_t>(r * sh * mi + j * mi + i)])
            << "down of shared expert " << j << " row " << r << " col " << i;
      }
    }
  }
}

// A shared MLP that is not n_shared_experts * moe_intermediate_size wide cannot be split into experts.
TEST(LoadWeights, SharedExpertsOfAnotherWidthAreRejected) {
  const ModelConfig c = tiny_config(ModelVersion::kV3);  // one shared expert: 48 wide
  TempDir dir("deepinfer_weights_test");
  write_checkpoint(dir.path(), c, *make_dummy_source(23), ExpertLayout::kSeparate);
  ModelConfig two = c;
  two.n_shared_experts = 2;
  const auto source = open_checkpoint_source(dir.path(), two);
  expect_error([&] { (void)load_weights(two, *source); },
               {"model.layers.1.mlp.shared_experts.gate_proj.weight", "[48, 32]", "expected [96, 32]",
                "n_shared_experts (2)", "moe_intermediate_size (48)"});
}

TEST(LoadWeights, TensorsLargerThanAChunkArriveInChunks) {
  ModelConfig c = tiny_config(ModelVersion::kV2);
  c.num_hidden_layers = 1;
  c.hidden_size = 64;
  c.vocab_size = kLoadChunkFloats / c.hidden_size + 1000;  // embed: two chunks
  c.tie_word_embeddings = true;
  const auto dummy = make_dummy_source(4);
  RecordingSource source(*dummy);
  struct NoLmHead final : WeightSource {  // a dummy source without lm_head.weight
    explicit NoLmHead(const WeightSource& s) : inner(s) {}
    bool contains(const std::string& name) const override { return name != "lm_head.weight"; }
    void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                   std::span<float> out) const override {
      DI_CHECK(name != "lm_head.weight", "tensor lm_head.weight not found");
      inner.read_rows(name, shape, first_row, num_rows, out);
    }
    const WeightSource& inner;
  } untied(source);
  RecordingSink sink;
  const ModelWeights w = load_weights(c, untied, sink);
  expect_every_element_written_once(w, sink);
  EXPECT_LE(sink.largest_write(), kLoadChunkFloats);
  EXPECT_GT(sink.largest_write(), kLoadChunkFloats - c.hidden_size);
  EXPECT_EQ(w.lm_head.shape(), w.embed.shape());
  EXPECT_EQ(std::memcmp(w.lm_head.f32(), w.embed.f32(), w.embed.view().bytes()), 0);
  EXPECT_FALSE(source.shapes().contains("lm_head.weight"));
}

TEST(LoadWeights, Bf16SinkHoldsTheRoundedValues) {
  const ModelConfig c = tiny_config(ModelVersion::kV3);
  const auto source = make_dummy_source(13);
  Bf16HostSink sink;
  const ModelWeights got = load_weights(c, *source, sink);
  const ModelWeights ref = load_weights(c, *source);
  expect_bf16_rounding_of(tensors_of(got), tensors_of(ref));
}

TEST(LoadWeights, CpuBackendSinkEqualsTheHostSink) {
  const ModelConfig c = tiny_config(ModelVersion::kV3);
  const auto source = make_dummy_source(17);
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::unique_ptr<WeightSink> sink = make_backend_sink(*cpu);
  expect_matches_reference(load_weights(c, *source, *sink), reference_weights(c, *source));
}

#ifdef DEEPINFER_HAVE_CUDA
// The backend sink on a GPU: bfloat16 matrices (staged in chunks: the embedding spans several) and float32 vectors.
TEST(LoadWeights, CudaBackendSinkHoldsTheRoundedValues) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  ModelConfig c = tiny_config(ModelVersion::kV3);
  c.vocab_size = 3 * (int64_t{1} << 22) / c.hidden_size + 5;  // embed: three staging chunks and a bit
  const auto source = make_dummy_source(19);
  const std::unique_ptr<WeightSink> sink = make_backend_sink(*cuda);
  const ModelWeights on_device = load_weights(c, *source, *sink);
  const ModelWeights on_host = load_weights(c, *source);
  std::vector<Tensor> copies;  // each device tensor, copied back into a host tensor of its dtype
  NamedTensors got;
  for (const auto& [name, t] : tensors_of(on_device)) {
    copies.push_back(Tensor::empty(t->shape(), t->dtype()));
    if (t->numel() > 0) {
      EXPECT_EQ(t->device(), Device::kCuda) << name;
      cuda->copy_to_host(t->cview(), copies.back().view());
    }
  }
  for (const Tensor& t : copies) got.emplace_back("", &t);
  expect_bf16_rounding_of(got, tensors_of(on_host));
}

// A timing, not a test (run with --gtest_also_run_disabled_tests on a GPU): DeepSeek-V2-Lite's shapes (15.7B
// parameters) from the dummy source into the GPU, with the host's peak resident memory.
TEST(LoadWeights, DISABLED_CudaV2LiteDummyLoad) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  ModelConfig c;
  c.version = ModelVersion::kV2;
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.n_shared_experts = 2;
  c.num_experts_per_tok = 6;
  c.first_k_dense_replace = 1;
  const auto peak_rss_mib = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;
  };
  const double rss_before = peak_rss_mib();  // the process and the CUDA context
  const auto source = make_dummy_source(1);
  const std::unique_ptr<WeightSink> sink = make_backend_sink(*cuda);
  const auto start = std::chrono::steady_clock::now();
  const ModelWeights w = load_weights(c, *source, *sink);
  Tensor last = Tensor::empty({1}, DType::kBF16);
  cuda->copy_to_host(w.lm_head.cview().reshaped({w.lm_head.numel()}).rows(0, 1), last.view());  // waits for all
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t values = 0;
  for (const auto& [name, t] : tensors_of(w)) values += t->numel();
  std::printf("V2-Lite dummy load into the GPU: %.2f G values in %.1f s (%.2f G values/s); host peak RSS %.0f MiB "
              "(%.0f MiB before the load)\n",
              static_cast<double>(values) / 1e9, seconds, static_cast<double>(values) / 1e9 / seconds, peak_rss_mib(),
              rss_before);
}
#endif

}  // namespace
}  // namespace deepinfer
