#include "engine/cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

CacheManager::CacheManager(int32_t num_pages, int32_t page_size) : page_size_(page_size) {
  DI_CHECK_ARG(num_pages > 0, "CacheManager: num_pages must be > 0, got ", num_pages);
  DI_CHECK_ARG(page_size > 0, "CacheManager: page_size must be > 0, got ", page_size);
  ref_counts_.assign(static_cast<size_t>(num_pages), 0);
  free_list_.reserve(static_cast<size_t>(num_pages));
  for (int32_t page_id = num_pages - 1; page_id >= 0; --page_id) free_list_.push_back(page_id);
}

std::optional<std::vector<int32_t>> CacheManager::allocate(int32_t n) {
  DI_CHECK(n >= 0, "cannot allocate a negative number of pages: ", n);
  if (n > num_free_pages()) return std::nullopt;
  std::vector<int32_t> page_ids(static_cast<size_t>(n));
  for (int32_t& page_id : page_ids) {
    page_id = free_list_.back();
    free_list_.pop_back();
    ref_counts_[static_cast<size_t>(page_id)] = 1;
  }
  return page_ids;
}

void CacheManager::free(std::span<const int32_t> page_ids) {
  // Validate everything first so that a bad call changes nothing.
  std::vector<int32_t> sorted(page_ids.begin(), page_ids.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    const int32_t page_id = sorted[i];
    check_page_id(page_id);
    size_t end = i;
    while (end < sorted.size() && sorted[end] == page_id) ++end;
    const int32_t count = ref_counts_[static_cast<size_t>(page_id)];
    DI_CHECK(count > 0, "freeing page ", page_id, ", which is already free");
    DI_CHECK(static_cast<size_t>(count) >= end - i, "freeing page ", page_id, " ", end - i,
             " times, but it has only ", count, " reference(s)");
    i = end;
  }
  for (int32_t page_id : page_ids) {
    if (--ref_counts_[static_cast<size_t>(page_id)] == 0) free_list_.push_back(page_id);
  }
}

void CacheManager::share(int32_t page_id) {
  check_page_id(page_id);
  DI_CHECK(ref_counts_[static_cast<size_t>(page_id)] > 0, "cannot share page ", page_id, ": it is free");
  ++ref_counts_[static_cast<size_t>(page_id)];
}

int32_t CacheManager::ref_count(int32_t page_id) const {
  check_page_id(page_id);
  return ref_counts_[static_cast<size_t>(page_id)];
}

int32_t CacheManager::pages_for_tokens(int64_t num_tokens) const {
  DI_CHECK(num_tokens >= 0, "pages_for_tokens: negative token count ", num_tokens);
  const int64_t pages = (num_tokens + page_size_ - 1) / page_size_;
  DI_CHECK(pages <= INT32_MAX, "pages_for_tokens: ", num_tokens, " tokens need too many pages");
  return static_cast<int32_t>(pages);
}

double CacheManager::usage() const {
  return static_cast<double>(num_used_pages()) / static_cast<double>(num_pages());
}

void CacheManager::check_invariants() const {
  std::vector<bool> in_free_list(ref_counts_.size(), false);
  for (int32_t page_id : free_list_) {
    check_page_id(page_id);
    DI_CHECK(!in_free_list[static_cast<size_t>(page_id)], "page ", page_id, " is in the free list twice");
    in_free_list[static_cast<size_t>(page_id)] = true;
    DI_CHECK(ref_counts_[static_cast<size_t>(page_id)] == 0, "free page ", page_id, " has reference count ",
             ref_counts_[static_cast<size_t>(page_id)]);
  }
  for (int32_t page_id = 0; page_id < num_pages(); ++page_id) {
    const int32_t count = ref_counts_[static_cast<size_t>(page_id)];
    DI_CHECK(count >= 0, "page ", page_id, " has negative reference count ", count);
    DI_CHECK(count > 0 || in_free_list[static_cast<size_t>(page_id)], "page ", page_id,
             " has reference count 0 but is not in the free list (leaked)");
  }
}

void CacheManager::check_page_id(int32_t page_id) const {
  DI_CHECK(page_id >= 0 && page_id < num_pages(), "page ", page_id, " out of range [0, ", num_pages(), ")");
}

}  // namespace deepinfer
