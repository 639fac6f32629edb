#include "plugin/store/extent_allocator.h"

#include <map>
#include <random>

#include "tests/catch.h"

using ftrun::ExtentAllocator;

TEST_CASE("extents are aligned, disjoint and bounded by the capacity", "[allocator]") {
  ExtentAllocator a(4096, 1 << 20);
  auto x = a.Allocate(1);
  auto y = a.Allocate(5000);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x % 4096 == 0);
  CHECK(*y % 4096 == 0);
  CHECK((*y >= *x + 4096 || *x >= *y + 8192));
  CHECK(a.used() == 4096 + 8192);
  CHECK_FALSE(a.Allocate(1 << 20));  // more than is free
}

TEST_CASE("freeing coalesces neighbours back into one extent", "[allocator]") {
  ExtentAllocator a(0, 64 * 4096);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 64; ++i) offs.push_back(*a.Allocate(4096));
  CHECK_FALSE(a.Allocate(1));
  // Free in an interleaved order; the whole range must come back as one.
  for (int i = 0; i < 64; i += 2) a.Free(offs[static_cast<size_t>(i)], 4096);
  for (int i = 1; i < 64; i += 2) a.Free(offs[static_cast<size_t>(i)], 4096);
  CHECK(a.used() == 0);
  CHECK(a.largest_free() == 64 * 4096);
  CHECK(a.Allocate(64 * 4096));
}

TEST_CASE("random allocate/free never overlaps and accounts exactly", "[allocator]") {
  const uint64_t cap = 256 * 4096;
  ExtentAllocator a(8192, cap);
  std::mt19937 rng(1);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded len
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2) {
      uint64_t len = 1 + rng() % (8 * 4096);
      auto off = a.Allocate(len);
      if (!off) continue;
      uint64_t r = *ExtentAllocator::Rounded(len);
      CHECK(*off >= 8192);
      CHECK(*off + r <= 8192 + cap);
      auto next = live.lower_bound(*off);
      if (next != live.end()) CHECK(*off + r <= next->first);
      if (next != live.begin()) CHECK(std::prev(next)->first + std::prev(next)->second <= *off);
      live[*off] = r;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first, it->second);
      live.erase(it);
    }
    uint64_t used = 0;
    for (auto& [o, l] : live) used += l;
    REQUIRE(a.used() == used);
  }
}
