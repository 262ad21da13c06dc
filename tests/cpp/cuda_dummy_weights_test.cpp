// Dummy weights made on the GPU (Backend::fill_dummy_normal, backend/cuda/memory/dummy_weights.cuh) against the host's
// stream (core/dummy_normal.h through make_dummy_source), bit for bit: float32 and bfloat16 ranges and a strided
// column slice, FP8 blocks against quantize_fp8_block_rows, and whole models loaded through a CUDA sink (bf16 and FP8
// linear layers, whole and one rank of two) against the same model loaded from the host's values.
#ifdef DEEPINFER_HAVE_CUDA

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dummy_normal.h"
#include "core/fp8.h"
#include "core/half.h"
#include "core/weight.h"
#include "cuda_device_required.h"
#include "model/model_shard.h"
#include "model/sharded_source.h"
#include "model/weight_sink.h"
#include "model/weights.h"

namespace deepinfer {
namespace {

// A device tensor's bytes on the host.
std::vector<uint8_t> host_bytes(Backend& backend, const Tensor& t) {
  if (t.numel() == 0) return {};
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  backend.copy_to_host(t.cview(), host.view());
  std::vector<uint8_t> bytes(static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
  if (!bytes.empty()) std::memcpy(bytes.data(), host.cview().data, bytes.size());
  return bytes;
}

// The bits of float32 element i of host bytes.
uint32_t f32_bits_at(const std::vector<uint8_t>& bytes, size_t i) {
  uint32_t bits;
  std::memcpy(&bits, bytes.data() + 4 * i, 4);
  return bits;
}

TEST(CudaDummyWeights, FillMatchesTheHostStreamBitForBit) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const auto source = make_dummy_source(77);
  const std::string name = "model.layers.2.self_attn.o_proj.weight";
  const std::vector<int64_t> shape{40, 999};
  const int64_t first_row = 3, rows = 31;  // an odd start and length, as a chunk of a larger tensor
  std::vector<float> expected(static_cast<size_t>(rows * shape[1]));
  source->read_rows(name, shape, first_row, rows, expected);
  const uint64_t key = dummy_normal::tensor_key(77, name);
  // The rows as a later range of the stream, then a column slice of them (row_stride > row_length), as a shard's.
  const dummy_normal::StreamRange rows_range{.key = key, .first = first_row * shape[1], .row_length = shape[1],
                                             .row_stride = shape[1]};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor t = cuda->empty({rows, shape[1]}, dtype);
    ASSERT_TRUE(cuda->fill_dummy_normal(t.view(), rows_range));
    const std::vector<uint8_t> got = host_bytes(*cuda, t);
    for (size_t i = 0; i < expected.size(); ++i) {
      if (dtype == DType::kF32) {
        ASSERT_EQ(f32_bits_at(got, i), std::bit_cast<uint32_t>(expected[i])) << "float32 element " << i;
      } else {
        uint16_t b;
        std::memcpy(&b, got.data() + 2 * i, 2);
        ASSERT_EQ(b, float_to_bf16(expected[i])) << "bfloat16 element " << i;
      }
    }
  }
  // Columns [500, 999) of each row.
  const int64_t half = shape[1] - 500;
  Tensor t = cuda->empty({rows, half}, DType::kF32);
  ASSERT_TRUE(cuda->fill_dummy_normal(
      t.view(), {.key = key, .first = first_row * shape[1] + 500, .row_length = half, .row_stride = shape[1]}));
  const std::vector<uint8_t> got = host_bytes(*cuda, t);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < half; ++c) {
      const float want = expected[static_cast<size_t>(r * shape[1] + 500 + c)];
      ASSERT_EQ(f32_bits_at(got, static_cast<size_t>(r * half + c)), std::bit_cast<uint32_t>(want))
          << "row " << r << " column " << c;
    }
  }
}

