// The coordinator's ledger of copies (recovery/commit_rounds.h): a version
// commits once every rank has 1 + replicas live holders; a round targets the
// newest version every rank holds; reports of a stopped epoch and of a
// timeline given up are void; DiskVersions (recovery/disk_versions.h): one
// scan serves the latest need, unreadable versions are skipped, and the
// files above a version the job went back to are void only after a newer
// commit.
#include "recovery/commit_rounds.h"

#include "recovery/disk_versions.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

// Two nodes of one rank each (agents 1 and 2 on nodes 0 and 1), one replica.
struct Ledger {
  Membership members{{{1, 1}, 0, 0, {}, 1, 0, 0}};
  CommitRounds rounds{&members, 1, milliseconds(1000)};
  CommitRounds::Time t{};
  Ledger() {
    for (int s = 0; s < 2; ++s) members.Assign(*members.Register(static_cast<PeerId>(s + 1), "h", "", s, t).first, s);
  }
};

TEST_CASE("CommitRounds: a version commits with 1 + replicas live holders of every rank", "[commit_rounds]") {
  Ledger l;
  l.rounds.Held(1, {{0, 5}}, l.t);
  l.rounds.Held(2, {{1, 5}}, l.t);
  CHECK_FALSE(l.rounds.Commit(l.t));           // one copy of each rank
  CHECK(l.rounds.Target(l.t) == uint64_t{5});  // every rank holds 5 locally: a round on it
  CHECK_FALSE(l.rounds.Target(l.t));           // the same round goes on
  l.rounds.Held(2, {{0, 5}}, l.t);             // node 1 holds rank 0's copy
  CHECK_FALSE(l.rounds.Commit(l.t));
  l.rounds.Held(1, {{1, 5}}, l.t);
  CHECK(l.rounds.Commit(l.t) == uint64_t{5});
  CHECK(l.rounds.committed() == uint64_t{5});
  CHECK(l.rounds.commits() == 1);
  CHECK(l.rounds.CommittedCopies() == std::vector<int>{2, 2});
  CHECK_FALSE(l.rounds.Commit(l.t));  // once
  // A lost agent's copies do not count.
  l.members.Find(2)->alive = false;
  CHECK(l.rounds.CommittedCopies() == std::vector<int>{1, 1});
  CHECK(l.rounds.HoldersAlive(1, 5) == std::vector<PeerId>{1});
}

TEST_CASE("CommitRounds: a new epoch voids the reports above the committed version", "[commit_rounds]") {
  Ledger l;
  for (PeerId a : {1, 2}) l.rounds.Held(a, {{0, 3}, {1, 3}}, l.t);
  REQUIRE(l.rounds.Commit(l.t) == uint64_t{3});
  for (PeerId a : {1, 2}) l.rounds.Held(a, {{0, 4}, {1, 4}}, l.t);
  l.rounds.NewEpoch();
  CHECK_FALSE(l.rounds.Commit(l.t));  // version 4's copies were reported in the stopped epoch
  CHECK(l.rounds.HoldersAlive(0, 4).empty());
  CHECK(l.rounds.HoldersAlive(0, 3).size() == 2);  // the committed version's stay
  // Going back to a version on disk: nothing held counts, it is the committed one.
  l.rounds.GoBackTo(2);
  CHECK(l.rounds.committed() == uint64_t{2});
  CHECK(l.rounds.HoldersAlive(0, 3).empty());
}

TEST_CASE("CommitRounds: a failed round targets the newest version any rank saved", "[commit_rounds]") {
  Ledger l;
  l.rounds.Held(1, {{0, 7}}, l.t);
  l.rounds.Held(2, {{1, 7}}, l.t);
  REQUIRE(l.rounds.Target(l.t) == uint64_t{7});
  CHECK_FALSE(l.rounds.RoundFailed(6));  // not the round's
  l.rounds.Held(1, {{0, 9}}, l.t);       // rank 0 ran ahead
  CHECK(l.rounds.RoundFailed(7));
  CHECK(l.rounds.Target(l.t) == uint64_t{9});  // only rank 0 holds 9: the others copy it when they save it
}

TEST_CASE("CommitRounds: an agent registering again voids its reports", "[commit_rounds]") {
  Ledger l;
  for (PeerId a : {1, 2}) l.rounds.Held(a, {{0, 3}, {1, 3}}, l.t);
  REQUIRE(l.rounds.Commit(l.t));
  l.rounds.Registered(2, std::nullopt, {{1, 3}}, std::nullopt, false);  // holds only rank 1 of version 3 now
  CHECK(l.rounds.HoldersAlive(0, 3) == std::vector<PeerId>{1});
  CHECK(l.rounds.HoldersAlive(1, 3).size() == 2);
  // A restarted coordinator learns the committed version from the agents.
  Ledger fresh;
  fresh.rounds.Registered(1, 8, {{0, 8}}, std::nullopt, false);
  CHECK(fresh.rounds.committed() == uint64_t{8});
  CHECK(fresh.rounds.HoldersAlive(0, 8) == std::vector<PeerId>{1});
}

TEST_CASE("DiskVersions: one scan serves the latest need; bad versions skipped; void above after a commit",
          "[commit_rounds]") {
  DiskVersions d;
  CHECK(d.Ask(DiskVersions::Need::kStart, ""));
  CHECK_FALSE(d.Ask(DiskVersions::Need::kCoverage, "lost"));  // the answer on its way serves it
  CHECK(d.awaited());
  CHECK(d.Answered() == DiskVersions::Need::kCoverage);
  CHECK(d.Answered() == DiskVersions::Need::kNone);  // once
  CHECK(d.detail() == "lost");
  CHECK_FALSE(d.Newest());  // nothing used yet
  d.Use({9, 7, 4});
  CHECK(d.scanned());
  d.Bad(9);
  CHECK(d.Newest() == uint64_t{7});
  d.Done();
  CHECK_FALSE(d.scanned());
  d.WentBackTo(7);
  d.WentBackTo(4);  // the oldest it went back to
  CHECK_FALSE(d.Committed(4));
  CHECK(d.Committed(5) == uint64_t{4});
  CHECK_FALSE(d.Committed(6));  // once
}

}  // namespace
}  // namespace ftrun
