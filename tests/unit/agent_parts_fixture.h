// A node's rank-side parts wired as the agent wires them, for the tests of
// those parts: real rank processes (/bin/sh), a real store, the coordinator
// a one-node job's agent hosts (ClusterMember over a real LocalCoordinator),
// and Generations between them.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "launcher/agent/disk_recovery.h"
#include "launcher/agent/generations.h"
#include "launcher/agent/store_service.h"
#include "tests/catch.h"
#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace agent_parts {

using std::chrono::milliseconds;

// The agent's side of the orders, as Agent forwards them.
struct Forward : ClusterMember::Orders {
  Generations* gens = nullptr;
  CommitTracker* tracker = nullptr;
  VersionRetention* retention = nullptr;
  DiskRecovery* disk = nullptr;  // with a persist directory
  RegisterMsg Registration() override {
    RegisterMsg m;
    m.slot = 0;
    m.address = "127.0.0.1:0";
    return m;
  }
  void Assign(const AssignMsg&) override {}
  void Start(const StartMsg& m) override { gens->Start(m); }
  void Halt(uint64_t epoch) override { gens->Halt(epoch); }
  void Readmitted(const PullMsg& m) override {
    if (disk) disk->Cancel();
    if (disk && m.from_disk) disk->Pull(m);
  }
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
  StoreService service{&store, &tracker, &retention, 4096};
  CorruptChunks corrupt{&store, arena.data(), nullptr, "nowhere"};
  RecoveryLog recoveries{clock};
  RankProcesses ranks{clock, RankProcesses::Options{}};
  EventLoop loop;
  std::unique_ptr<RankServer> server;
  Forward orders;
  std::unique_ptr<ClusterMember> member;
  std::unique_ptr<Generations> gens;
  std::unique_ptr<NodeDisk> disk;
  std::unique_ptr<DiskRecovery> recovery;  // (its worker joined before the arena goes)
  std::string script;                      // what each rank runs
  int spawned = 0;

  // `persist_dir`: where job "job"'s versions are (none: no persist directory).
  explicit Node(std::string rank_script, int max_restarts = 2, std::string persist_dir = "")
      : script(std::move(rank_script)) {
    REQUIRE(BecomeSubreaper().ok());
    REQUIRE(loop.Open({}, milliseconds(5)).ok());
    server = std::make_unique<RankServer>(&loop, clock, RankServer::Handler{});
    ranks.Assign(0, 2);
    ClusterMember::Options mo;
    mo.local.ranks_per_slot = {2};
    mo.local.world_size = 2;
    mo.local.replicas = 0;
    mo.local.max_restarts = max_restarts;
    if (!persist_dir.empty()) {
      NodeDisk::Options d;
      d.config.dir = persist_dir;
      d.job_id = "job";
      d.arena_base = arena.data();
      d.ranks = [] { return std::vector<int>{0, 1}; };
      disk = std::make_unique<NodeDisk>(std::move(d), &store, clock);
      disk->Assign(0, 2);
      mo.local.scan_disk = [this] {
        recovery->Scan([this](const Status& s, const std::vector<uint64_t>& versions) {
          member->DiskScanned(s, versions, clock.Now());
        });
      };
    }
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
    if (disk) {
      recovery = std::make_unique<DiskRecovery>(
          DiskRecovery::Parts{&store, arena.data(), disk.get(), &tracker, &retention, member.get(), &loop, 6},
          [] {
            return DiskRecovery::Place{"job", 2, 0};
          },
          [this](uint64_t v) { orders.Committed(v); }, clock);
      orders.disk = recovery.get();
    }
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
    if (recovery) recovery->OnEvent();
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

}  // namespace agent_parts
}  // namespace ftrun
