#include "backend/cuda/parallel/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "core/error.h"

namespace deepinfer::cuda {
namespace {

constexpr const char* kLibraryVariable = "DEEPINFER_NCCL_LIBRARY";
constexpr const char* kSystemName = "libnccl.so.2";

std::string version_text(int version) {
  return str_cat(version / 10000, ".", version / 100 % 100, ".", version % 100);
}

// Resolves `name` into `fn`; on a missing symbol returns false and says which.
template <typename Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr) {
    missing = name;
    return false;
  }
  return true;
}

// The library at `path` with every entry point, or why not (in `why`).
std::optional<NcclLibrary> try_load(const std::string& path, std::string& why) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    why = error != nullptr ? error : "dlopen failed";
    return std::nullopt;
  }
  NcclLibrary lib;
  lib.path = path;
  std::string missing;
  const bool complete = resolve(handle, "ncclGetVersion", lib.get_version, missing) &&
                        resolve(handle, "ncclGetErrorString", lib.get_error_string, missing) &&
                        resolve(handle, "ncclGetUniqueId", lib.get_unique_id, missing) &&
                        resolve(handle, "ncclCommInitRank", lib.comm_init_rank, missing) &&
                        resolve(handle, "ncclCommInitRankConfig", lib.comm_init_rank_config, missing) &&
                        resolve(handle, "ncclCommDestroy", lib.comm_destroy, missing) &&
                        resolve(handle, "ncclCommAbort", lib.comm_abort, missing) &&
                        resolve(handle, "ncclCommGetAsyncError", lib.comm_get_async_error, missing) &&
                        resolve(handle, "ncclAllReduce", lib.all_reduce, missing) &&
                        resolve(handle, "ncclAllGather", lib.all_gather, missing) &&
                        resolve(handle, "ncclReduceScatter", lib.reduce_scatter, missing) &&
                        resolve(handle, "ncclBroadcast", lib.broadcast, missing) &&
                        resolve(handle, "ncclSend", lib.send, missing) &&
                        resolve(handle, "ncclRecv", lib.recv, missing) &&
                        resolve(handle, "ncclGroupStart", lib.group_start, missing) &&
                        resolve(handle, "ncclGroupEnd", lib.group_end, missing);
  if (!complete) {
    why = str_cat("it has no ", missing, " (NCCL ", version_text(kMinNcclVersion), " or newer is needed)");
    dlclose(handle);
    return std::nullopt;
  }
  if (lib.get_version(&lib.version) != NcclResult::kSuccess || lib.version < kMinNcclVersion) {
    why = str_cat("it is NCCL ", version_text(lib.version), "; ", version_text(kMinNcclVersion), " or newer is needed");
    dlclose(handle);
    return std::nullopt;
  }
  return lib;  // the handle stays open for the life of the process (see the header)
}

}  // namespace

std::string NcclLibrary::describe(NcclResult result) const {
  const char* text = get_error_string != nullptr ? get_error_string(result) : nullptr;
  return str_cat(text != nullptr ? text : "unknown NCCL status", " (ncclResult_t ", static_cast<int>(result), ")");
}

std::vector<std::string> nccl_library_candidates() {
  if (const char* path = std::getenv(kLibraryVariable); path != nullptr && path[0] != '\0') return {path};
  return {kSystemName};
}

NcclLibrary load_nccl_library(std::span<const std::string> candidates) {
  std::string tried;
  for (const std::string& path : candidates) {
    std::string why;
    if (std::optional<NcclLibrary> lib = try_load(path, why)) return *std::move(lib);
    tried += str_cat("\n  ", path, ": ", why);
  }
  throw Error(str_cat("NCCL could not be loaded; tried:", tried, "\nInstall it with `pip install nvidia-nccl-cu13` ",
                      "(the deepinfer Python package then finds it), or set ", kLibraryVariable,
                      " to the path of libnccl.so.2, or add its directory to LD_LIBRARY_PATH"));
}

const NcclLibrary& nccl_library() {
  // Loaded under the lock and kept once loaded; a failure leaves nothing kept, so a later call tries again (after
  // the environment was fixed).
  static std::mutex mutex;
  static std::optional<NcclLibrary> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) {
    const std::vector<std::string> candidates = nccl_library_candidates();
    loaded = load_nccl_library(candidates);
  }
  return *loaded;
}

std::vector<int32_t> unique_id_to_words(const NcclUniqueId& id) {
  static_assert(kNcclUniqueIdBytes % sizeof(int32_t) == 0);
  std::vector<int32_t> words(kNcclUniqueIdBytes / sizeof(int32_t));
  std::memcpy(words.data(), id.internal, kNcclUniqueIdBytes);
  return words;
}

NcclUniqueId unique_id_from_words(std::span<const int32_t> words) {
  DI_CHECK(words.size() * sizeof(int32_t) == kNcclUniqueIdBytes, "an NCCL unique id is ",
           kNcclUniqueIdBytes / sizeof(int32_t), " int32 words, not ", words.size());
  NcclUniqueId id;
  std::memcpy(id.internal, words.data(), kNcclUniqueIdBytes);
  return id;
}

}  // namespace deepinfer::cuda
