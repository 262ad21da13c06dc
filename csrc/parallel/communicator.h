// The collectives the parallel layouts need, among the ranks of one group (one rank a GPU, or a CPU backend).
//
// Device collectives take views on the rank's backend device and run in order with the backend's ops: on a GPU they
// are queued on the backend's stream and return at once (so a CUDA graph records them with the ops around them); on
// the CPU they return when done. Every rank of the group calls the same collectives in the same order with the same
// shapes. Host collectives carry the step's plan and small host values; they return when done.
//
// A rank that fails, or a collective that does not complete within the group's timeout, ends every rank's next (or
// current) collective with CollectiveError naming the rank, never a silent hang.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {

class CollectiveError : public Error {
 public:
  using Error::Error;
};

enum class HostReduce : uint8_t { kSum, kMin, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  virtual std::string_view name() const = 0;  // "local", "mpi", "nccl"

  // Device collectives (float32 or bfloat16 contiguous views; `in` and `out` do not overlap unless said).
  // inout = the sum over ranks of inout, every rank getting the same values (summed in rank order where the
  // implementation sums on the host, so every rank's result is bit for bit the same).
  virtual void all_reduce(TensorView inout) = 0;
  // out = the ranks' `in` stacked along dimension 0 in rank order: out.rows(r * n, n) is rank r's in (n rows).
  virtual void all_gather(ConstTensorView in, TensorView out) = 0;
  // out = rows [rank * n, (rank + 1) * n) of the sum over ranks of `in` (in has size() * n rows).
  virtual void reduce_scatter(ConstTensorView in, TensorView out) = 0;
  // `in` holds the rows this rank sends, grouped by destination in rank order (send_rows[p] rows for rank p, so rank
  // p's start at row_offsets(send_rows)[p]); `out` receives the rows sent to this rank, grouped by source in rank
  // order (recv_rows[p] rows from rank p). The counts are known on the host and agree between each pair of ranks.
  virtual void all_to_all(ConstTensorView in, std::span<const int64_t> send_rows, TensorView out,
                          std::span<const int64_t> recv_rows) = 0;

  // Host collectives. `words` of rank `root` are copied to every rank (resized there).
  virtual void broadcast(std::vector<int32_t>& words, int32_t root) = 0;
  // values[i] = reduce over ranks of values[i].
  virtual void all_reduce_host(std::span<int64_t> values, HostReduce op) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Marks this rank failed with `reason`: every other rank's current or next collective throws CollectiveError
  // naming this rank and the reason. Used when a rank's step throws, so that the others stop waiting for it.
  virtual void abort(const std::string& reason) = 0;
};

// Row offsets from row counts: offsets[p] = rows[0] + ... + rows[p - 1].
std::vector<int64_t> row_offsets(std::span<const int64_t> rows);

}  // namespace deepinfer