TEST(CudaDummyWeights, Fp8BlocksMatchTheHostQuantization) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const auto source = make_dummy_source(5);
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  // Rows [128, 428) of a [500, 200] tensor: whole block rows then a partial one, a partial block column.
  const std::vector<int64_t> shape{500, 200};
  const int64_t first_row = 128, rows = 300, cols = shape[1];
  std::vector<float> values(static_cast<size_t>(rows * cols));
  source->read_rows(name, shape, first_row, rows, values);
  std::vector<uint8_t> codes(values.size());
  std::vector<float> scales(static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols)));
  quantize_fp8_block_rows(values, rows, cols, Fp8ScaleFormat::kFloat, codes, scales);

  Tensor d_codes = cuda->empty({rows, cols}, DType::kF8E4M3);
  Tensor d_scales = cuda->empty({fp8_blocks(rows), fp8_blocks(cols)}, DType::kF32);
  ASSERT_TRUE(cuda->fill_dummy_normal_fp8(
      d_codes.view(), d_scales.view(),
      {.key = dummy_normal::tensor_key(5, name), .first = first_row * cols, .row_length = cols, .row_stride = cols}));
  EXPECT_EQ(host_bytes(*cuda, d_codes), codes);
  const std::vector<uint8_t> got_scales = host_bytes(*cuda, d_scales);
  std::vector<uint8_t> want_scales(scales.size() * 4);
  std::memcpy(want_scales.data(), scales.data(), want_scales.size());
  EXPECT_EQ(got_scales, want_scales);
}

// The dummy source with its streams hidden: the loader then makes every value on the host and writes it.
class HostValuesOnly final : public WeightSource {
 public:
  explicit HostValuesOnly(const WeightSource& inner) : inner_(inner) {}
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  void read_rows(const std::string& name, std::span<const int64_t> shape, int64_t first_row, int64_t num_rows,
                 std::span<float> out) const override {
    inner_.read_rows(name, shape, first_row, num_rows, out);
  }

 private:
  const WeightSource& inner_;
};

// Every tensor of `w`, in a fixed order.
std::vector<const Tensor*> tensors_of(const ModelWeights& w) {
  std::vector<const Tensor*> out{&w.embed, &w.norm, &w.lm_head};
  const auto add = [&](const Weight& x) {
    for (const Tensor* t : {&x.values, &x.scale_inv}) out.push_back(t);
  };
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.input_norm, &l.post_attention_norm, &l.attn.q_a_norm, &l.attn.kv_a_norm,
                            &l.attn.kv_b_proj, &l.attn.w_uk_t, &l.attn.w_uv}) {
      out.push_back(t);
    }
    for (const Weight* x : {&l.attn.q_proj, &l.attn.q_a_proj, &l.attn.q_b_proj, &l.attn.kv_a_proj, &l.attn.o_proj}) {
      add(*x);
    }
    if (l.mlp) {
      add(l.mlp->gate_up);
      add(l.mlp->down);
    }
    if (l.moe) {
      out.push_back(&l.moe->gate);
      out.push_back(&l.moe->correction_bias);
      add(l.moe->experts_gate_up);
      add(l.moe->experts_down);
    }
  }
  return out;
}

// Whole 128-blocks where the experts and gate/up need them, a partial block row elsewhere (kv_a_proj: 128 + 8 rows),
// and an intermediate size whose gate and up rows share a block row in the stacked gate_up (the host path for them).
ModelConfig tiny_v3() {
  ModelConfig c;
  c.version = ModelVersion::kV3;
  c.vocab_size = 96;
  c.hidden_size = 256;
  c.intermediate_size = 320;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 64;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  return c;
}

TEST(CudaDummyWeights, LoadedModelsEqualTheHostPath) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const ModelConfig c = tiny_v3();
  const auto source = make_dummy_source(3);
  for (const bool fp8 : {false, true}) {
    for (const ModelShard shard : {ModelShard{}, ModelShard{.rank = 1, .size = 2}}) {
      SCOPED_TRACE("rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.size) + (fp8 ? ", FP8" : ""));
      const auto sharded = make_sharded_source(*source, shard);
      const HostValuesOnly host_values(*sharded);
      const ModelConfig local = local_config(c, shard);
      const WeightFormat format{.fp8 = fp8};
      const auto on_device = make_backend_sink(*cuda, format);
      const auto from_host = make_backend_sink(*cuda, format);
      const ModelWeights made = load_weights(local, *sharded, *on_device, {}, shard);
      const ModelWeights written = load_weights(local, host_values, *from_host, {}, shard);
      const std::vector<const Tensor*> a = tensors_of(made), b = tensors_of(written);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i]->dtype(), b[i]->dtype()) << "tensor " << i;
        EXPECT_EQ(host_bytes(*cuda, *a[i]), host_bytes(*cuda, *b[i])) << "tensor " << i;
      }
      if (fp8) EXPECT_TRUE(made.layers[0].attn.o_proj.values.dtype() == DType::kF8E4M3);
    }
  }
}

}  // namespace
}  // namespace deepinfer

#endif  // DEEPINFER_HAVE_CUDA
