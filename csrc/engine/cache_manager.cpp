#include "engine/cache_manager.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer {

CacheManager::CacheManager(int32_t num_pages, int32_t page_size, bool prefix_caching)
    : page_size_(page_size), prefix_caching_(prefix_caching) {
  DI_CHECK_ARG(num_pages > 0, "CacheManager: num_pages must be > 0, got ", num_pages);
  DI_CHECK_ARG(page_size > 0, "CacheManager: page_size must be > 0, got ", page_size);
  ref_counts_.assign(static_cast<size_t>(num_pages), 0);
  cached_.resize(static_cast<size_t>(num_pages));
  free_list_.reserve(static_cast<size_t>(num_pages));
  for (int32_t page_id = num_pages - 1; page_id >= 0; --page_id) free_list_.push_back(page_id);
}

std::optional<std::vector<int32_t>> CacheManager::allocate(int32_t n) {
  DI_CHECK(n >= 0, "cannot allocate a negative number of pages: ", n);
  if (n > num_free_pages()) return std::nullopt;
  std::vector<int32_t> page_ids(static_cast<size_t>(n));
  for (int32_t& page_id : page_ids) {
    if (!free_list_.empty()) {
      page_id = free_list_.back();
      free_list_.pop_back();
    } else {
      page_id = evictable_.front();  // the least recently released cached page
      evict(page_id);
    }
    ref_counts_[static_cast<size_t>(page_id)] = 1;
  }
  return page_ids;
}

void CacheManager::evict(int32_t page_id) {
  std::optional<CachedPage>& c = cached_[static_cast<size_t>(page_id)];
  evictable_.erase(c->in_evictable);
  by_key_.erase(c->key);
  c.reset();
}

uint64_t CacheManager::page_key(uint64_t parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent key and the tokens, then a splitmix64 finalizer; never kNoParent.
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix_in = [&h](uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) h = (h ^ ((v >> (8 * byte)) & 0xffu)) * 0x100000001b3ull;
  };
  mix_in(parent);
  for (int32_t t : tokens) mix_in(static_cast<uint32_t>(t));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h == kNoParent ? 1 : h;
}

void CacheManager::register_page(int32_t page_id, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  check_page_id(page_id);
  DI_CHECK(ref_counts_[static_cast<size_t>(page_id)] > 0, "cannot register page ", page_id, ": it is free");
  DI_CHECK(static_cast<int32_t>(tokens.size()) == page_size_, "registering page ", page_id, " with ", tokens.size(),
           " tokens; a page holds ", page_size_);
  if (!prefix_caching_ || by_key_.contains(key)) return;
  std::optional<CachedPage>& c = cached_[static_cast<size_t>(page_id)];
  DI_CHECK(!c.has_value(), "page ", page_id, " is registered already");
  c = CachedPage{.key = key, .parent = parent, .tokens = {tokens.begin(), tokens.end()}, .in_evictable = {}};
  by_key_.emplace(key, page_id);
}

CacheManager::Match CacheManager::find(std::span<const int32_t> tokens, int32_t max_pages, uint64_t root) const {
  Match m;
  if (!prefix_caching_) return m;
  uint64_t parent = root;
  for (int32_t p = 0; p < max_pages && static_cast<size_t>(p + 1) * page_size_ <= tokens.size(); ++p) {
    const std::span<const int32_t> page = tokens.subspan(static_cast<size_t>(p) * page_size_, page_size_);
    const uint64_t key = page_key(parent, page);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    const CachedPage& c = *cached_[static_cast<size_t>(it->second)];
    if (c.parent != parent || !std::equal(page.begin(), page.end(), c.tokens.begin())) break;  // a collision
    m.page_ids.push_back(it->second);
    m.keys.push_back(key);
    parent = key;
  }
  return m;
}

int32_t CacheManager::num_cached_prefix_pages(std::span<const int32_t> tokens, uint64_t root) const {
  return static_cast<int32_t>(find(tokens, std::numeric_limits<int32_t>::max(), root).page_ids.size());
}

CacheManager::Match CacheManager::match(std::span<const int32_t> tokens, int32_t max_pages, uint64_t root) {
  Match m = find(tokens, max_pages, root);
  for (int32_t page_id : m.page_ids) {
    int32_t& count = ref_counts_[static_cast<size_t>(page_id)];
    if (count == 0) evictable_.erase(cached_[static_cast<size_t>(page_id)]->in_evictable);
    ++count;
  }
  return m;
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
    if (--ref_counts_[static_cast<size_t>(page_id)] != 0) continue;
    std::optional<CachedPage>& c = cached_[static_cast<size_t>(page_id)];
    if (c.has_value()) {
      c->in_evictable = evictable_.insert(evictable_.end(), page_id);  // the most recently released
    } else {
      free_list_.push_back(page_id);
    }
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
  std::vector<bool> evictable(ref_counts_.size(), false);
  for (int32_t page_id : evictable_) {
    check_page_id(page_id);
    DI_CHECK(!evictable[static_cast<size_t>(page_id)] && !in_free_list[static_cast<size_t>(page_id)], "page ",
             page_id, " is evictable twice, or evictable and free");
    evictable[static_cast<size_t>(page_id)] = true;
    DI_CHECK(cached_[static_cast<size_t>(page_id)].has_value() && ref_counts_[static_cast<size_t>(page_id)] == 0,
             "evictable page ", page_id, " is unregistered or held");
  }
  for (int32_t page_id = 0; page_id < num_pages(); ++page_id) {
    const auto i = static_cast<size_t>(page_id);
    const int32_t count = ref_counts_[i];
    DI_CHECK(count >= 0, "page ", page_id, " has negative reference count ", count);
    DI_CHECK(count > 0 || in_free_list[i] || evictable[i], "page ", page_id,
             " has reference count 0 but is neither free nor evictable (leaked)");
    DI_CHECK(!in_free_list[i] || !cached_[i].has_value(), "free page ", page_id, " is still registered");
    if (cached_[i].has_value()) {
      const auto it = by_key_.find(cached_[i]->key);
      DI_CHECK(it != by_key_.end() && it->second == page_id, "registered page ", page_id, " is not found by its key");
    }
  }
  DI_CHECK(by_key_.size() == static_cast<size_t>(std::count_if(cached_.begin(), cached_.end(),
                                                               [](const auto& c) { return c.has_value(); })),
           "the key index holds ", by_key_.size(), " pages, not the registered ones");
}

void CacheManager::check_page_id(int32_t page_id) const {
  DI_CHECK(page_id >= 0 && page_id < num_pages(), "page ", page_id, " out of range [0, ", num_pages(), ")");
}

}  // namespace deepinfer
