// NCCL, found at run time: the engine builds and runs without it, and loads it only when a communicator is made.
//
// Where it comes from, in order:
//   1. DEEPINFER_NCCL_LIBRARY, when set: the path of the library file. It is then the only candidate, so that an
//      explicit choice that does not load is an error rather than a silent switch to another NCCL.
//   2. "libnccl.so.2", which the dynamic loader looks up through LD_LIBRARY_PATH, the cache and the system
//      directories. The NCCL wheel (nvidia-nccl-cu13) installs it inside the Python package nvidia/nccl/lib, where the
//      loader does not look: the Python package sets DEEPINFER_NCCL_LIBRARY to it before the engine starts
//      (deepinfer/_nccl.py).
// The library stays loaded for the life of the process: communicators may be destroyed during exit, after any owner
// of the handle would be.
//
// The declarations below are this engine's own, of the part of NCCL's public C ABI it calls (checked against the
// nccl.h of the version requirements-cuda.txt pins): the values are fixed by that ABI, which NCCL keeps across
// releases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace deepinfer::cuda {

// ncclResult_t (a C enum: passed as an int).
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,  // a non-blocking communicator's call still running: poll ncclCommGetAsyncError
  kTimeout = 8,
};

// ncclDataType_t: the element types the communicator moves.
enum class NcclDataType : int {
  kUint8 = 1,
  kInt32 = 2,
  kInt64 = 4,
  kFloat32 = 7,
  kBfloat16 = 9,
};

// ncclRedOp_t: the built-in reductions.
enum class NcclRedOp : int {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
};

// ncclUniqueId: what every rank of a communicator must be given, opaque.
constexpr size_t kNcclUniqueIdBytes = 128;
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

// ncclComm_t: a pointer to NCCL's communicator, opaque here.
struct NcclCommOpaque;
using NcclCommHandle = NcclCommOpaque*;

// The head of ncclConfig_t as NCCL 2.14 laid it out (the first release with a configuration). NCCL reads a
// configuration up to its `size` and takes its defaults for the fields its `version` predates, so this short form
// sets only `blocking` and stays valid for every later release.
struct NcclConfigHead {
  size_t size = sizeof(NcclConfigHead);
  unsigned int magic = 0xcafebeef;  // NCCL's mark of an initialized configuration
  unsigned int version = 21400;     // 2.14.0, encoded as NCCL encodes versions from 2.9 on
  int blocking = 1;                 // 0: init and collectives return at once, ncclInProgress while still running
};

// The NCCL entry points the communicator calls.
struct NcclLibrary {
  std::string path;  // the candidate that loaded
  int version = 0;   // ncclGetVersion: major * 10000 + minor * 100 + patch

  NcclResult (*get_version)(int* version) = nullptr;
  const char* (*get_error_string)(NcclResult result) = nullptr;
  NcclResult (*get_unique_id)(NcclUniqueId* id) = nullptr;
  NcclResult (*comm_init_rank)(NcclCommHandle* comm, int num_ranks, NcclUniqueId id, int rank) = nullptr;
  NcclResult (*comm_init_rank_config)(NcclCommHandle* comm, int num_ranks, NcclUniqueId id, int rank,
                                      NcclConfigHead* config) = nullptr;
  NcclResult (*comm_destroy)(NcclCommHandle comm) = nullptr;
  NcclResult (*comm_abort)(NcclCommHandle comm) = nullptr;
  NcclResult (*comm_get_async_error)(NcclCommHandle comm, NcclResult* async_error) = nullptr;
  NcclResult (*all_reduce)(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                           NcclCommHandle comm, cudaStream_t stream) = nullptr;
  NcclResult (*all_gather)(const void* send, void* recv, size_t send_count, NcclDataType type, NcclCommHandle comm,
                           cudaStream_t stream) = nullptr;
  NcclResult (*reduce_scatter)(const void* send, void* recv, size_t recv_count, NcclDataType type, NcclRedOp op,
                               NcclCommHandle comm, cudaStream_t stream) = nullptr;
  NcclResult (*broadcast)(const void* send, void* recv, size_t count, NcclDataType type, int root,
                          NcclCommHandle comm, cudaStream_t stream) = nullptr;
  NcclResult (*send)(const void* send, size_t count, NcclDataType type, int peer, NcclCommHandle comm,
                     cudaStream_t stream) = nullptr;
  NcclResult (*recv)(void* recv, size_t count, NcclDataType type, int peer, NcclCommHandle comm,
                     cudaStream_t stream) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;

  // "ncclInvalidUsage: ..." style text for a status (NCCL's own string, with the status's number).
  std::string describe(NcclResult result) const;
};

// The oldest NCCL the communicator works with: the non-blocking configuration (NcclConfigHead) came in 2.14.
constexpr int kMinNcclVersion = 21400;

// The libraries tried, in order (see the file comment).
std::vector<std::string> nccl_library_candidates();

// The process's NCCL, loaded on the first call. Throws deepinfer::Error naming every candidate tried and why it did
// not load (or the entry point it lacks, or its too old version), and how to install NCCL; a later call tries again.
const NcclLibrary& nccl_library();

// Loads the first of `candidates` that opens and has every entry point, without keeping it as the process's NCCL
// (nccl_library() does that). Throws as nccl_library() does.
NcclLibrary load_nccl_library(std::span<const std::string> candidates);

// The unique id as the int32 words a host broadcast carries (kNcclUniqueIdBytes / 4 of them), and back, bit for bit.
std::vector<int32_t> unique_id_to_words(const NcclUniqueId& id);
NcclUniqueId unique_id_from_words(std::span<const int32_t> words);  // throws deepinfer::Error on a wrong count

}  // namespace deepinfer::cuda
