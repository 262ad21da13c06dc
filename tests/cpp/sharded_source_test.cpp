// A rank's view of the weights under tensor parallelism: each split reads exactly the rank's slice of the whole
// tensor, bit for bit, whatever row range the loader asks for; and splits that do not divide are refused.
#include <gtest/gtest.h>

#include <bit>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dummy_normal.h"
#include "engine/step_batch.h"
#include "engine/worker_ranks.h"
#include "model/sharded_source.h"

namespace deepinfer {
namespace {

std::vector<float> read_all(const WeightSource& s, const std::string& name, std::vector<int64_t> shape) {
  std::vector<float> out(static_cast<size_t>(Shape(shape).numel()));
  s.read(name, shape, out);
  return out;
}

TEST(ShardedSource, EachSplitReadsTheRanksSlice) {
  const auto whole = make_dummy_source(7);
  constexpr int64_t kRows = 6, kCols = 8;
  for (int32_t size : {2, 4}) {
    for (int32_t rank = 0; rank < size; ++rank) {
      const ModelShard shard{.rank = rank, .size = size};
      const auto part = make_sharded_source(*whole, shard);
      // Columns: o_proj's input features.
      const std::string o = "model.layers.0.self_attn.o_proj.weight";
      const std::vector<float> all_o = read_all(*whole, o, {kRows, kCols});
      const std::vector<float> got_o = read_all(*part, o, {kRows, kCols / size});
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t c = 0; c < kCols / size; ++c) {
          ASSERT_EQ(got_o[static_cast<size_t>(r * kCols / size + c)],
                    all_o[static_cast<size_t>(r * kCols + rank * kCols / size + c)]);
        }
      }
      // Rows: q_b_proj's heads, read from the middle of the slice too.
      const std::string q = "model.layers.0.self_attn.q_b_proj.weight";
      const std::vector<float> all_q = read_all(*whole, q, {kCols, kRows});
      std::vector<float> got_q(static_cast<size_t>(kRows));
      part->read_rows(q, std::vector<int64_t>{kCols / size, kRows}, 1, 1, got_q);
      for (int64_t c = 0; c < kRows; ++c) {
        ASSERT_EQ(got_q[static_cast<size_t>(c)], all_q[static_cast<size_t>((rank * kCols / size + 1) * kRows + c)]);
      }
      // A fused [E, 2I, D] gate_up: the rank's rows of each half, per expert.
      const std::string gu = "model.layers.1.mlp.experts.gate_up_proj";
      constexpr int64_t kE = 3, kI = 4, kD = 5;
      const std::vector<float> all_gu = read_all(*whole, gu, {kE, 2 * kI, kD});
      std::vector<float> got_gu(static_cast<size_t>(2 * kI / size * kD));
      part->read_rows(gu, std::vector<int64_t>{kE, 2 * kI / size, kD}, 2, 1, got_gu);
      const int64_t li = kI / size;
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < li; ++i) {
          for (int64_t d = 0; d < kD; ++d) {
            ASSERT_EQ(got_gu[static_cast<size_t>((h * li + i) * kD + d)],
                      all_gu[static_cast<size_t>(((2 * 2 * kI) + h * kI + rank * li + i) * kD + d)]);
          }
        }
      }
      // Replicated: the router.
      EXPECT_EQ(read_all(*part, "model.layers.1.mlp.gate.weight", {kE, kD}),
                read_all(*whole, "model.layers.1.mlp.gate.weight", {kE, kD}));
    }
  }
}

// Dummy weights a device makes (WeightSource::normal_stream): a rank's rows and columns are placed in the stream where
// the values it reads lie; a fused gate_up's halves and other 3-D slices have no one range, and norms no stream.
TEST(ShardedSource, NormalStreamsPlaceTheRanksSlice) {
  const auto whole = make_dummy_source(11);
  constexpr int64_t kRows = 6, kCols = 8;
  for (int32_t size : {2, 4}) {
    for (int32_t rank = 0; rank < size; ++rank) {
      const auto part = make_sharded_source(*whole, {.rank = rank, .size = size});
      for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"model.layers.0.self_attn.o_proj.weight", {kRows, kCols / size}},         // columns
               {"model.layers.0.self_attn.q_b_proj.weight", {kCols / size, kRows}},       // rows
               {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {kRows, kCols}}}) {  // replicated
        SCOPED_TRACE(name + " rank " + std::to_string(rank) + " of " + std::to_string(size));
        const std::optional<dummy_normal::StreamRange> range = part->normal_stream(name, shape);
        ASSERT_TRUE(range.has_value());
        EXPECT_EQ(range->row_length, shape[1]);
        const std::vector<float> values = read_all(*part, name, shape);
        for (size_t j = 0; j < values.size(); ++j) {
          ASSERT_EQ(std::bit_cast<uint32_t>(dummy_normal::value_at(*range, static_cast<int64_t>(j))),
                    std::bit_cast<uint32_t>(values[j]))
              << "element " << j;
        }
      }
      EXPECT_FALSE(part->normal_stream("model.layers.1.mlp.experts.gate_up_proj", std::vector<int64_t>{3, 4, 5}));
      EXPECT_FALSE(part->normal_stream("model.layers.0.input_layernorm.weight", std::vector<int64_t>{kCols}));
    }
  }
}

