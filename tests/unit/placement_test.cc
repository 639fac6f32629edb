#include "recovery/placement.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

namespace ftrun {

TEST_CASE("placement: every slot has k holders, never itself, and holds k others") {
  for (int n : {2, 3, 4, 7, 16}) {
    for (int k = 1; k < n && k <= 3; ++k) {
      auto h = PlaceReplicas(std::vector<std::string>(static_cast<size_t>(n)), k);
      std::map<int, int> load;
      for (int i = 0; i < n; ++i) {
        REQUIRE(h[static_cast<size_t>(i)].size() == static_cast<size_t>(k));
        std::set<int> distinct(h[static_cast<size_t>(i)].begin(), h[static_cast<size_t>(i)].end());
        REQUIRE(distinct.size() == static_cast<size_t>(k));
        REQUIRE(!distinct.count(i));
        for (int x : h[static_cast<size_t>(i)]) load[x]++;
      }
      for (int i = 0; i < n; ++i) REQUIRE(load[i] == k);
    }
  }
}

TEST_CASE("placement: holders sit in other racks when racks are given") {
  // Two racks of three, listed rack by rack: a naive ring would keep copies
  // in the same rack.
  std::vector<std::string> racks = {"r1", "r1", "r1", "r2", "r2", "r2"};
  auto h = PlaceReplicas(racks, 1);
  for (size_t i = 0; i < racks.size(); ++i) REQUIRE(racks[static_cast<size_t>(h[i][0])] != racks[i]);
  // Three racks, k = 2: both copies outside the slot's rack.
  racks = {"a", "a", "b", "b", "c", "c"};
  h = PlaceReplicas(racks, 2);
  for (size_t i = 0; i < racks.size(); ++i) {
    for (int x : h[i]) REQUIRE(racks[static_cast<size_t>(x)] != racks[i]);
  }
}

}  // namespace ftrun
