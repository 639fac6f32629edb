// Generations with real rank processes (/bin/sh), real signals, a real
// store, and the coordinator a one-node job's agent hosts (ClusterMember
// over a real LocalCoordinator), wired as the agent wires them: a rank's
// death goes through the one recovery policy (halt, then a start from the
// committed version); restarts that run out end the job with the rank's
// code; a signal to the agent ends it with 128+signal; ranks that all
// finish end it with 0.
#include "launcher/agent/generations.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <thread>

#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

// The agent's side of the orders, as Agent forwards them.
struct Forward : ClusterMember::Orders {
  Generations* gens = nullptr;
  CommitTracker* tracker = nullptr;
  VersionRetention* retention = nullptr;
  RegisterMsg Registration() override {
    RegisterMsg m;
    m.slot = 0;
    m.address = "127.0.0.1:0";
    return m;
  }
  void Assign(const AssignMsg&) override {}
  void Start(const StartMsg& m) override { gens->Start(m); }
  void Halt(uint64_t epoch) override { gens->Halt(epoch); }
  void Readmitted(const PullMsg&) override {}
  void Committed(uint64_t v) override {
    tracker->Committed(v);
    retention->Committed(v);
  }
  void Commit(const CommitMsg& m) override { Committed(m.version); }
  void DropAbove(uint64_t) override {}
  void Ended(int code, const std::string& why, bool) override { gens->End(code, why); }
  void Lost(const std::string& why) override { gens->Lost(why); }
  void GaveUp() override { gens->GaveUp(); }
  void Heard(Clock::Time) override {}
  void ShardPulled(int, uint64_t, PeerId) override {}
  void CorruptToSend(int, uint64_t, const ChunkRef&) override {}
  void Changed() override {}
};

struct Node {
  ManualClock clock;
  std::vector<char> arena = std::vector<char>(4096 + 256 * 4096);
  SnapshotStore store{4096, 256 * 4096, "budget"};
  CommitTracker tracker;
  VersionRetention retention{&store, &tracker};
  CorruptChunks corrupt{&store, arena.data(), nullptr, "nowhere"};
  RecoveryLog recoveries{clock};
  RankProcesses ranks{clock, RankProcesses::Options{}};
  EventLoop loop;
  std::unique_ptr<RankServer> server;
  Forward orders;
  std::unique_ptr<ClusterMember> member;
  std::unique_ptr<Generations> gens;
  std::string script;  // what each rank runs
  int spawned = 0;

  explicit Node(std::string rank_script, int max_restarts = 2) : script(std::move(rank_script)) {
    REQUIRE(BecomeSubreaper().ok());
    REQUIRE(loop.Open({}, milliseconds(5)).ok());
    server = std::make_unique<RankServer>(&loop, clock, RankServer::Handler{});
    ranks.Assign(0, 2);
    ClusterMember::Options mo;
    mo.local.ranks_per_slot = {2};
    mo.local.world_size = 2;
    mo.local.replicas = 0;
    mo.local.max_restarts = max_restarts;
    member = std::make_unique<ClusterMember>(
        mo, &store, arena.data(), &retention,
        [] {
          return std::vector<int>{0, 1};
        },
        &orders, clock);
    Generations::Parts p{&ranks, server.get(), &recoveries, &retention, &corrupt, &store, &tracker, member.get()};
    Generations::Hooks h;
    h.spawn = [this](Generations::Slot& s, int) {
      SpawnSpec spec;
      spec.argv = {"/bin/sh", "-c", script};
      spec.env = {"PATH=/usr/bin:/bin"};
      spawned++;
      return ranks.Spawn(s, spec);
    };
    h.last_words = [](const Generations::Slot&) { return std::string(); };
    h.waiting = [](const Generations::Slot&) { return false; };
    h.starting = [this](const StartMsg& m) {
      if (m.version) orders.Committed(*m.version);
    };
    h.node_rank = [] { return 0; };
    h.changed = [] {};
    Generations::Options go;
    go.max_restarts = max_restarts;
    gens = std::make_unique<Generations>(p, std::move(h), go, clock);
    orders.gens = gens.get();
    orders.tracker = &tracker;
    orders.retention = &retention;
    REQUIRE(member->Setup().ok());
    Pass();
  }
  ~Node() {
    for (auto& s : ranks.slots()) {
      if (s.pgid > 0) ::kill(-s.pgid, SIGKILL);
    }
    pid_t pid;
    ExitInfo info;
    for (int i = 0; i < 100 && ranks.AnyAlive(); ++i) {
      while (ReapOne(&pid, &info)) ranks.Exited(pid);
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  // One pass of the agent's loop: exits reaped, the ranks' stop driven,
  // reports out and orders in.
  void Pass() {
    pid_t pid;
    ExitInfo info;
    while (ReapOne(&pid, &info)) gens->ChildExited(pid, info);
    ranks.Tick();
    member->FlushHeld();
    member->Pump();
  }
  template <class Pred>
  bool PassUntil(Pred done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      Pass();
      if (!done()) std::this_thread::sleep_for(milliseconds(10));
    }
    return done();
  }
  // Both ranks save `version` (their first save: not an early failure).
  void SaveAll(uint64_t version) {
    for (auto& s : ranks.slots()) {
      SaveOneChunk(&store, s.global_rank, version, RankVersionContent(s.global_rank, version), arena.data());
      gens->RankEvent(s, &Generations::Slot::first_step);
      member->RankSaved(s.global_rank, version);
    }
    Pass();
  }
};

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
