// The small-M expert FFN in one persistent launch (decode; moe_experts.cu picks it where it measured faster, see
// kFusedFfnMaxTokens): gate/up, down and the combine. Each CTA draws tickets, one work item each (an item is what one
// CTA of the two-kernel path computes: 16 act columns or 32 output columns of one slot). A down item starts as soon
// as its slot's gate/up items are done, not when the whole gate/up grid has drained, with its first weights loaded
// while it waits; the CTAs that finish early go on to the next item instead of leaving a partial wave.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/moe/moe_small_gemm.cuh"

namespace deepinfer::cuda::moe_detail {
namespace {

// The item shapes; kFormat: bf16, e4m3, INT4 or FP4 weights (moe_small_gemm.cuh), the same CTA and shared memory.
template <MoeWeightFormat kFormat>
using FfnGateUpOf = SmallTraits<GemmKind::kGateUp, 1, 4, kFormat>;
template <MoeWeightFormat kFormat>
using FfnDownOf = SmallTraits<GemmKind::kDown, 1, 4, kFormat>;
using FfnGateUp = FfnGateUpOf<MoeWeightFormat::kBf16>;
using FfnDown = FfnDownOf<MoeWeightFormat::kBf16>;
static_assert(FfnGateUp::kThreads == FfnDown::kThreads && FfnGateUp::kMinBlocks == FfnDown::kMinBlocks,
              "one CTA shape for both kinds of item");
static_assert(std::is_same_v<SmallSharedOf<FfnGateUp>, SmallSharedOf<FfnDown>>, "one shared-memory layout");
static_assert(std::is_same_v<SmallSharedOf<FfnGateUpOf<MoeWeightFormat::kFp8>>, SmallSharedOf<FfnGateUp>> &&
                  FfnGateUpOf<MoeWeightFormat::kFp8>::kThreads == FfnGateUp::kThreads &&
                  FfnDownOf<MoeWeightFormat::kFp8>::kOutCols == FfnDown::kOutCols,
              "FP8 items: the same CTA, shared memory and tickets");
static_assert(std::is_same_v<SmallSharedOf<FfnGateUpOf<MoeWeightFormat::kInt4>>, SmallSharedOf<FfnGateUp>> &&
                  FfnGateUpOf<MoeWeightFormat::kInt4>::kThreads == FfnGateUp::kThreads &&
                  FfnDownOf<MoeWeightFormat::kInt4>::kOutCols == FfnDown::kOutCols,
              "INT4 items: the same CTA, shared memory and tickets");
static_assert(std::is_same_v<SmallSharedOf<FfnGateUpOf<MoeWeightFormat::kFp4>>, SmallSharedOf<FfnGateUp>> &&
                  FfnGateUpOf<MoeWeightFormat::kFp4>::kThreads == FfnGateUp::kThreads &&
                  FfnDownOf<MoeWeightFormat::kFp4>::kOutCols == FfnDown::kOutCols,
              "FP4 items: the same CTA, shared memory and tickets");

// The tickets in the order they are drawn: gate/up items of the early slots (the shared experts, known before the
// routing when kp.shared_prewait), gate/up items of the other slots, then the down items of the early slots and of
// the others; slot-major, column blocks in order inside a slot. (Early down items right after the early gate/up ones
// held CTAs while the routing ran and pushed the late gate/up items into a later round.) An item waits only for
// items of smaller tickets, and a ticket is only ever held by a running CTA, so the grid cannot deadlock, whatever
// number of its CTAs is resident.
struct Tickets {
  int early_slots, gu_cols, dn_cols;
  int down, end;  // the first down ticket; the end

