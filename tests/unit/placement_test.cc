#include "recovery/placement.h"

#include <map>
#include <set>

#include "plugin/config/config.h"
#include "tests/catch.h"

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

namespace ftrun {

TEST_CASE("placement: erasure groups partition the slots, each spread over the racks") {
  // Three racks of four, listed rack by rack; groups of 6 (4 + 2): every
  // group has two members in each rack, so a lost rack costs a group 2.
  std::vector<std::string> racks;
  for (const char* r : {"a", "b", "c"}) racks.insert(racks.end(), 4, r);
  auto groups = PlaceErasureGroups(racks, 6);
  REQUIRE(groups.size() == 2);
  std::set<int> all;
  for (const auto& g : groups) {
    REQUIRE(g.size() == 6);
    std::map<std::string, int> per_rack;
    for (int s : g) {
      REQUIRE(all.insert(s).second);
      per_rack[racks[static_cast<size_t>(s)]]++;
    }
    CHECK(per_rack == std::map<std::string, int>{{"a", 2}, {"b", 2}, {"c", 2}});
  }
  CHECK(all.size() == racks.size());
  CHECK(ErasureGroupError(12, 4, 2).empty());
  CHECK(ErasureGroupError(3, 2, 1).empty());
  CHECK(ErasureGroupError(8, 4, 2) ==
        "an erasure code of 4 data + 2 parity needs the nodes in groups of 6; the job has 8 nodes (2 left over: use "
        "6 or 12, or another code)");
  CHECK(ErasureGroupError(4, 4, 2) ==
        "an erasure code of 4 data + 2 parity needs the nodes in groups of 6; the job has 4 nodes (use 6, or another "
        "code)");
}

TEST_CASE("placement: without racks the ring is the slots in order, past ten too") {
  const std::vector<std::string> racks(12, "");
  std::vector<int> ring = RackRing(racks);
  std::vector<int> want(12);
  for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = i;
  CHECK(ring == want);
  CHECK(PlaceErasureGroups(racks, 6) == std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}});
}

}  // namespace ftrun
