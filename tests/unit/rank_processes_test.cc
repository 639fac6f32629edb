// RankProcesses with real processes (/bin/sh), real signals and a manual
// clock: stops that escalate after the grace, the drain of a stopped rank's
// children, hang detection.
#include "launcher/agent/rank_processes.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

SpawnSpec Shell(const std::string& script) {
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.env = {"PATH=/usr/bin:/bin"};
  return s;
}

// Reaps what exited and hands each pid to `ranks`, until `done` or ~10 s.
template <class Pred>
bool ReapUntil(RankProcesses& ranks, Pred done) {
  for (int i = 0; i < 1000 && !done(); ++i) {
    pid_t pid;
    ExitInfo info;
    while (ReapOne(&pid, &info)) ranks.Exited(pid);
    ranks.Tick();
    if (!done()) std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

bool GroupAlive(pid_t pgid) { return pgid > 0 && ::kill(-pgid, 0) == 0; }

// Until the fork of `pid` has exec'd /bin/sh (a signal before that would
// meet this test binary's own handlers in the child).
void WaitExeced(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == "sh") return;
    std::this_thread::sleep_for(milliseconds(2));
  }
  FAIL("pid " << pid << " never exec'd /bin/sh");
}

TEST_CASE(
    "rank processes: a rank that ignores SIGTERM is killed once stop_grace has passed, and the stop ends "
    "only when its children are gone too",
    "[rank_processes]") {
  REQUIRE(BecomeSubreaper().ok());  // the test reaps the ranks' orphans, as the agent does
  ManualClock clock;
  RankProcesses::Options o;
  o.stop_grace = milliseconds(5000);
  RankProcesses ranks(clock, o);
  ranks.Assign(4, 2);
  REQUIRE(ranks.ByRank(5) != nullptr);
  CHECK(ranks.ByRank(6) == nullptr);
  CHECK(ranks.Ranks() == std::vector<int>{4, 5});
  // Rank 4 exits on SIGTERM; rank 5 ignores it and has a child that outlives it.
  REQUIRE(ranks.Spawn(ranks.slots()[0], Shell("sleep 300; :")).ok());
  REQUIRE(ranks.Spawn(ranks.slots()[1], Shell("trap '' TERM; sleep 300 & while :; do sleep 0.05; done")).ok());
  for (auto& s : ranks.slots()) WaitExeced(s.pid);
  const pid_t group5 = ranks.slots()[1].pgid;
  std::this_thread::sleep_for(milliseconds(200));  // the traps are set
  int stopped = 0;
  ranks.Stop([&] { stopped++; });
  CHECK(ranks.stopping());
  REQUIRE(ReapUntil(ranks, [&] { return ranks.slots()[0].pid == 0; }));
  std::this_thread::sleep_for(milliseconds(300));
  ranks.Tick();
  CHECK(ranks.slots()[1].pid != 0);  // still in its grace: SIGTERM ignored
  CHECK(stopped == 0);
  clock.Advance(milliseconds(5001));
  REQUIRE(ReapUntil(ranks, [&] { return stopped == 1; }));  // SIGKILL, then the group drained
  CHECK_FALSE(ranks.stopping());
  CHECK_FALSE(GroupAlive(group5));
  CHECK_FALSE(ranks.AnyAlive());
}

TEST_CASE("rank processes: a stop with no rank alive drains at once; an unknown pid is not a rank",
          "[rank_processes]") {
  ManualClock clock;
  RankProcesses ranks(clock, {});
  ranks.Assign(0, 1);
  CHECK(ranks.Exited(12345) == nullptr);
  int stopped = 0;
  ranks.Stop([&] { stopped++; });
  CHECK(stopped == 1);
  CHECK_FALSE(ranks.stopping());
}

TEST_CASE(
    "rank processes: a rank with no progress for hang_timeout is hung, unless it waits for a commit while "
    "another rank works",
    "[rank_processes]") {
  REQUIRE(BecomeSubreaper().ok());
  ManualClock clock;
  RankProcesses::Options o;
  o.hang_timeout = milliseconds(1000);
  RankProcesses ranks(clock, o);
  ranks.Assign(0, 2);
  for (auto& s : ranks.slots()) {
    REQUIRE(ranks.Spawn(s, Shell("sleep 300; :")).ok());
    WaitExeced(s.pid);
  }
  ranks.slots()[0].conn_id = 7;  // rank 0 waits for a commit
  auto rank0_waits = [](const RankProcesses::Slot& s) { return s.global_rank == 0; };
  clock.Advance(milliseconds(900));
  ranks.slots()[1].last_progress = clock.Now();  // rank 1 works
  CHECK(ranks.Hung(rank0_waits) == nullptr);
  clock.Advance(milliseconds(900));  // rank 0 waited 1.8 s, but rank 1 is still working: not hung
  CHECK(ranks.Hung(rank0_waits) == nullptr);
  clock.Advance(milliseconds(1200));  // rank 1 made no progress for 2.1 s
  RankProcesses::Slot* hung = ranks.Hung(rank0_waits);
  REQUIRE(hung != nullptr);
  CHECK(hung->global_rank == 1);
  int stopped = 0;
  ranks.Stop([&] { stopped++; });
  CHECK(ranks.Hung(rank0_waits) == nullptr);  // never while stopping
  REQUIRE(ReapUntil(ranks, [&] { return stopped == 1; }));
}

TEST_CASE("rank processes: a finished rank's leftovers are killed and its group forgotten", "[rank_processes]") {
  REQUIRE(BecomeSubreaper().ok());
  ManualClock clock;
  RankProcesses ranks(clock, {});
  ranks.Assign(0, 1);
  RankProcesses::Slot& s = ranks.slots()[0];
  REQUIRE(ranks.Spawn(s, Shell("sleep 300 & exit 0")).ok());
  WaitExeced(s.pid);
  const pid_t group = s.pgid;
  REQUIRE(ReapUntil(ranks, [&] { return s.pid == 0; }));
  CHECK(GroupAlive(group));  // the leftover sleep
  ranks.KillFinishedGroup(s);
  CHECK(s.pgid == 0);
  REQUIRE(ReapUntil(ranks, [&] { return !GroupAlive(group); }));
}

}  // namespace
}  // namespace ftrun