  __device__ explicit Tickets(const MoeKernelParams& kp)
      : early_slots(kp.shared_prewait * kp.shared_slots),
        gu_cols(kp.p.inter / FfnGateUp::kOutCols),
        dn_cols(kp.p.hidden / FfnDown::kOutCols) {
    down = kp.max_active * gu_cols;
    end = down + kp.max_active * dn_cols;
  }
};

struct Item {
  bool gate_up, early;
  int slot, col_block;
};

__device__ __forceinline__ Item item_of(const Tickets& tk, int ticket) {
  if (ticket < tk.down) {
    const int slot = ticket / tk.gu_cols;
    return {true, slot < tk.early_slots, slot, ticket % tk.gu_cols};
  }
  const int r = ticket - tk.down, slot = r / tk.dn_cols;
  return {false, slot < tk.early_slots, slot, r % tk.dn_cols};
}

// The early items (shared experts) may run before the grid dependency wait, reading x and writing their own pairs'
// act and y rows: the exception of the gate/up kernel's shared slots (moe_small_gemm.cuh), extended to their down
// items, which read only act rows written by this grid. Everything that reads the routing's output (slot records,
// the combine's ids and weights) comes after the wait.
template <MoeWeightFormat kFormat>
__global__ void __launch_bounds__(FfnGateUp::kThreads, FfnGateUp::kMinBlocks)
    moe_small_ffn_kernel(const __grid_constant__ MoeKernelParams kp) {
  __shared__ SmallSharedOf<FfnGateUp> sm;
  __shared__ int ticket_s[2];  // by iteration parity: a thread may still read one while thread 0 writes the other
  int* const next_ticket = kp.ffn_sync;
  int* const exited = kp.ffn_sync + 1;
  int* const gate_up_done = kp.ffn_sync + 2;  // per slot
  const Tickets tk(kp);
  bool waited = false;
  const auto wait_once = [&] {
    if (!waited) {
      griddep_wait();
      griddep_launch_dependents();
      waited = true;
    }
  };
  if (threadIdx.x == 0) ticket_s[0] = atomicAdd(next_ticket, 1);
  __syncthreads();
  int ticket = ticket_s[0];
  for (int iteration = 1; ticket < tk.end; ++iteration) {
    int next = 0;
    if (threadIdx.x == 0) next = atomicAdd(next_ticket, 1);  // drawn now: its round trip overlaps this item
    const Item it = item_of(tk, ticket);
    if (!it.early) wait_once();
    const SlotWork work = slot_work(kp, it.slot, it.early);
    const auto col_block = [c = it.col_block] { return c; };
    if (work.expert >= 0 && it.gate_up) {
      SmallItem<FfnGateUpOf<kFormat>> item;
      item.load_first(kp, work.expert, col_block);
      item.load_pairs(kp, sm, work, 0);
      item.compute(kp, sm, work, col_block);
      __threadfence();  // each thread's act stores, then one count for the CTA (the combine's handoff, too)
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(&gate_up_done[it.slot], 1);
    } else if (work.expert >= 0) {
      SmallItem<FfnDownOf<kFormat>> item;
      item.load_first(kp, work.expert, col_block);  // weights only: in flight while the slot's act completes
      if (threadIdx.x == 0) {
        // Polled every few hundred nanoseconds: hundreds of CTAs polling a few lines back to back slowed the loads
        // of the items still streaming.
        while (ld_acquire_gpu(&gate_up_done[it.slot]) < tk.gu_cols) __nanosleep(256);
      }
      __syncthreads();
      item.load_pairs(kp, sm, work, 0);
      item.compute(kp, sm, work, col_block);
      wait_once();  // the combine reads the routing's ids and weights, and the active count
      combine_if_last<FfnDown>(kp, sm, it.col_block, __ldcg(&kp.slot_info[it.slot]).w);
    } else if (!it.gate_up && it.slot == 0) {
      // No pair has a row (slot 0 is empty only then: under a shard, every token's experts are held elsewhere), so
      // no down item counts itself done: slot 0's items write the combine of their columns, out = add (or zeros).
      combine_columns<FfnDown>(kp, it.col_block * FfnDown::kOutCols);
    }
    if (threadIdx.x == 0) ticket_s[iteration & 1] = next;
    __syncthreads();
    ticket = ticket_s[iteration & 1];
  }
  wait_once();  // no CTA leaves before its wait (ptx.cuh)
  // The last CTA out resets the tickets and the slot counters for the next call: every CTA has drawn its last ticket
  // (its value came back) and fenced its counter increments before it counts itself out.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(exited, 1) == static_cast<int>(gridDim.x) - 1) {
      __threadfence();
      for (int s = 0; s < kp.max_active; ++s) gate_up_done[s] = 0;
      *next_ticket = 0;
      *exited = 0;
    }
  }
}

}  // namespace

namespace {

template <MoeWeightFormat kFormat>
void launch_small_ffn_for(const MoeKernelParams& kp, LaunchStream stream) {
  // As many CTAs as can be resident (more would only draw the end ticket), fewer when there are fewer items.
  static const int per_sm = [] {
    int n = 0;
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, moe_small_ffn_kernel<kFormat>, FfnGateUp::kThreads, 0));
    return n;
  }();
  const int64_t items =
      int64_t{kp.max_active} * (kp.p.inter / FfnGateUp::kOutCols + kp.p.hidden / FfnDown::kOutCols);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(items, int64_t{per_sm} * kp.p.num_sms));
  launch_pdl(moe_small_ffn_kernel<kFormat>,
             {.grid = dim3(static_cast<unsigned>(grid)), .block = dim3(FfnGateUp::kThreads)}, stream, kp);
}

}  // namespace

void launch_small_ffn(const MoeKernelParams& kp, LaunchStream stream) {
  switch (kp.p.weight_format) {
    case MoeWeightFormat::kFp8: launch_small_ffn_for<MoeWeightFormat::kFp8>(kp, stream); break;
    case MoeWeightFormat::kInt4: launch_small_ffn_for<MoeWeightFormat::kInt4>(kp, stream); break;
    case MoeWeightFormat::kFp4: launch_small_ffn_for<MoeWeightFormat::kFp4>(kp, stream); break;
    case MoeWeightFormat::kBf16: launch_small_ffn_for<MoeWeightFormat::kBf16>(kp, stream); break;
  }
}

}  // namespace deepinfer::cuda::moe_detail
