// Bookkeeping of the paged latent cache: which pages are free, and how many holders each used page has.
// Page ids and reference counts only; the device memory behind a page is the backend's page pool.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace deepinfer {

class CacheManager {
 public:
  // Throws InvalidArgument unless num_pages > 0 and page_size > 0.
  CacheManager(int32_t num_pages, int32_t page_size);

  // n fresh pages with reference count 1, or std::nullopt (and no change) when fewer than n are free.
  // Deterministic: pages come from a LIFO free list that starts as 0, 1, 2, ...
  std::optional<std::vector<int32_t>> allocate(int32_t n);

  // Drops one reference from each page; a page whose count reaches 0 is free again. A page may appear
  // several times (one reference each). Throws, changing nothing, on an out-of-range id or on dropping
  // more references than a page has.
  void free(std::span<const int32_t> page_ids);

  // Adds a reference to a used page (a prefix shared by several requests). Throws on a free or bad page.
  void share(int32_t page_id);

  int32_t num_pages() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t page_size() const { return page_size_; }
  int32_t num_free_pages() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_used_pages() const { return num_pages() - num_free_pages(); }
  int32_t ref_count(int32_t page_id) const;

  // Pages needed to hold num_tokens tokens: ceil(num_tokens / page_size).
  int32_t pages_for_tokens(int64_t num_tokens) const;

  // Fraction of pages in use, in [0, 1].
  double usage() const;

  // Every page is either free (count 0, exactly once in the free list) or used (count > 0). Throws if not.
  void check_invariants() const;

 private:
  void check_page_id(int32_t page_id) const;

  int32_t page_size_;
  std::vector<int32_t> ref_counts_;  // [num_pages]
  std::vector<int32_t> free_list_;   // a stack: the back is allocated next
};

}  // namespace deepinfer
