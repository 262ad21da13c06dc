#include "engine/cache_manager.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

TEST(CacheManager, RejectsBadSizes) {
  EXPECT_THROW(CacheManager(0, 16), InvalidArgument);
  EXPECT_THROW(CacheManager(8, 0), InvalidArgument);
  EXPECT_THROW(CacheManager(-1, 16), InvalidArgument);
}

TEST(CacheManager, PagesForTokensRoundsUp) {
  CacheManager cache(4, 16);
  EXPECT_EQ(cache.pages_for_tokens(0), 0);
  EXPECT_EQ(cache.pages_for_tokens(1), 1);
  EXPECT_EQ(cache.pages_for_tokens(16), 1);
  EXPECT_EQ(cache.pages_for_tokens(17), 2);
  EXPECT_EQ(cache.pages_for_tokens(64), 4);
  EXPECT_THROW(cache.pages_for_tokens(-1), Error);
}

TEST(CacheManager, AllocatesDeterministicallyAndFrees) {
  CacheManager cache(6, 4);
  cache.check_invariants();
  EXPECT_EQ(cache.num_pages(), 6);
  EXPECT_EQ(cache.page_size(), 4);
  EXPECT_EQ(cache.num_free_pages(), 6);
  EXPECT_DOUBLE_EQ(cache.usage(), 0.0);

  auto a = cache.allocate(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1}));
  cache.check_invariants();
  auto b = cache.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<int32_t>{2, 3, 4}));
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 1);
  EXPECT_DOUBLE_EQ(cache.usage(), 5.0 / 6.0);
  for (int32_t p : *a) EXPECT_EQ(cache.ref_count(p), 1);
  EXPECT_EQ(cache.ref_count(5), 0);

  cache.free(*a);
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 3);
  EXPECT_EQ(cache.ref_count(0), 0);
  // Freed pages are reused first (LIFO), the order is fixed.
  auto c = cache.allocate(3);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, (std::vector<int32_t>{1, 0, 5}));
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 0);
  EXPECT_DOUBLE_EQ(cache.usage(), 1.0);

  auto empty = cache.allocate(0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
  cache.free(*b);
  cache.free(*c);
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 6);
}

TEST(CacheManager, AllocationIsAllOrNothing) {
  CacheManager cache(5, 2);
  auto a = cache.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(cache.allocate(3).has_value());
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 2);  // the failed call took nothing
  EXPECT_FALSE(cache.allocate(100).has_value());
  auto b = cache.allocate(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(cache.allocate(1).has_value());
  EXPECT_THROW(cache.allocate(-1), Error);
  cache.check_invariants();
}

TEST(CacheManager, SharedPagesNeedEveryReferenceFreed) {
  CacheManager cache(3, 8);
  auto a = cache.allocate(2);
  ASSERT_TRUE(a.has_value());
  cache.share((*a)[0]);
  cache.share((*a)[0]);
  cache.check_invariants();
  EXPECT_EQ(cache.ref_count((*a)[0]), 3);
  EXPECT_EQ(cache.ref_count((*a)[1]), 1);

  cache.free(*a);
  cache.check_invariants();
  EXPECT_EQ(cache.ref_count((*a)[0]), 2);
  EXPECT_EQ(cache.ref_count((*a)[1]), 0);
  EXPECT_EQ(cache.num_free_pages(), 2);

  // One call may drop several references of the same page.
  const std::vector<int32_t> twice{(*a)[0], (*a)[0]};
  cache.free(twice);
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 3);
}

