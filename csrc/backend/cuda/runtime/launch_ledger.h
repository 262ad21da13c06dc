// The launch ledger: what the CUDA backend knows, on the host, about the ops still possibly running on its stream.
//
// Every kernel launches as a programmatic dependent (launch.h), so a kernel may start before the ops ahead of it on the
// stream have completed. It is free to do so as long as it touches global memory only after its griddep_wait (ptx.cuh,
// rule 1). Some kernels read more before their wait, to overlap more: head_gemv (head_linear) may compute whole before
// it, and MLA decode may copy the cache rows that no running op writes. Whether such a read is safe depends on the op
// sequence, not on the op alone, so the backend keeps this ledger of the ops launched so far and asks it:
//   - Which ops may still run when the next kernel starts. A kernel lets its successor start when it triggers
//     (griddep_launch_dependents, or its completion when it never does). An op whose trigger comes after a wait of
//     its own (Trigger::kAfterWait) lets the next op start only once every op before it has completed: the possibly
//     running set is then that op alone. An op of one kernel that triggers at its start (Trigger::kAtStart) adds
//     itself to the set that was possibly running when it started. A memset or a copy waits for everything before it,
//     and everything after it waits for it: the set is empty after it. A library's kernels (cuBLAS) are not ours to
//     know, so the ledger assumes the least of them: they may start and let their successor start early, touching
//     only their operands (library_work()).
//   - What each of those ops touches: byte regions read or written, exact where a decision needs it (strided column
//     windows of the same rows, as mla_prepare rotating q's rope columns while W_UK reads q's nope columns), otherwise
//     "anything".
// A read before the wait is allowed only when no possibly running op writes that memory, a write only when none
// touches it. Graph capture records the same op sequence, so it gets the same decisions; work the ledger cannot see
// (a graph replayed) leaves it unknown: something that may still run and touch anything.
//
// Which ops trigger at their start is a performance choice of the backend (trigger()), not a correctness one: every
// kernel that reads memory before its wait asks the ledger first, except reads of memory only copies wrote (the
// step's inputs, uploaded before the step's first kernel) and the MoE kernels' reads behind a routing kernel of the
// same op that waited (moe_small_gemm.cuh).
//
// Host-only (no CUDA header), so its decisions are unit-tested on the CPU (tests/cpp/launch_ledger_test.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backend/backend.h"
#include "backend/ops/copy.h"
#include "backend/ops/dense.h"
#include "backend/ops/mla.h"
#include "core/tensor.h"

namespace deepinfer::cuda {

// `count` blocks of `width` bytes, `stride` bytes apart, from `begin`: a tensor (one block), or a window of columns of
// its rows. Empty when count or width is 0.
struct Region {
  uintptr_t begin = 0;
  int64_t width = 0;
  int64_t stride = 0;
  int64_t count = 0;

  bool empty() const { return count <= 0 || width <= 0; }
  // One past the last byte.
  uintptr_t end() const { return begin + static_cast<uintptr_t>((count - 1) * stride + width); }

  static Region bytes(const void* data, size_t bytes);
  static Region of(const ConstTensorView& t) {
    return bytes(t.data, static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  }
  // `rows` rows of `cols` elements of `dtype`, starting `row_stride` elements apart.
  static Region window(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride);
};

// Whether the two regions may share a byte. Exact for blocks repeating with one period (columns of the same rows);
// otherwise it says yes whenever their spans meet.
bool overlaps(const Region& a, const Region& b);

enum class Touch : uint8_t {
  kRead,
  kWrite,
  // Writes, in one layer of the latent cache, the rows of the step's tokens only: of a sequence that an mla_decode
  // of the same step attends over, its newest row (MlaPrepareArgs's step contract, mla.h).
  kWriteStepCacheRows,
};

struct Access {
  Region region;
  Touch touch = Touch::kRead;
};

// The memory one op touches: up to kMaxAccesses regions, or anything.
struct OpAccesses {
  static constexpr size_t kMaxAccesses = 8;
  std::array<Access, kMaxAccesses> list{};
  size_t count = 0;
  bool anything = true;

  static OpAccesses any() { return {}; }
  // Exactly these (empty regions dropped); anything when there are more than kMaxAccesses.
  static OpAccesses exactly(std::initializer_list<Access> accesses);
};

// What the ops whose descriptions a decision needs touch. The others are recorded as touching anything.
OpAccesses accesses_of(const LinearArgs& a);
OpAccesses accesses_of(const HeadLinearArgs& a);
OpAccesses accesses_of(const GatherRowsArgs& a);
OpAccesses accesses_of(const AddArgs& a);
OpAccesses accesses_of(const MlaCacheWriteArgs& a);  // a plain write of the cache: its slots may be any rows
OpAccesses accesses_of(const MlaPrepareArgs& a);     // the step's cache rows (Touch::kWriteStepCacheRows)

// When an op lets the op after it start (see the file comment).
enum class Trigger : uint8_t {
  kAfterWait,  // after a griddep_wait of the op: everything before the op has completed by then
  kAtStart,    // at the start of the op's one kernel, beside whatever was possibly running then
};

class LaunchLedger {
 public:
  // early_trigger: whether trigger() may answer kAtStart (off: every op triggers after its wait, the plainest chain;
  // the tests compare both).
  explicit LaunchLedger(bool early_trigger = true) : early_trigger_(early_trigger) {}

  // The trigger an op's kernel is given: at its start for the ops whose successors, in the model's decode chain,
  // gain from starting early (both add_rms_norms before the router or the next layer's projections, W_UK before the
  // decode, the decode's split combine and W_UV before o_proj); after the wait for every other op.
  Trigger trigger(OpKind op) const;

  // An op of our kernels was queued.
  void launched(Trigger trigger, const OpAccesses& accesses);
  // A library call (cuBLAS) was queued: it may run beside whatever was possibly running, and let the next op start
  // at once, as an op of ours that triggers at its start would.
  void library_work(const OpAccesses& accesses) { launched(Trigger::kAtStart, accesses); }
  // Work that waits for everything before it and that everything after it waits for (a memset, a copy, a
  // synchronization, the start of a graph capture).
  void serialized();
  // Work queued that the ledger did not see (a graph replay): it may still run and touch anything.
  void unknown_work();

  // Whether a kernel starting now may read `reads` and write `writes` before its griddep_wait.
  bool may_touch_before_wait(std::initializer_list<Region> reads, std::initializer_list<Region> writes) const;
  // head_gemv's before_wait for this head_linear: x read and out written before the wait.
  bool head_linear_before_wait(const HeadLinearArgs& a) const;
  // MLA decode's fresh_rows for this op starting now: its metadata and every row of its sequences but the last
  // fresh_rows are complete. 1 when a possibly running op is the step's cache write, 0 when no possibly running op
  // writes the cache, -1 when one may write any of it, or the metadata.
  int32_t mla_decode_fresh_rows(const MlaDecodeArgs& a) const;

  // The possibly running ops, oldest first: for tests.
  const std::vector<OpAccesses>& running() const { return running_; }

 private:
  bool early_trigger_;
  std::vector<OpAccesses> running_;  // capacity kept across ops: no allocation once the chain has been seen
};

}  // namespace deepinfer::cuda