TEST(ShardedSource, ExpertsStayWholeUnderExpertParallelism) {
  EXPECT_EQ(tensor_split("model.layers.1.mlp.experts.3.down_proj.weight", false), TensorSplit::kColumns);
  EXPECT_EQ(tensor_split("model.layers.1.mlp.experts.3.down_proj.weight", true), TensorSplit::kReplicated);
  EXPECT_EQ(tensor_split("model.layers.1.mlp.shared_experts.down_proj.weight", true), TensorSplit::kColumns);
  EXPECT_EQ(tensor_split("model.layers.1.mlp.shared_experts.up_proj.weight", true), TensorSplit::kRows);
  EXPECT_EQ(tensor_split("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", false), TensorSplit::kReplicated);
  EXPECT_EQ(tensor_split("model.layers.0.self_attn.kv_b_proj.weight", false), TensorSplit::kRows);
  EXPECT_EQ(tensor_split("lm_head.weight", false), TensorSplit::kRows);
  EXPECT_EQ(tensor_split("model.norm.weight", false), TensorSplit::kReplicated);
}

TEST(ModelShard, SplitsTheModelDoesNotDivideIntoAreRefusedNamingTheValues) {
  ModelConfig c;
  c.num_attention_heads = 16;
  c.vocab_size = 1024;
  c.intermediate_size = 256;
  c.n_routed_experts = 8;
  c.n_shared_experts = 2;
  c.moe_intermediate_size = 64;
  EXPECT_NO_THROW(local_config(c, {.size = 4}));
  const ModelConfig l = local_config(c, {.rank = 1, .size = 4});
  EXPECT_EQ(l.num_attention_heads, 4);
  EXPECT_EQ(l.vocab_size, 256);
  EXPECT_EQ(l.moe_intermediate_size, 16);
  EXPECT_EQ(local_config(c, {.size = 4, .expert_parallel = true}).moe_intermediate_size, 64);
  const auto message = [&](ModelShard s) {
    try {
      s.validate(c);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({.size = 3}), "tensor_parallel_size 3 does not divide num_attention_heads (16)");
  EXPECT_EQ(message({.size = 16, .expert_parallel = true}),
            "expert parallelism over 16 ranks needs at least as many routed experts; the model has 8");
  c.vocab_size = 1000;
  EXPECT_EQ(message({.size = 16}), "tensor_parallel_size 16 does not divide vocab_size (1000)");
}

TEST(StepBatch, EncodesAndDecodesTheForwardBatch) {
  ForwardBatchBuilder b(4, 3);
  const int32_t pages_a[] = {2}, pages_b[] = {5, 6};
  const int32_t one[] = {9}, many[] = {3, 4, 5, 6, 7};
  b.add(one, 2, pages_a, true);
  b.add(many, 0, pages_b, true);
  ForwardBatch batch = std::move(b).take();
  batch.decode_context_bound = 32;
  const ForwardBatch got = decode_forward_batch(encode_forward_batch(batch));
  EXPECT_EQ(got.token_ids, batch.token_ids);
  EXPECT_EQ(got.positions, batch.positions);
  EXPECT_EQ(got.slot_mapping, batch.slot_mapping);
  EXPECT_EQ(got.query_start, batch.query_start);
  EXPECT_EQ(got.context_lens, batch.context_lens);
  EXPECT_EQ(got.page_table, batch.page_table);
  EXPECT_EQ(got.logits_indices, batch.logits_indices);
  EXPECT_EQ(got.max_pages_per_seq, 3);
  EXPECT_EQ(got.num_decode_seqs, 1);
  EXPECT_EQ(got.decode_context_bound, 32);
  std::vector<int32_t> words = encode_forward_batch(batch);
  words.pop_back();
  EXPECT_THROW(decode_forward_batch(words), Error);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

TEST(WorkerRanks, LanesAndSampledRowsRoundTrip) {
  std::vector<StepBatch> steps(3);
  for (int32_t r = 0; r < 3; ++r) {
    ForwardBatchBuilder b(4, 2);
    const int32_t pages[] = {r, r + 3};
    std::vector<int32_t> tokens(static_cast<size_t>(r + 1), 7 + r);
    b.add(tokens, 0, pages, true);
    steps[static_cast<size_t>(r)].forward = std::move(b).take();
    steps[static_cast<size_t>(r)].forward.dp_max_tokens = 3;
    steps[static_cast<size_t>(r)].forward.sampling.rows = {r, r, r};
  }
  const std::vector<int32_t> message = encode_lanes(steps, {false, true, false});
  ASSERT_EQ(message.front(), static_cast<int32_t>(RankMessage::kStep));
  const std::span<const int32_t> words = std::span<const int32_t>(message).subspan(1);
  for (int32_t r = 0; r < 3; ++r) {
    const auto [batch, idle] = decode_lane(words, r);
    EXPECT_EQ(idle, r == 1);
    EXPECT_EQ(batch.token_ids, steps[static_cast<size_t>(r)].forward.token_ids);
    EXPECT_EQ(batch.page_table, steps[static_cast<size_t>(r)].forward.page_table);
    EXPECT_EQ(batch.sampling.rows, steps[static_cast<size_t>(r)].forward.sampling.rows);
    EXPECT_EQ(batch.dp_max_tokens, 3);
  }
  EXPECT_THROW(decode_lane(words, 3), Error);
  std::vector<SampledToken> rows(2);
  rows[0].token = 11;
  rows[1].token = 12;
  const std::vector<SampledToken> back = decode_sampled_rows(encode_sampled_rows(rows));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].token, 12);
}

