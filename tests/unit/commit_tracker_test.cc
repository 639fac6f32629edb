#include "recovery/commit_tracker.h"

#include "tests/catch.h"

using ftrun::CommitTracker;

TEST_CASE("the committed version only moves forward, except when the job goes back", "[commit]") {
  CommitTracker t;
  CHECK_FALSE(t.last_committed());
  t.Committed(3);
  t.Committed(2);  // a stale commit (a pull's restore point older than a commit seen since)
  CHECK(t.last_committed() == 3u);
  t.Committed(5);
  CHECK(t.last_committed() == 5u);
  t.Rewind(4);  // the job went back to version 4 on disk
  CHECK(t.last_committed() == 4u);
}
