#include "model/weights.h"

#include <cstring>
#include <random>

#include "model/checkpoint.h"

namespace deepinfer {
namespace {

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(Checkpoint checkpoint, const ModelConfig& config)
      : checkpoint_(std::move(checkpoint)), fp8_block_{config.fp8.block_rows, config.fp8.block_cols} {}

  bool contains(const std::string& name) const override { return checkpoint_.contains(name); }
  void read(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const override {
    checkpoint_.read_f32(name, shape, out, fp8_block_);
  }

 private:
  Checkpoint checkpoint_;
  std::array<int64_t, 2> fp8_block_;
};

class DummySource final : public WeightSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}
  bool contains(const std::string&) const override { return true; }
  void read(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const override {
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.find("bias") != std::string::npos;
    if (is_norm || is_bias) {
      std::fill(out.begin(), out.end(), is_norm ? 1.0f : 0.0f);
      return;
    }
    std::mt19937_64 rng(seed_ ^ std::hash<std::string>{}(name));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& v : out) v = normal(rng);
  }

 private:
  uint64_t seed_;
};

class Loader {
 public:
  Loader(const WeightSource& source, const LoadProgress& progress, int64_t total)
      : source_(source), progress_(progress), total_(total) {}

  Tensor read(const std::string& name, Shape shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    source_.read(name, shape.dims(), t.f32_span());
    return t;
  }
  // Two [rows, cols] tensors stacked into one [2 * rows, cols] (gate and up projections).
  Tensor read_stacked(const std::string& first, const std::string& second, int64_t rows, int64_t cols) {
    Tensor t = Tensor::empty({2 * rows, cols}, DType::kF32);
    const int64_t shape[] = {rows, cols};
    source_.read(first, shape, t.f32_span().subspan(0, static_cast<size_t>(rows * cols)));
    source_.read(second, shape, t.f32_span().subspan(static_cast<size_t>(rows * cols)));
    return t;
  }
  bool contains(const std::string& name) const { return source_.contains(name); }
  const WeightSource& source() const { return source_; }
  void step() {
    ++done_;
    if (progress_) progress_(done_, total_);
  }

 private:
  const WeightSource& source_;
  const LoadProgress& progress_;
  int64_t total_;
  int64_t done_ = 0;
};

MlpWeights load_mlp(Loader& loader, const std::string& prefix, int64_t dim, int64_t inter) {
  MlpWeights w;
  w.gate_up = loader.read_stacked(prefix + "gate_proj.weight", prefix + "up_proj.weight", inter, dim);
  w.down = loader.read(prefix + "down_proj.weight", {dim, inter});
  return w;
}

MlaWeights load_mla(Loader& loader, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads, rank = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, v = c.v_head_dim;
  MlaWeights w;
  if (c.q_lora_rank) {
    w.q_a_proj = loader.read(p + "q_a_proj.weight", {*c.q_lora_rank, d});
    w.q_a_norm = loader.read(p + "q_a_layernorm.weight", {*c.q_lora_rank});
    w.q_b_proj = loader.read(p + "q_b_proj.weight", {h * c.qk_head_dim(), *c.q_lora_rank});
  } else {
    w.q_proj = loader.read(p + "q_proj.weight", {h * c.qk_head_dim(), d});
  }
  w.kv_a_proj = loader.read(p + "kv_a_proj_with_mqa.weight", {c.latent_dim(), d});
  w.kv_a_norm = loader.read(p + "kv_a_layernorm.weight", {rank});
  w.kv_b_proj = loader.read(p + "kv_b_proj.weight", {h * (nope + v), rank});
  w.o_proj = loader.read(p + "o_proj.weight", {d, h * v});
  // Split kv_b_proj per head into W_UK (transposed to [rank, nope]) and W_UV ([v, rank]) for the absorbed form.
  w.w_uk_t = Tensor::empty({h, rank, nope}, DType::kF32);
  w.w_uv = Tensor::empty({h, v, rank}, DType::kF32);
  const float* kv_b = w.kv_b_proj.f32();
  for (int64_t head = 0; head < h; ++head) {
    const float* rows = kv_b + head * (nope + v) * rank;
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t r = 0; r < rank; ++r) w.w_uk_t.f32()[(head * rank + r) * nope + i] = rows[i * rank + r];
    }
    std::memcpy(w.w_uv.f32() + head * v * rank, rows + nope * rank, sizeof(float) * v * rank);
  }
  return w;
}