TEST(WorkerRanks, DraftPassesRoundTrip) {
  ForwardBatchBuilder b(4, 2);
  const int32_t pages[] = {2, 5};
  const int32_t tokens[] = {9, 10, 11};
  b.add(tokens, 3, pages, true);
  const DraftPass pass{.batch = std::move(b).take(), .hidden_rows = {4, 0, 7}, .reads_step_hidden = false,
                       .keeps_hidden = true};
  const std::vector<int32_t> message = encode_draft_pass(pass);
  ASSERT_EQ(message.front(), static_cast<int32_t>(RankMessage::kDraftPass));
  const DraftPass back = decode_draft_pass(std::span<const int32_t>(message).subspan(1));
  EXPECT_EQ(back.hidden_rows, pass.hidden_rows);
  EXPECT_FALSE(back.reads_step_hidden);
  EXPECT_TRUE(back.keeps_hidden);
  EXPECT_EQ(back.batch.token_ids, pass.batch.token_ids);
  EXPECT_EQ(back.batch.positions, pass.batch.positions);
  EXPECT_EQ(back.batch.page_table, pass.batch.page_table);
  EXPECT_EQ(back.batch.logits_indices, pass.batch.logits_indices);
  // A message cut inside its hidden rows is refused, not read past its end.
  EXPECT_THROW(decode_draft_pass(std::span<const int32_t>(message).subspan(1, 4)), Error);

  // Data-parallel lanes: one pass each in one message, each rank decoding its own.
  const DraftPass other{.batch = pass.batch, .hidden_rows = {1, 2, 3}, .reads_step_hidden = true};
  const std::vector<DraftPass> lanes{pass, other};
  const std::vector<int32_t> both = encode_lane_draft_passes(lanes);
  ASSERT_EQ(both.front(), static_cast<int32_t>(RankMessage::kLaneDraftPasses));
  const std::span<const int32_t> body = std::span<const int32_t>(both).subspan(1);
  EXPECT_EQ(decode_lane_draft_pass(body, 0).hidden_rows, pass.hidden_rows);
  EXPECT_EQ(decode_lane_draft_pass(body, 1).hidden_rows, other.hidden_rows);
  EXPECT_TRUE(decode_lane_draft_pass(body, 1).reads_step_hidden);
  EXPECT_THROW(decode_lane_draft_pass(body, 2), Error);
  EXPECT_THROW(decode_lane_draft_pass(body.subspan(0, 5), 1), Error);
}

}  // namespace
}  // namespace deepinfer
