// The CUDA backend's launch ledger (backend/cuda/runtime/launch_ledger.h) on the CPU: its region overlaps, the
// possibly running set under each trigger, the model's decode layer giving the launch parameters the CUDA backend
// passed before the ledger decided them (W_UK computing before its wait, the decode's fresh_rows 1, the early
// triggers), and the pre-wait reads it must refuse.
#include "backend/cuda/runtime/launch_ledger.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer::cuda {
namespace {

// Hands out views at increasing addresses, 256 bytes apart, as a device pool would. Nothing is behind them: the
// ledger only compares addresses.
class Arena {
 public:
  TensorView take(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    void* data = reinterpret_cast<void*>(next_);
    next_ += (bytes + 255) / 256 * 256 + 256;
    return {data, dtype, shape, Device::kCuda};
  }

 private:
  uintptr_t next_ = uintptr_t{1} << 32;
};

// One decode layer's tensors as DeepseekModel::attention builds them (V2-Lite: 16 heads, rank 512, rope 64,
// nope 128), for `decode` decode tokens then `prefill` prefill tokens.
struct Layer {
  static constexpr int64_t kHeads = 16, kRank = 512, kRope = 64, kNope = 128, kQk = kNope + kRope;
  static constexpr int64_t kLatent = kRank + kRope, kV = 128, kPages = 64, kPageSize = 64, kMaxPages = 8;

  Layer(Arena& arena, int64_t decode, int64_t prefill)
      : decode_tokens(decode),
        tokens(decode + prefill),
        cache(arena.take({kPages, kPageSize, kLatent}, DType::kBF16)),
        latent(arena.take({tokens, kLatent}, DType::kBF16)),
        q(arena.take({tokens, kHeads * kQk}, DType::kBF16)),
        q_abs(arena.take({decode, kHeads, kLatent}, DType::kBF16)),
        o_latent(arena.take({decode, kHeads, kRank}, DType::kBF16)),
        attn(arena.take({tokens, kHeads, kV}, DType::kBF16)),
        slots(arena.take({tokens}, DType::kI32)),
        positions(arena.take({tokens}, DType::kI32)),
        context_lens(arena.take({decode}, DType::kI32)),
        page_table(arena.take({decode, kMaxPages}, DType::kI32)),
        query_start(arena.take({decode + 1}, DType::kI32)),
        kv_a_norm(arena.take({kRank}, DType::kF32)),
        inv_freq(arena.take({kRope / 2}, DType::kF32)),
        w_uk(arena.take({kHeads, kRank, kNope}, DType::kBF16)),
        w_uv(arena.take({kHeads, kV, kRank}, DType::kBF16)) {}

  TensorView q_heads() const { return q.reshaped({tokens, kHeads, kQk}); }

  MlaPrepareArgs prepare() const {
    return {.latent = latent, .q = q_heads(), .q_abs = q_abs, .cache = cache, .slot_mapping = slots,
            .positions = positions, .kv_a_norm = kv_a_norm, .inv_freq = inv_freq, .kv_lora_rank = kRank};
  }
  HeadLinearArgs w_uk_product() const {
    return {.x = q_heads().rows(0, decode_tokens).columns(0, kNope), .w = w_uk, .out = q_abs.columns(0, kRank),
            .x_head_stride = kQk, .out_head_stride = kLatent};
  }
  MlaDecodeArgs decode() const {
    return {.q = q_abs, .cache = cache, .out_latent = o_latent,
            .meta = {.query_start = query_start, .context_lens = context_lens, .page_table = page_table,
                     .num_seqs = static_cast<int32_t>(decode_tokens), .max_pages_per_seq = kMaxPages,
                     .max_context_len = 512},
            .kv_lora_rank = kRank, .w_uv = w_uv, .out = attn.rows(0, decode_tokens)};
  }

