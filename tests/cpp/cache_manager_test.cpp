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
