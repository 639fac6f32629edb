// StripeLayout's promises: balance, and one fragment per member per stripe
// (a group rebuilt from its survivors: group_code_test.cc).
#include "plugin/erasure/stripe_layout.h"

#include <map>
#include <set>

#include "tests/catch.h"

namespace ftrun {

TEST_CASE("stripe layout: each member gives every slice once, holds `parity` parity slices, one fragment per stripe",
          "[erasure]") {
  for (auto [d, p] : {std::pair{1, 1}, {2, 1}, {4, 2}, {6, 3}, {10, 4}}) {
    const int n = d + p;
    auto stripes = StripeLayout(d, p);
    REQUIRE(static_cast<int>(stripes.size()) == n);
    std::map<int, std::set<int>> slices;
    std::map<int, int> parity;
    for (const Stripe& s : stripes) {
      REQUIRE(static_cast<int>(s.data.size()) == d);
      REQUIRE(static_cast<int>(s.parity.size()) == p);
      std::set<int> members;
      for (int f = 0; f < n; ++f) members.insert(s.MemberOf(f));
      REQUIRE(static_cast<int>(members.size()) == n);
      for (const StripeFragment& f : s.data) REQUIRE(slices[f.member].insert(f.slice).second);
      for (int m : s.parity) parity[m]++;
    }
    for (int m = 0; m < n; ++m) {
      CHECK(static_cast<int>(slices[m].size()) == d);
      CHECK(parity[m] == p);  // parity held: p slices of shard/d each
    }
  }
}

}  // namespace ftrun
