#include "backend/cuda/runtime/launch_ledger.h"

#include <algorithm>

namespace deepinfer::cuda {
namespace {

// Past this many possibly running ops (a long run of ops that all trigger at their start) the ledger keeps one that
// may touch anything instead: a bound on the host work per decision.
constexpr size_t kMaxRunning = 16;

int64_t positive_mod(int64_t v, int64_t m) {
  const int64_t r = v % m;
  return r < 0 ? r + m : r;
}

bool writes(Touch t) { return t != Touch::kRead; }

// The rows of x a head_linear reads and the rows of out it writes: T x H rows of K (x) and N (out) elements, at the
// ops' head strides. Empty regions when the shapes are not the op's (validate() refuses those).
struct HeadLinearRegions {
  Region x;
  Region out;
};
HeadLinearRegions head_linear_regions(const HeadLinearArgs& a) {
  if (a.x.shape.ndim() != 3 || a.w.shape.ndim() != 3) return {};
  const int64_t rows = a.x.shape[0] * a.x.shape[1], k = a.x.shape[2], n = a.w.shape[1];
  const int64_t x_stride = a.x_head_stride == 0 ? k : a.x_head_stride;
  const int64_t out_stride = a.out_head_stride == 0 ? n : a.out_head_stride;
  return {.x = Region::window(a.x.data, a.x.dtype, rows, k, x_stride),
          .out = Region::window(a.out.data, a.out.dtype, rows, n, out_stride)};
}

}  // namespace

Region Region::bytes(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return {};
  const auto width = static_cast<int64_t>(bytes);
  return {.begin = reinterpret_cast<uintptr_t>(data), .width = width, .stride = width, .count = 1};
}

Region Region::window(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride) {
  if (data == nullptr || rows <= 0 || cols <= 0) return {};
  const auto elem = static_cast<int64_t>(dtype_size(dtype));
  return {.begin = reinterpret_cast<uintptr_t>(data), .width = cols * elem, .stride = row_stride * elem,
          .count = rows};
}

bool overlaps(const Region& a, const Region& b) {
  if (a.empty() || b.empty()) return false;
  if (a.end() <= b.begin || b.end() <= a.begin) return false;
  // Blocks repeating with one period: a's bytes sit at [0, a.width) of it, b's at [d, d + b.width) (mod the period).
  // A single block repeats with any period at least its width.
  int64_t period = 0;
  if (a.count > 1 && b.count > 1) {
    period = a.stride == b.stride ? a.stride : 0;
  } else if (a.count > 1) {
    period = a.stride;
  } else if (b.count > 1) {
    period = b.stride;
  }
  if (period <= 0 || a.width > period || b.width > period) return true;
  const int64_t d = positive_mod(static_cast<int64_t>(b.begin - a.begin), period);
  return d < a.width || d + b.width > period;
}

OpAccesses OpAccesses::exactly(std::initializer_list<Access> accesses) {
  OpAccesses out;
  out.anything = false;
  for (const Access& access : accesses) {
    if (access.region.empty()) continue;
    if (out.count == kMaxAccesses) return any();
    out.list[out.count++] = access;
  }
  return out;
}

OpAccesses accesses_of(const LinearArgs& a) {
  return OpAccesses::exactly({{Region::of(a.x), Touch::kRead},
                              {Region::of(a.w), Touch::kRead},
                              {Region::of(a.out), Touch::kWrite}});
}

OpAccesses accesses_of(const HeadLinearArgs& a) {
  if (a.x.shape.ndim() != 3 || a.w.shape.ndim() != 3) return OpAccesses::any();
  const HeadLinearRegions r = head_linear_regions(a);
  return OpAccesses::exactly({{r.x, Touch::kRead}, {Region::of(a.w), Touch::kRead}, {r.out, Touch::kWrite}});
}

OpAccesses accesses_of(const GatherRowsArgs& a) {
  return OpAccesses::exactly({{Region::of(a.src), Touch::kRead},
                              {Region::of(a.indices), Touch::kRead},
                              {Region::of(a.out), Touch::kWrite}});
}

OpAccesses accesses_of(const AddArgs& a) {
  return OpAccesses::exactly({{Region::of(a.x), Touch::kWrite}, {Region::of(a.y), Touch::kRead}});
}

OpAccesses accesses_of(const MlaCacheWriteArgs& a) {
  return OpAccesses::exactly({{Region::of(a.latent), Touch::kRead},
                              {Region::of(a.slot_mapping), Touch::kRead},
                              {Region::of(a.cache), Touch::kWrite}});
}

OpAccesses accesses_of(const MlaPrepareArgs& a) {
  if (a.q.shape.ndim() != 3) return OpAccesses::any();
  const int64_t tokens = a.num_tokens(), heads = a.q.shape[1], rope = a.rope_dim();
  const int64_t qk_dim = a.q.shape[2], latent_dim = a.kv_lora_rank + rope;
  const auto elem = static_cast<int64_t>(dtype_size(a.q.dtype));
  // q's rope columns are rotated in place (its nope columns are neither read nor written), and the decode tokens'
  // rotated q_pe goes into q_abs's rope columns (its rank columns are left as they are).
  const auto* q_pe = static_cast<const std::byte*>(a.q.data) + (qk_dim - rope) * elem;
  const auto* abs_pe = a.q_abs.data == nullptr
                           ? nullptr
                           : static_cast<const std::byte*>(a.q_abs.data) + a.kv_lora_rank * elem;
  return OpAccesses::exactly({{Region::of(a.latent), Touch::kWrite},
                              {Region::window(q_pe, a.q.dtype, tokens * heads, rope, qk_dim), Touch::kWrite},
                              {Region::window(abs_pe, a.q_abs.dtype, a.num_decode_tokens() * heads, rope, latent_dim),
                               Touch::kWrite},
                              {Region::of(a.cache), Touch::kWriteStepCacheRows},
                              {Region::of(a.slot_mapping), Touch::kRead},
                              {Region::of(a.positions), Touch::kRead},
                              {Region::of(a.kv_a_norm), Touch::kRead},
                              {Region::of(a.inv_freq), Touch::kRead}});
}

Trigger LaunchLedger::trigger(OpKind op) const {
  if (!early_trigger_) return Trigger::kAfterWait;
  switch (op) {
    case OpKind::kAddRmsNorm:  // before the router (moe) or the next layer's q/kv_a projection
    case OpKind::kHeadLinear:  // W_UK before the decode; W_UV before o_proj
    case OpKind::kMlaDecode:   // its split combine before W_UV
      return Trigger::kAtStart;
    default:
      return Trigger::kAfterWait;
  }
}

void LaunchLedger::launched(Trigger trigger, const OpAccesses& accesses) {
  if (trigger == Trigger::kAfterWait) running_.clear();
  if (running_.size() == kMaxRunning) {
    running_.clear();
    running_.push_back(OpAccesses::any());
  }
  running_.push_back(accesses);
}

void LaunchLedger::serialized() { running_.clear(); }

void LaunchLedger::unknown_work() {
  running_.clear();
  running_.push_back(OpAccesses::any());
}

bool LaunchLedger::may_touch_before_wait(std::initializer_list<Region> reads,
                                         std::initializer_list<Region> writes_before_wait) const {
  for (const OpAccesses& op : running_) {
    if (op.anything) return false;
    for (size_t i = 0; i < op.count; ++i) {
      const Access& access = op.list[i];
      for (const Region& r : writes_before_wait) {
        if (overlaps(access.region, r)) return false;
      }
      if (!writes(access.touch)) continue;
      for (const Region& r : reads) {
        if (overlaps(access.region, r)) return false;
      }
    }
  }
  return true;
}

bool LaunchLedger::head_linear_before_wait(const HeadLinearArgs& a) const {
  if (a.x.shape.ndim() != 3 || a.w.shape.ndim() != 3) return false;
  const HeadLinearRegions r = head_linear_regions(a);
  // x read and out written before the wait; w is a weight, which no op writes.
  return may_touch_before_wait({r.x}, {r.out});
}

int32_t LaunchLedger::mla_decode_fresh_rows(const MlaDecodeArgs& a) const {
  const Region cache = Region::of(a.cache);
  const std::initializer_list<Region> metadata = {Region::of(a.meta.context_lens), Region::of(a.meta.page_table)};
  int32_t fresh = 0;
  for (const OpAccesses& op : running_) {
    if (op.anything) return -1;
    for (size_t i = 0; i < op.count; ++i) {
      const Access& access = op.list[i];
      if (!writes(access.touch)) continue;
      for (const Region& r : metadata) {
        if (overlaps(access.region, r)) return -1;
      }
      if (!overlaps(access.region, cache)) continue;
      if (access.touch != Touch::kWriteStepCacheRows) return -1;
      fresh = 1;  // each sequence's newest row
    }
  }
  return fresh;
}

}  // namespace deepinfer::cuda
