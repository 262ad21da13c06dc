// Device memory for the tensors allocated while a CUDA graph is recorded. A recorded graph keeps the addresses it
// was given, so they must not come from the stream-ordered pool (whose blocks move on to other tensors): they come
// from this arena instead, which only the backend's graphs use. Graphs replay one at a time on one stream, so every
// graph's temporaries may start at the same offset; a tensor that outlives its capture stays reserved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/runtime/device_buffer.h"
#include "core/error.h"

namespace deepinfer::cuda {

// Thrown by GraphArena::allocate when a block does not fit; peak() is the arena size that allocation needed.
class GraphArenaFull : public Error {
 public:
  GraphArenaFull(const std::string& what, size_t peak) : Error(what), peak_(peak) {}
  size_t peak() const { return peak_; }

 private:
  size_t peak_;
};

class GraphArena {
 public:
  static constexpr size_t kAlignment = 256;

  explicit GraphArena(cudaStream_t stream) : stream_(stream) {}
  GraphArena(const GraphArena&) = delete;
  GraphArena& operator=(const GraphArena&) = delete;

  // Makes room for `bytes` more above the blocks still alive. Returns true when that took new memory: every address
  // handed out before is then void (graphs that recorded them must not replay), and every block is forgotten. The
  // old memory is kept until the arena dies, so tensors still pointing there are harmless until they go.
  bool reserve(size_t bytes);

  // The lowest offset above every live block: blocks freed in reverse order of allocation (scoped tensors of a
  // forward pass) are reused at once; a block freed below a live one is reused only once those above it go. Throws
  // GraphArenaFull when the arena is full.
  void* allocate(size_t bytes);
  // Buffer deleter (context: the arena). Pointers of memory replaced by reserve() are ignored.
  static void release(void* data, void* arena);

  size_t used() const { return top_; }
  size_t capacity() const { return current_ == nullptr ? 0 : current_->bytes(); }

 private:
  cudaStream_t stream_;
  std::vector<DeviceBuffer> buffers_;   // the current one last
  DeviceBuffer* current_ = nullptr;
  std::map<size_t, size_t> live_;       // offset -> aligned bytes
  size_t top_ = 0;                      // end of the highest live block
};

}  // namespace deepinfer::cuda