  int64_t decode_tokens, tokens;
  TensorView cache, latent, q, q_abs, o_latent, attn, slots, positions, context_lens, page_table, query_start;
  TensorView kv_a_norm, inv_freq, w_uk, w_uv;
};

// The launch parameters the ledger decides for one decode layer.
struct LayerLaunches {
  bool w_uk_before_wait = false;
  bool w_uk_triggers_early = false;
  int32_t decode_fresh_rows = -2;
  bool decode_combine_triggers_early = false;
  bool w_uv_triggers_early = false;
  bool norms_trigger_early = false;
};

// What the CUDA backend records for one layer of a decode step, in its order: q/kv_a (the skinny GEMM at decode
// sizes, cuBLAS above them), mla_prepare, W_UK (the per-head GEMV up to 8 tokens, cuBLAS above), the decode (with
// W_UV), o_proj, the post-attention add_rms_norm, the MoE, the next layer's add_rms_norm.
LayerLaunches run_layer(LaunchLedger& ledger, const Layer& layer, bool small_batch) {
  LayerLaunches out;
  if (small_batch) {
    ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // multi_linear: q_proj + kv_a_proj, skinny
  } else {
    ledger.library_work(OpAccesses::any());  // linear on cuBLAS, twice
    ledger.library_work(OpAccesses::any());
  }
  ledger.launched(Trigger::kAfterWait, accesses_of(layer.prepare()));
  const HeadLinearArgs w_uk = layer.w_uk_product();
  if (small_batch) {
    out.w_uk_before_wait = ledger.head_linear_before_wait(w_uk);
    const Trigger trigger = ledger.trigger(OpKind::kHeadLinear);
    out.w_uk_triggers_early = trigger == Trigger::kAtStart;
    ledger.launched(trigger, accesses_of(w_uk));
  } else {
    ledger.library_work(accesses_of(w_uk));
  }
  out.decode_fresh_rows = ledger.mla_decode_fresh_rows(layer.decode());
  out.decode_combine_triggers_early = ledger.trigger(OpKind::kMlaDecode) == Trigger::kAtStart;
  out.w_uv_triggers_early = ledger.trigger(OpKind::kHeadLinear) == Trigger::kAtStart;
  ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // the decode, W_UV in its entry
  ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // o_proj
  out.norms_trigger_early = ledger.trigger(OpKind::kAddRmsNorm) == Trigger::kAtStart;
  ledger.launched(ledger.trigger(OpKind::kAddRmsNorm), OpAccesses::any());
  ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // moe
  ledger.launched(ledger.trigger(OpKind::kAddRmsNorm), OpAccesses::any());
  return out;
}

TEST(LaunchLedger, RegionsOfColumnWindowsOverlapOnlyWhereTheirColumnsDo) {
  alignas(16) static std::array<std::byte, 4096> buffer{};
  std::byte* base = buffer.data();
  // 8 rows of 192 bf16 values: the nope columns [0, 128) and the rope columns [128, 192).
  const Region nope = Region::window(base, DType::kBF16, 8, 128, 192);
  const Region rope = Region::window(base + 128 * 2, DType::kBF16, 8, 64, 192);
  EXPECT_FALSE(overlaps(nope, rope));
  EXPECT_FALSE(overlaps(rope, nope));
  EXPECT_TRUE(overlaps(nope, Region::window(base + 127 * 2, DType::kBF16, 8, 2, 192)));  // straddles column 128
  EXPECT_TRUE(overlaps(rope, Region::window(base + 191 * 2, DType::kBF16, 4, 2, 192)));  // wraps into the next row
  EXPECT_TRUE(overlaps(nope, Region::bytes(base + 200 * 2, 2)));      // row 1, column 8
  EXPECT_FALSE(overlaps(nope, Region::bytes(base + 130 * 2, 2)));     // row 0, column 130
  EXPECT_TRUE(overlaps(nope, Region::window(base, DType::kBF16, 8, 16, 96)));  // another period: assumed to meet
  EXPECT_FALSE(overlaps(nope, Region::bytes(base + 8 * 192 * 2, 64)));         // past the last row
  EXPECT_FALSE(overlaps(nope, Region{}));
  EXPECT_TRUE(overlaps(Region::bytes(base, 100), Region::bytes(base + 99, 1)));
  EXPECT_FALSE(overlaps(Region::bytes(base, 100), Region::bytes(base + 100, 1)));
}

TEST(LaunchLedger, TheRunningSetFollowsEachTrigger) {
  LaunchLedger ledger(true);
  EXPECT_TRUE(ledger.running().empty());
  ledger.launched(Trigger::kAfterWait, OpAccesses::any());
  ledger.launched(Trigger::kAtStart, OpAccesses::exactly({}));
  EXPECT_EQ(ledger.running().size(), 2u);  // the early one beside the one before it
  ledger.launched(Trigger::kAfterWait, OpAccesses::exactly({}));
  EXPECT_EQ(ledger.running().size(), 1u);  // an op that waited: the ones before it are done
  ledger.library_work(OpAccesses::exactly({}));
  EXPECT_EQ(ledger.running().size(), 2u);  // a library kernel may run beside them
  ledger.serialized();
  EXPECT_TRUE(ledger.running().empty());
  ledger.unknown_work();
  ASSERT_EQ(ledger.running().size(), 1u);
  EXPECT_TRUE(ledger.running()[0].anything);
  // A long run of early ops stays bounded and still counts as touching anything.
  ledger.serialized();
  for (int i = 0; i < 40; ++i) ledger.launched(Trigger::kAtStart, i == 0 ? OpAccesses::any() : OpAccesses::exactly({}));
  EXPECT_LE(ledger.running().size(), 17u);
  EXPECT_FALSE(ledger.may_touch_before_wait({}, {}));
}

TEST(LaunchLedger, TriggersAtStartForTheDecodeChainsOpsOnlyAndNeverWhenDisabled) {
  const LaunchLedger on(true), off(false);
  for (OpKind op : {OpKind::kAddRmsNorm, OpKind::kHeadLinear, OpKind::kMlaDecode}) {
    EXPECT_EQ(on.trigger(op), Trigger::kAtStart) << op_name(op);
    EXPECT_EQ(off.trigger(op), Trigger::kAfterWait) << op_name(op);
  }
  for (OpKind op : {OpKind::kLinear, OpKind::kMultiLinear, OpKind::kMlaPrepare, OpKind::kMoe, OpKind::kRmsNorm}) {
    EXPECT_EQ(on.trigger(op), Trigger::kAfterWait) << op_name(op);
  }
}

// The parameters deepseek.cpp asked for before the ledger: W_UK beside mla_prepare (overlap_previous_op), early
// triggers on W_UK, the decode, W_UV and both norms (next_op_may_start_early), fresh_rows 1.
void expect_todays_parameters(const LayerLaunches& l, bool small_batch) {
  EXPECT_EQ(l.w_uk_before_wait, small_batch);  // only head_gemv takes it
  EXPECT_EQ(l.w_uk_triggers_early, small_batch);
  EXPECT_EQ(l.decode_fresh_rows, 1);
  EXPECT_TRUE(l.decode_combine_triggers_early);
  EXPECT_TRUE(l.w_uv_triggers_early);
  EXPECT_TRUE(l.norms_trigger_early);
}

TEST(LaunchLedger, TheModelsDecodeLayersGetTheirParameters) {
  for (const bool small_batch : {true, false}) {
    for (const int64_t prefill : {int64_t{0}, int64_t{37}}) {
      SCOPED_TRACE(testing::Message() << (small_batch ? "batch 4" : "batch 32") << ", " << prefill << " prefill tokens");
      Arena arena;
      const Layer first(arena, small_batch ? 4 : 32, prefill), second(arena, small_batch ? 4 : 32, prefill);
      LaunchLedger ledger(true);
      ledger.serialized();  // the step's inputs uploaded
      ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // embedding
      ledger.launched(Trigger::kAfterWait, OpAccesses::any());  // the first input norm
      expect_todays_parameters(run_layer(ledger, first, small_batch), small_batch);
      expect_todays_parameters(run_layer(ledger, second, small_batch), small_batch);
    }
  }
}

TEST(LaunchLedger, WithoutEarlyTriggersTheDecodeReadsEveryRowBeforeItsWait) {
  Arena arena;
  const Layer layer(arena, 1, 0);
  LaunchLedger ledger(false);
  const LayerLaunches l = run_layer(ledger, layer, true);
  EXPECT_TRUE(l.w_uk_before_wait);
  EXPECT_FALSE(l.w_uk_triggers_early);
  EXPECT_EQ(l.decode_fresh_rows, 0);  // mla_prepare completed before W_UK let the decode start
  EXPECT_FALSE(l.norms_trigger_early);
}

TEST(LaunchLedger, RefusesHeadLinearReadsOfWhatARunningOpWrites) {
  Arena arena;
  const Layer layer(arena, 2, 0);
  LaunchLedger ledger(true);
  ledger.launched(Trigger::kAfterWait, accesses_of(layer.prepare()));
  EXPECT_TRUE(ledger.head_linear_before_wait(layer.w_uk_product()));
  // x the rope columns mla_prepare rotates, or the whole query rows.
  HeadLinearArgs rope_x = layer.w_uk_product();
  rope_x.x = layer.q_heads().rows(0, 2).columns(Layer::kNope, Layer::kRope);
  rope_x.w = arena.take({Layer::kHeads, Layer::kRank, Layer::kRope}, DType::kBF16);
  EXPECT_FALSE(ledger.head_linear_before_wait(rope_x));
  HeadLinearArgs whole_x = layer.w_uk_product();
  whole_x.x = layer.q_heads().rows(0, 2);
  whole_x.x_head_stride = 0;
  whole_x.w = arena.take({Layer::kHeads, Layer::kRank, Layer::kQk}, DType::kBF16);
  EXPECT_FALSE(ledger.head_linear_before_wait(whole_x));
  // out over q_abs's rope columns, which mla_prepare writes; out over the latent it writes.
  HeadLinearArgs rope_out = layer.w_uk_product();
  rope_out.out = layer.q_abs.columns(Layer::kRank, Layer::kRope);
  rope_out.w = arena.take({Layer::kHeads, Layer::kRope, Layer::kNope}, DType::kBF16);
  EXPECT_FALSE(ledger.head_linear_before_wait(rope_out));
  // Writing what a running op only reads is refused too: out over the positions mla_prepare reads.
  HeadLinearArgs over_reads = layer.w_uk_product();
  over_reads.out = TensorView{layer.positions.data, DType::kBF16, {1, 1, 2}, Device::kCuda};
  over_reads.w = arena.take({1, 2, Layer::kNope}, DType::kBF16);
  over_reads.x = TensorView{layer.q.data, DType::kBF16, {1, 1, Layer::kNope}, Device::kCuda};
  over_reads.x_head_stride = 0;
  over_reads.out_head_stride = 0;
  EXPECT_FALSE(ledger.head_linear_before_wait(over_reads));
  // An op that may touch anything, work the ledger did not see.
  ledger.launched(Trigger::kAtStart, OpAccesses::any());
  EXPECT_FALSE(ledger.head_linear_before_wait(layer.w_uk_product()));
  ledger.unknown_work();
  EXPECT_FALSE(ledger.head_linear_before_wait(layer.w_uk_product()));
  // After a copy nothing runs.
  ledger.serialized();
  EXPECT_TRUE(ledger.head_linear_before_wait(layer.w_uk_product()));
}

TEST(LaunchLedger, DecodeFreshRowsFollowTheCacheWritersStillRunning) {
  Arena arena;
  const Layer layer(arena, 3, 5), other_layer(arena, 3, 5);
  LaunchLedger ledger(true);
  const MlaDecodeArgs decode = layer.decode();
  // No op running, or none writing this cache: every row is complete.
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 0);
  ledger.launched(Trigger::kAfterWait, accesses_of(other_layer.prepare()));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 0);
  ledger.launched(Trigger::kAfterWait, accesses_of(GatherRowsArgs{.src = layer.cache.reshaped({Layer::kPages * Layer::kPageSize, Layer::kLatent}),
                                                                  .indices = layer.slots,
                                                                  .out = layer.latent}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 0);  // reads the cache, writes elsewhere
  // The step's cache write running (with an early op after it, or right before): the newest rows.
  ledger.launched(Trigger::kAfterWait, accesses_of(layer.prepare()));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 1);
  ledger.launched(Trigger::kAtStart, accesses_of(layer.w_uk_product()));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 1);
  // A plain cache write may have put any row: refused.
  ledger.launched(Trigger::kAfterWait,
                  accesses_of(MlaCacheWriteArgs{.latent = layer.latent, .cache = layer.cache,
                                                .slot_mapping = layer.slots}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
  // The metadata written by a running op: refused.
  ledger.launched(Trigger::kAfterWait, accesses_of(AddArgs{.x = layer.context_lens, .y = layer.positions}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
  ledger.launched(Trigger::kAfterWait, accesses_of(AddArgs{.x = layer.page_table.rows(1, 1), .y = layer.positions}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
  // An add elsewhere: nothing of the decode's is written.
  ledger.launched(Trigger::kAfterWait, accesses_of(AddArgs{.x = layer.latent, .y = layer.attn}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 0);
  // Anything, or unseen work: unknown.
  ledger.launched(Trigger::kAtStart, OpAccesses::any());
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
  ledger.serialized();
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), 0);
  ledger.unknown_work();
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
  // A library call writing the cache (a cuBLAS GEMM into it) beside the step's write: refused.
  ledger.serialized();
  ledger.launched(Trigger::kAfterWait, accesses_of(layer.prepare()));
  const TensorView first_page{layer.cache.data, DType::kBF16, {Layer::kPageSize, Layer::kLatent}, Device::kCuda};
  ledger.library_work(accesses_of(LinearArgs{.x = layer.latent, .w = layer.latent, .out = first_page}));
  EXPECT_EQ(ledger.mla_decode_fresh_rows(decode), -1);
}

}  // namespace
}  // namespace deepinfer::cuda