MoeWeights load_moe(Loader& loader, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, e = c.n_routed_experts, inter = c.moe_intermediate_size;
  MoeWeights w;
  w.gate = loader.read(p + "gate.weight", {e, d});
  if (c.version == ModelVersion::kV3) w.correction_bias = loader.read(p + "gate.e_score_correction_bias", {e});
  w.experts_gate_up = Tensor::empty({e, 2 * inter, d}, DType::kF32);
  w.experts_down = Tensor::empty({e, d, inter}, DType::kF32);
  if (loader.contains(p + "experts.gate_up_proj") && !loader.contains(p + "experts.0.gate_proj.weight")) {
    // transformers 5 may store the experts fused: gate_up_proj [E, 2I, D], down_proj [E, D, I].
    const int64_t gate_up_shape[] = {e, 2 * inter, d};
    const int64_t down_shape[] = {e, d, inter};
    loader.source().read(p + "experts.gate_up_proj", gate_up_shape, w.experts_gate_up.f32_span());
    loader.source().read(p + "experts.down_proj", down_shape, w.experts_down.f32_span());
  } else {
    for (int64_t x = 0; x < e; ++x) {
      const std::string ep = p + "experts." + std::to_string(x) + ".";
      const int64_t shape[] = {inter, d};
      const auto gate_up = w.experts_gate_up.f32_span().subspan(static_cast<size_t>(x * 2 * inter * d),
                                                                static_cast<size_t>(2 * inter * d));
      loader.source().read(ep + "gate_proj.weight", shape, gate_up.subspan(0, static_cast<size_t>(inter * d)));
      loader.source().read(ep + "up_proj.weight", shape, gate_up.subspan(static_cast<size_t>(inter * d)));
      const int64_t down_shape[] = {d, inter};
      loader.source().read(ep + "down_proj.weight", down_shape,
                           w.experts_down.f32_span().subspan(static_cast<size_t>(x * d * inter),
                                                             static_cast<size_t>(d * inter)));
    }
  }
  if (c.n_shared_experts > 0) w.shared = load_mlp(loader, p + "shared_experts.", d, c.n_shared_experts * inter);
  return w;
}

}  // namespace

std::unique_ptr<WeightSource> open_checkpoint_source(const std::filesystem::path& dir, const ModelConfig& config) {
  return std::make_unique<CheckpointSource>(Checkpoint::open(dir), config);
}

std::unique_ptr<WeightSource> make_dummy_source(uint64_t seed) { return std::make_unique<DummySource>(seed); }

ModelWeights load_weights(const ModelConfig& c, const WeightSource& source, const LoadProgress& progress) {
  Loader loader(source, progress, c.num_hidden_layers + 2);
  ModelWeights w;
  const int64_t d = c.hidden_size;
  w.embed = loader.read("model.embed_tokens.weight", {c.vocab_size, d});
  loader.step();
  w.layers.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights layer;
    layer.input_norm = loader.read(p + "input_layernorm.weight", {d});
    layer.post_attention_norm = loader.read(p + "post_attention_layernorm.weight", {d});
    layer.attn = load_mla(loader, c, p + "self_attn.");
    if (c.is_moe_layer(i)) {
      layer.moe = load_moe(loader, c, p + "mlp.");
    } else {
      layer.mlp = load_mlp(loader, p + "mlp.", d, c.intermediate_size);
    }
    w.layers.push_back(std::move(layer));
    loader.step();
  }
  w.norm = loader.read("model.norm.weight", {d});
  if (c.tie_word_embeddings && !source.contains("lm_head.weight")) {
    w.lm_head = Tensor::empty({c.vocab_size, d}, DType::kF32);
    std::memcpy(w.lm_head.f32(), w.embed.f32(), sizeof(float) * c.vocab_size * d);
  } else {
    w.lm_head = loader.read("lm_head.weight", {c.vocab_size, d});
  }
  loader.step();
  return w;
}

}  // namespace deepinfer
