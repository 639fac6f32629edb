// CommitRound against a real SnapshotStore: a round copies every rank that
// has its version at once and a rank behind it when it saves it; a rank
// that skipped it, or whose copy is gone, fails the round.
#include "launcher/agent/commit_round.h"

#include "tests/catch.h"
#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace {

struct Node {
  SnapshotStore store{4096, 256 * 4096, "budget"};
  std::vector<std::pair<int, uint64_t>> copied;
  std::vector<uint64_t> failed;
  CommitRound round{&store,
                    [this](int rank, uint64_t v) {
                      copied.push_back({rank, v});
                    },
                    [this](uint64_t v) { failed.push_back(v); }};

  void Save(int rank, uint64_t version) { SaveOneChunk(&store, rank, version, RankVersionContent(rank, version)); }
  // A rank saves and tells the round, as the agent does.
  void Saves(int rank, uint64_t version) {
    Save(rank, version);
    round.Saved(rank, version);
  }
};

TEST_CASE("commit round: ranks that have the version are copied at once, a rank behind it when it saves it",
          "[commit_round]") {
  Node n;
  n.Save(0, 5);
  n.Save(1, 4);
  n.round.Begin(5, {0, 1});
  CHECK(n.round.version() == std::optional<uint64_t>(5));
  CHECK(n.copied == std::vector<std::pair<int, uint64_t>>{{0, 5}});
  n.Saves(0, 6);  // a rank already past it: nothing more
  CHECK(n.copied.size() == 1);
  n.Saves(1, 5);
  CHECK(n.copied == std::vector<std::pair<int, uint64_t>>{{0, 5}, {1, 5}});
  n.Saves(1, 6);  // copied once
  CHECK(n.copied.size() == 2);
  CHECK(n.failed.empty());
}

TEST_CASE("commit round: a rank that skipped the version fails the round", "[commit_round]") {
  Node n;
  n.Save(0, 3);
  n.Save(1, 3);
  n.round.Begin(4, {0, 1});
  CHECK(n.copied.empty());
  n.Saves(0, 4);
  n.Saves(1, 5);  // rank 1 never saved 4
  CHECK(n.failed == std::vector<uint64_t>{4});
  CHECK(n.copied == std::vector<std::pair<int, uint64_t>>{{0, 4}});
}

TEST_CASE("commit round: a version released before the round fails it at once", "[commit_round]") {
  Node n;
  n.Save(0, 2);
  n.Save(0, 3);
  n.Save(1, 3);
  n.store.ReleaseBetween(std::nullopt, 3);  // version 2 is gone
  n.round.Begin(2, {0, 1});
  CHECK(n.failed == std::vector<uint64_t>{2});
  CHECK(n.copied.empty());
}

TEST_CASE("commit round: after the generation stops, saves copy nothing", "[commit_round]") {
  Node n;
  n.Save(0, 1);
  n.round.Begin(2, {0});
  n.round.End();
  CHECK_FALSE(n.round.version().has_value());
  n.Saves(0, 2);
  CHECK(n.copied.empty());
  CHECK(n.failed.empty());
}

}  // namespace
}  // namespace ftrun
