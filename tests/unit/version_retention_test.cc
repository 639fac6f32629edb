// VersionRetention against a real SnapshotStore: which versions go after a
// commit, a halt, a start, a round and a save.
#include "launcher/agent/version_retention.h"

#include "tests/catch.h"
#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace {

struct Node {
  SnapshotStore store{4096, 256 * 4096, "budget"};
  CommitTracker tracker;
  VersionRetention retention{&store, &tracker};

  // Rank `rank` saves `version`: one chunk of its own.
  void Save(int rank, uint64_t version) { SaveOneChunk(&store, rank, version, RankVersionContent(rank, version)); }
  void Commit(uint64_t v) {
    tracker.Committed(v);
    retention.Committed(v);
  }
  std::vector<uint64_t> Versions() const { return store.Versions(); }
};

TEST_CASE("retention: a commit frees what is below it, except a pinned version until it is unpinned", "[retention]") {
  Node n;
  for (uint64_t v = 1; v <= 3; ++v) n.Save(0, v);
  n.store.Pin(1);  // a rank still loading version 1
  n.Commit(3);
  CHECK(n.Versions() == std::vector<uint64_t>{1, 3});
  n.store.Unpin(1);
  CHECK(n.Versions() == std::vector<uint64_t>{3});
}

TEST_CASE("retention: a halt voids what was saved above the commit; a start voids what is above its version",
          "[retention]") {
  Node n;
  for (uint64_t v = 1; v <= 4; ++v) n.Save(0, v);
  n.Commit(2);
  n.retention.Halted();
  CHECK(n.Versions() == std::vector<uint64_t>{2});
  n.Save(0, 3);
  n.retention.StartsFrom(1);  // going back to version 1 (on disk): 2 and 3 are another timeline's
  CHECK(n.Versions().empty());
  n.Save(0, 2);  // the new timeline may save version numbers again
  CHECK(n.Versions() == std::vector<uint64_t>{2});
  n.retention.RestoreFailed(2);  // what was read of version 2 goes
  CHECK(n.Versions().empty());
}

TEST_CASE("retention: while a round runs, a node keeps the commit, the round's version and its newest saves",
          "[retention]") {
  Node n;
  n.Save(0, 1);
  n.Save(1, 1);
  n.Commit(1);
  for (uint64_t v = 2; v <= 9; ++v) {
    n.Save(0, v);
    n.Save(1, v);
    n.retention.Saved(v, {0, 1}, /*round=*/3);
  }
  // 1 committed, 3 the round's, 6..9 the newest kKeepVersions: 4 and 5 can never be committed.
  CHECK(n.Versions() == std::vector<uint64_t>{1, 2, 3, 6, 7, 8, 9});
  n.retention.RoundTargets(8, {0, 1});  // every rank saved 8: nothing between the commit and it will commit
  CHECK(n.Versions() == std::vector<uint64_t>{1, 8, 9});
  // Never a rank's last save: rank 1 is behind, at 9, while rank 0 runs ahead.
  for (uint64_t v = 10; v <= 16; ++v) {
    n.Save(0, v);
    n.retention.Saved(v, {0, 1}, 8);
  }
  const auto left = n.Versions();
  CHECK(std::find(left.begin(), left.end(), 9) != left.end());
  CHECK(std::find(left.begin(), left.end(), 8) != left.end());
}

TEST_CASE("retention: a round that targets the fastest rank's save keeps a slower rank's last save", "[retention]") {
  Node n;
  n.Save(0, 1);
  n.Save(1, 1);
  n.Commit(1);
  for (uint64_t v = 2; v <= 9; ++v) n.Save(0, v);
  for (uint64_t v = 2; v <= 5; ++v) n.Save(1, v);  // rank 1 is behind (its saves 6.. refused: the store was full)
  n.retention.RoundTargets(9, {0, 1});
  // Rank 1's next save references its version 5's chunks: 5 stays (and all
  // above it); 2..4 can never be committed.
  CHECK(n.Versions() == std::vector<uint64_t>{1, 5, 6, 7, 8, 9});
  CHECK(n.store.Find(1, 5) != nullptr);
}

}  // namespace
}  // namespace ftrun
