// Generations with real rank processes (/bin/sh), real signals, a real
// store, and the coordinator a one-node job's agent hosts (ClusterMember
// over a real LocalCoordinator), wired as the agent wires them: a rank's
// death goes through the one recovery policy (halt, then a start from the
// committed version); restarts that run out end the job with the rank's
// code; a signal to the agent ends it with 128+signal; ranks that all
// finish end it with 0.
#include "launcher/agent/generations.h"

#include "tests/unit/agent_parts_fixture.h"

namespace ftrun {
namespace {

using agent_parts::Node;
using std::chrono::milliseconds;

TEST_CASE("generations: a rank's death stops the node's ranks, and the coordinator starts them from the commit",
          "[generations]") {
  Node n("sleep 300");
  REQUIRE(n.gens->running());
  CHECK(n.spawned == 2);
  CHECK(n.gens->generation() == 0);
  CHECK_FALSE(n.gens->restore_version());
  n.SaveAll(1);
  REQUIRE(n.tracker.last_committed() == std::optional<uint64_t>(1));
  const pid_t victim = n.ranks.slots()[1].pid;
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(n.PassUntil([&] { return n.spawned == 4; }));
  CHECK(n.gens->running());
  CHECK(n.gens->generation() == 1);  // the coordinator's new epoch
  CHECK(n.gens->restore_version() == std::optional<uint64_t>(1));
  for (const auto& s : n.ranks.slots()) {
    CHECK(s.pid != 0);
    CHECK(s.pid != victim);
  }
  REQUIRE(n.recoveries.records().size() == 1);
  CHECK(n.recoveries.records()[0].reason.find("rank 1 killed by signal 9") != std::string::npos);
}

TEST_CASE("generations: when restarts run out the job ends with the failed rank's code", "[generations]") {
  Node n("exit 3", /*max_restarts=*/0);
  REQUIRE(n.PassUntil([&] { return n.gens->done(); }));
  CHECK(n.gens->exit_code() == 3);
  CHECK(n.spawned == 2);
  CHECK_FALSE(n.ranks.AnyAlive());
}

TEST_CASE("generations: a signal to the agent stops the ranks and ends the job with 128+signal", "[generations]") {
  Node n("sleep 300");
  REQUIRE(n.gens->running());
  std::this_thread::sleep_for(milliseconds(100));  // exec'd: SIGTERM meets sh, not this binary's handlers
  n.gens->Signal(SIGTERM);
  CHECK(n.gens->state() == Generations::State::kStopping);
  REQUIRE(n.PassUntil([&] { return n.gens->done(); }));
  CHECK(n.gens->exit_code() == 128 + SIGTERM);
  CHECK_FALSE(n.ranks.AnyAlive());
}

TEST_CASE("generations: when every rank finishes the coordinator ends the job with 0", "[generations]") {
  Node n("exit 0");
  REQUIRE(n.PassUntil([&] { return n.gens->done(); }));
  CHECK(n.gens->exit_code() == 0);
  CHECK(n.spawned == 2);  // no restart
}

}  // namespace
}  // namespace ftrun
