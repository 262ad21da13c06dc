// Bookkeeping of the paged latent cache: which pages are free, and how many holders each used page has.
// Page ids and reference counts only; the device memory behind a page is the backend's page pool.
//
// Prefix caching: a full page whose latents are computed may be registered under its key, a hash chained over the
// tokens of every page up to it (as vLLM keys its blocks: a lookup is one hash probe per page, and only whole pages are
// shared, so a radix tree's token-level matches would buy nothing here). A registered page whose last reference is
// dropped stays cached, evictable, instead of becoming free; allocate() evicts the least recently released one when
// the free list runs dry. match() finds the longest run of registered pages that starts a token sequence and takes a
// reference on each. A registered page keeps its tokens and its parent's key, so a hash collision is a miss, never a
// wrong hit.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer {

class CacheManager {
 public:
  // Throws InvalidArgument unless num_pages > 0 and page_size > 0.
  CacheManager(int32_t num_pages, int32_t page_size, bool prefix_caching = false);

  // n fresh pages with reference count 1, or std::nullopt (and no change) when fewer than n are free.
  // Deterministic: pages come from a LIFO free list that starts as 0, 1, 2, ...
  std::optional<std::vector<int32_t>> allocate(int32_t n);

  // Drops one reference from each page; a page whose count reaches 0 is free again. A page may appear
  // several times (one reference each). Throws, changing nothing, on an out-of-range id or on dropping
  // more references than a page has.
  void free(std::span<const int32_t> page_ids);

  // Adds a reference to a used page (a prefix shared by several requests). Throws on a free or bad page.
  void share(int32_t page_id);

  // The key of a full page of `tokens` (page_size of them) after the page keyed `parent` (the root: the first page).
  static constexpr uint64_t kNoParent = 0;
  static uint64_t page_key(uint64_t parent, std::span<const int32_t> tokens);
  // The first page's parent of a request whose cached pages lack the MTP layer's latents (one that does not
  // speculate): its chains of keys never meet those of requests whose MTP latents are computed, so a speculating
  // request never reads MTP latents that were not written. Every other request's chains start at kNoParent.
  static constexpr uint64_t kWithoutMtpRoot = 0x6d74702d6f6666ull;  // any constant that page_key never returns twice

  bool prefix_caching() const { return prefix_caching_; }
  // Registers used page `page_id`, whose latents hold `tokens` (a full page) after the page keyed `parent`, under
  // `key`. Does nothing when prefix caching is off or another page holds that key already. Throws on a free or bad
  // page, a page registered already, or tokens that are not one page.
  void register_page(int32_t page_id, uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  // The longest run of registered pages holding tokens [0, page_size k) of `tokens`, at most max_pages of them, each with
  // a reference taken (an evictable page is in use again), and their keys. Empty when prefix caching is off.
  struct Match {
    std::vector<int32_t> page_ids;
    std::vector<uint64_t> keys;
  };
  // `root` is the first page's parent (kNoParent, or kWithoutMtpRoot).
  Match match(std::span<const int32_t> tokens, int32_t max_pages, uint64_t root = kNoParent);
  // How many pages of `tokens`' prefix match would find now, taking no reference: where a new request would find the
  // most of its prompt cached (data-parallel lanes choose by it).
  int32_t num_cached_prefix_pages(std::span<const int32_t> tokens, uint64_t root = kNoParent) const;

  int32_t num_pages() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t page_size() const { return page_size_; }
  // Pages allocate() can hand out: free ones and cached ones nobody holds (evicted on the way).
  int32_t num_free_pages() const { return static_cast<int32_t>(free_list_.size() + evictable_.size()); }
  int32_t num_cached_pages() const { return static_cast<int32_t>(by_key_.size()); }
  int32_t num_used_pages() const { return num_pages() - num_free_pages(); }
  int32_t ref_count(int32_t page_id) const;

  // Pages needed to hold num_tokens tokens: ceil(num_tokens / page_size).
  int32_t pages_for_tokens(int64_t num_tokens) const;

  // Fraction of pages in use, in [0, 1].
  double usage() const;

  // Every page is free (count 0, unregistered, exactly once in the free list), evictable (count 0, registered,
  // once in the eviction order) or used (count > 0); every key maps to the page registered under it. Throws if not.
  void check_invariants() const;

 private:
  struct CachedPage {
    uint64_t key = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator in_evictable;  // valid while the page is evictable
  };

  void check_page_id(int32_t page_id) const;
  Match find(std::span<const int32_t> tokens, int32_t max_pages, uint64_t root) const;  // match's walk, no reference
  // Takes page_id (free or evictable) for a new holder: unregistered when it was evictable.
  void evict(int32_t page_id);

  int32_t page_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_counts_;  // [num_pages]
  std::vector<int32_t> free_list_;   // a stack: the back is allocated next
  std::vector<std::optional<CachedPage>> cached_;   // [num_pages]: set while registered
  std::unordered_map<uint64_t, int32_t> by_key_;    // key -> registered page
  std::list<int32_t> evictable_;                    // registered pages nobody holds, least recently released first
};

}  // namespace deepinfer
