// ClusterMember for a one-node job: a real hosted coordinator (the same
// state machine as a cluster's), a real SnapshotStore and VersionRetention,
// and a recording agent (its Orders). Registration, a commit from the held
// reports of one pass, and a rank's failure going through the one recovery
// policy: a halt, then a start from the committed version.
#include "launcher/agent/cluster_member.h"

#include "tests/catch.h"
#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace {

struct RecordingAgent : ClusterMember::Orders {
  std::vector<std::string> log;  // every order, in order
  std::optional<StartMsg> started;
  std::vector<uint64_t> committed;
  std::vector<uint64_t> halted;
  std::optional<uint64_t> last_committed;

  RegisterMsg Registration() override {
    RegisterMsg m;
    m.slot = 0;  // a one-node job's coordinator knows one node
    m.address = "10.0.0.2:0";
    m.committed = last_committed;
    return m;
  }
  void Assign(const AssignMsg& m) override { log.push_back("assign " + std::to_string(m.first_rank)); }
  void Start(const StartMsg& m) override {
    log.push_back("start");
    started = m;
  }
  void Halt(uint64_t epoch) override {
    log.push_back("halt");
    halted.push_back(epoch);
  }
  void Readmitted(const PullMsg&) override { log.push_back("readmitted"); }
  void Committed(uint64_t v) override { log.push_back("committed " + std::to_string(v)); }
  void Commit(const CommitMsg& m) override {
    log.push_back("commit " + std::to_string(m.version));
    committed.push_back(m.version);
    last_committed = m.version;
  }
  void DropAbove(uint64_t) override { log.push_back("drop above"); }
  void Ended(int code, const std::string&, bool fenced) override {
    log.push_back("ended " + std::to_string(code) + (fenced ? " fenced" : ""));
  }
  void Lost(const std::string&) override { log.push_back("lost"); }
  void GaveUp() override { log.push_back("gave up"); }
  void Heard(Clock::Time) override {}
  void ShardPulled(int, uint64_t, PeerId) override {}
  void CorruptToSend(int, uint64_t, const ChunkRef&) override {}
  void Changed() override {}
};

struct Node {
  ManualClock clock;
  SnapshotStore store{4096, 256 * 4096, "budget"};
  CommitTracker tracker;
  VersionRetention retention{&store, &tracker};
  RecordingAgent agent;
  std::unique_ptr<ClusterMember> member;

  // Ranks 4 and 5 of a world of 6, on a node of its own.
  explicit Node(int max_restarts = 2) {
    ClusterMember::Options o;
    o.agent_id = 1;
    o.local.ranks_per_slot = {2};
    o.local.first_rank = 4;
    o.local.world_size = 6;
    o.local.replicas = 0;
    o.local.max_restarts = max_restarts;
    o.local.master_port = 31000;
    member = std::make_unique<ClusterMember>(
        o, &store, nullptr, &retention,
        [] {
          return std::vector<int>{4, 5};
        },
        &agent, clock);
    REQUIRE(member->Setup().ok());
    Pass();
  }
  // One pass of the agent's loop ends: held reports go, orders come.
  void Pass() {
    member->FlushHeld();
    member->Pump();
  }
  void Save(int rank, uint64_t version) {
    SaveOneChunk(&store, rank, version, RankVersionContent(rank, version));
    member->RankSaved(rank, version);
  }
};

TEST_CASE("cluster member: a one-node job registers with its own coordinator and is started at once",
          "[cluster_member]") {
  Node n;
  CHECK_FALSE(n.member->remote());
  CHECK(n.member->up());
  CHECK(n.member->event_fd() == -1);
  CHECK_FALSE(n.member->View());  // a multi-node job's only
  REQUIRE(n.agent.started);
  CHECK_FALSE(n.agent.started->version);
  CHECK(n.agent.started->master_addr == "10.0.0.2");
  CHECK(n.agent.started->master_port == 31000);
  CHECK(n.agent.log == std::vector<std::string>{"assign 4", "start"});
}

TEST_CASE("cluster member: the saves of one pass go in one report; the version commits once both ranks hold it",
          "[cluster_member]") {
  Node n;
  n.Save(4, 1);
  n.member->Pump();  // not yet flushed: the coordinator has heard nothing
  CHECK(n.agent.committed.empty());
  n.Save(5, 1);
  n.Pass();
  CHECK(n.agent.committed == std::vector<uint64_t>{1});
  n.Save(4, 2);
  n.Pass();
  CHECK(n.agent.committed == std::vector<uint64_t>{1});  // rank 5 has not saved 2
}

TEST_CASE("cluster member: a rank's failure goes through the coordinator: halt, then a start from the commit",
          "[cluster_member]") {
  Node n;
  n.Save(4, 1);
  n.Save(5, 1);
  n.Pass();
  REQUIRE(n.agent.committed == std::vector<uint64_t>{1});
  n.Save(4, 2);  // never committed
  n.member->Report(RankFailedMsg{n.member->epoch(), 137, "rank 5 killed by signal 9", false});
  n.Pass();
  REQUIRE(n.agent.halted.size() == 1);
  const uint64_t epoch = n.agent.halted[0];
  CHECK(epoch > 0);
  CHECK(n.member->epoch() == epoch);  // joined before the agent halts its ranks
  n.member->Report(HaltedMsg{epoch});
  n.Pass();
  REQUIRE(n.agent.started);
  CHECK(n.agent.started->epoch == epoch);
  REQUIRE(n.agent.started->version);
  CHECK(*n.agent.started->version == 1);
}

TEST_CASE("cluster member: restarts run out: the coordinator ends the job with the rank's code", "[cluster_member]") {
  Node n(/*max_restarts=*/0);
  n.member->Report(RankFailedMsg{n.member->epoch(), 3, "rank 4 exited with code 3", false});
  n.Pass();
  REQUIRE_FALSE(n.agent.log.empty());
  CHECK(n.agent.log.back() == "ended 3");
}

}  // namespace
}  // namespace ftrun
