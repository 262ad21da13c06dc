#include "backend/cuda/runtime/graph_arena.h"

#include <algorithm>

namespace deepinfer::cuda {
namespace {

size_t align_up(size_t bytes) {
  return (bytes + GraphArena::kAlignment - 1) / GraphArena::kAlignment * GraphArena::kAlignment;
}

}  // namespace

bool GraphArena::reserve(size_t bytes) {
  const size_t needed = top_ + align_up(bytes);
  if (needed <= capacity()) return false;
  // Room to spare, so a slightly larger graph later does not void every graph again.
  const size_t grown = std::max(needed + needed / 4, 2 * capacity());
  buffers_.emplace_back(grown, stream_);
  current_ = &buffers_.back();
  live_.clear();
  top_ = 0;
  return true;
}

void* GraphArena::allocate(size_t bytes) {
  const size_t size = align_up(std::max<size_t>(bytes, 1));
  if (top_ + size > capacity()) {
    throw GraphArenaFull(str_cat("graph arena: ", bytes, " bytes do not fit (", top_, " of ", capacity(),
                                 " bytes in use)"),
                         top_ + size);
  }
  const size_t offset = top_;
  live_.emplace(offset, size);
  top_ += size;
  return current_->as<char>() + offset;
}

void GraphArena::release(void* data, void* context) {
  auto& arena = *static_cast<GraphArena*>(context);
  if (arena.current_ == nullptr) return;
  const auto* base = arena.current_->as<char>();
  const auto* p = static_cast<const char*>(data);
  if (p < base || p >= base + arena.capacity()) return;  // memory of a replaced buffer
  arena.live_.erase(static_cast<size_t>(p - base));
  arena.top_ = arena.live_.empty() ? 0 : arena.live_.rbegin()->first + arena.live_.rbegin()->second;
}

}  // namespace deepinfer::cuda