TEST(CacheManager, BadFreesThrowAndChangeNothing) {
  CacheManager cache(4, 4);
  auto a = cache.allocate(2);
  ASSERT_TRUE(a.has_value());

  const std::vector<int32_t> free_page{3};
  try {
    cache.free(free_page);
    FAIL() << "freeing a free page must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page 3"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> out_of_range{0, 4};
  try {
    cache.free(out_of_range);
    FAIL() << "freeing page 4 of 4 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page 4"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> negative{-1};
  EXPECT_THROW(cache.free(negative), Error);
  // Page 0 twice but it has one reference: rejected as a whole, page 1 untouched.
  const std::vector<int32_t> double_free{1, 0, 0};
  EXPECT_THROW(cache.free(double_free), Error);
  cache.check_invariants();
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(cache.ref_count(1), 1);
  EXPECT_EQ(cache.num_free_pages(), 2);

  cache.free(*a);
  EXPECT_THROW(cache.free(*a), Error);  // double free
  cache.check_invariants();
  EXPECT_EQ(cache.num_free_pages(), 4);

  EXPECT_THROW(cache.share(0), Error);   // free page
  EXPECT_THROW(cache.share(9), Error);   // out of range
  EXPECT_THROW(cache.ref_count(-2), Error);
  cache.check_invariants();
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

std::vector<int32_t> page_tokens(int32_t first, int32_t page_size) {
  std::vector<int32_t> t(static_cast<size_t>(page_size));
  for (int32_t i = 0; i < page_size; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// Registers `pages` as the consecutive full pages of `tokens`.
void register_chain(CacheManager& c, std::span<const int32_t> pages, std::span<const int32_t> tokens) {
  uint64_t parent = CacheManager::kNoParent;
  for (size_t p = 0; p < pages.size(); ++p) {
    const auto page = tokens.subspan(p * static_cast<size_t>(c.page_size()), static_cast<size_t>(c.page_size()));
    const uint64_t key = CacheManager::page_key(parent, page);
    c.register_page(pages[p], key, parent, page);
    parent = key;
  }
}

TEST(PrefixCache, ReleasedPagesStayCachedUntilEvictedLeastRecentFirst) {
  CacheManager c(4, 2, /*prefix_caching=*/true);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> a = *c.allocate(3);
  register_chain(c, a, tokens);
  EXPECT_EQ(c.num_cached_pages(), 3);
  c.free(std::vector<int32_t>{a[2]});  // released first: evicted first
  c.free(std::vector<int32_t>{a[0], a[1]});
  EXPECT_EQ(c.num_free_pages(), 4);  // cached pages nobody holds count as free
  c.check_invariants();

  CacheManager::Match m = c.match(tokens, 3);
  EXPECT_EQ(m.page_ids, a);
  EXPECT_EQ(c.ref_count(a[0]), 1);
  c.free(m.page_ids);
  // At most max_pages, and only whole pages of a matching chain.
  EXPECT_EQ(c.match(tokens, 2).page_ids.size(), 2u);
  c.free(std::vector<int32_t>{a[0], a[1]});
  EXPECT_TRUE(c.match(std::vector<int32_t>{1, 2, 9, 9}, 2).page_ids == std::vector<int32_t>{a[0]});
  c.free(std::vector<int32_t>{a[0]});
  EXPECT_TRUE(c.match(std::vector<int32_t>{2, 1}, 1).page_ids.empty());

  // The free page first, then the cached ones in the order they were last released (a[2], then a[0], a[1]'s order
  // after the matches above: a[1] was released before a[0]).
  const std::vector<int32_t> b = *c.allocate(2);
  EXPECT_EQ(c.num_cached_pages(), 2);
  EXPECT_EQ(b[1], a[2]);
  EXPECT_TRUE(c.match(tokens, 3).page_ids.size() == 2u);  // the first two pages are still cached
  c.check_invariants();
}

TEST(PrefixCache, CountingTheCachedPrefixTakesNoReference) {
  CacheManager c(4, 2, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> a = *c.allocate(2);
  register_chain(c, a, tokens);
  c.free(a);  // cached, held by nobody: evictable
  EXPECT_EQ(c.num_cached_prefix_pages(tokens), 2);
  EXPECT_EQ(c.num_cached_prefix_pages(std::vector<int32_t>{1, 2, 9, 9}), 1);
  EXPECT_EQ(c.num_cached_prefix_pages(std::vector<int32_t>{9}), 0);
  EXPECT_EQ(c.ref_count(a[0]), 0);
  EXPECT_EQ(c.num_free_pages(), 4);  // still evictable: nothing was taken
  c.check_invariants();
  CacheManager off(4, 2, /*prefix_caching=*/false);
  EXPECT_EQ(off.num_cached_prefix_pages(tokens), 0);
}

TEST(PrefixCache, ChainsFromAnotherRootNeverMeet) {
  // Pages of a request that skipped the MTP layer are keyed from kWithoutMtpRoot: the same tokens are two entries,
  // and a lookup from one root never returns the other's pages.
  CacheManager c(4, 2, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<int32_t> without = *c.allocate(2);
  uint64_t parent = CacheManager::kWithoutMtpRoot;
  for (size_t p = 0; p < 2; ++p) {
    const auto page = std::span(tokens).subspan(2 * p, 2);
    const uint64_t key = CacheManager::page_key(parent, page);
    c.register_page(without[p], key, parent, page);
    parent = key;
  }
  c.free(without);
  EXPECT_EQ(c.num_cached_prefix_pages(tokens), 0);
  EXPECT_TRUE(c.match(tokens, 2).page_ids.empty());
  EXPECT_EQ(c.num_cached_prefix_pages(tokens, CacheManager::kWithoutMtpRoot), 2);
  const std::vector<int32_t> with = *c.allocate(2);  // the free pages, not the cached ones
  register_chain(c, with, tokens);
  EXPECT_EQ(c.num_cached_pages(), 4);
  c.free(with);
  EXPECT_EQ(c.match(tokens, 2).page_ids, with);
  EXPECT_EQ(c.match(tokens, 2, CacheManager::kWithoutMtpRoot).page_ids, without);
  c.check_invariants();
}

TEST(PrefixCache, AKeyRegisteredTwiceKeepsTheFirstPage) {
  CacheManager c(4, 2, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = page_tokens(7, 2);
  const std::vector<int32_t> pages = *c.allocate(2);
  const uint64_t key = CacheManager::page_key(CacheManager::kNoParent, tokens);
  c.register_page(pages[0], key, CacheManager::kNoParent, tokens);
  c.register_page(pages[1], key, CacheManager::kNoParent, tokens);  // the same content computed twice
  EXPECT_EQ(c.num_cached_pages(), 1);
  c.free(pages);
  EXPECT_EQ(c.match(tokens, 1).page_ids, std::vector<int32_t>{pages[0]});
  c.check_invariants();
  EXPECT_THROW(c.register_page(pages[1], key + 1, CacheManager::kNoParent, tokens), Error);  // free page
}

TEST(PrefixCache, OffMeansNothingIsCached) {
  CacheManager c(2, 2);
  const std::vector<int32_t> tokens = page_tokens(1, 2);
  const std::vector<int32_t> pages = *c.allocate(1);
  c.register_page(pages[0], CacheManager::page_key(CacheManager::kNoParent, tokens), CacheManager::kNoParent, tokens);
  c.free(pages);
  EXPECT_TRUE(c.match(tokens, 1).page_ids.empty());
  EXPECT_EQ(c.num_cached_pages(), 0);
  c.check_invariants();
}

}  // namespace
}  // namespace deepinfer
