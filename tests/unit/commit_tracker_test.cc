#include <catch2/catch.hpp>

#include "recovery/commit_tracker.h"

using ftrun::LocalCommitTracker;

TEST_CASE("a version commits only when every local rank holds it", "[commit]") {
  LocalCommitTracker t({4, 5, 6});
  CHECK_FALSE(t.OnRankHeld(4, 1));
  CHECK_FALSE(t.OnRankHeld(5, 1));
  CHECK_FALSE(t.last_committed());
  CHECK(t.OnRankHeld(6, 1) == 1u);
  CHECK(t.last_committed() == 1u);
  // Ranks running ahead: version 3 completes before 2 ever does.
  CHECK_FALSE(t.OnRankHeld(4, 2));
  CHECK_FALSE(t.OnRankHeld(4, 3));
  CHECK_FALSE(t.OnRankHeld(5, 3));
  CHECK(t.OnRankHeld(6, 3) == 3u);
  CHECK_FALSE(t.OnRankHeld(5, 2));  // older than committed: ignored
  CHECK(t.last_committed() == 3u);
}

TEST_CASE("unknown ranks and discarded pending versions never commit", "[commit]") {
  LocalCommitTracker t({0, 1});
  CHECK_FALSE(t.OnRankHeld(7, 1));
  CHECK_FALSE(t.OnRankHeld(0, 1));
  t.DiscardPending();  // rank 1 died; its generation's pending saves are void
  CHECK_FALSE(t.OnRankHeld(1, 1));
  CHECK_FALSE(t.last_committed());
  CHECK_FALSE(t.OnRankHeld(0, 2));
  CHECK(t.OnRankHeld(1, 2) == 2u);
}
