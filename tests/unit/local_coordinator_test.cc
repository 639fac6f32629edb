// The coordinator a one-node job's agent hosts (launcher/agent/
// local_coordinator.h): the agent's reports go in, its orders come out
// through Pump, with no transport; one node's ranks, commits and restarts.
#include "launcher/agent/local_coordinator.h"

#include "tests/catch.h"

namespace ftrun {
namespace {

using Time = Coordinator::Time;

// The agent's side: what the coordinator ordered, in order.
struct FakeAgent {
  std::vector<std::pair<ClusterMsg, std::string>> got;
  std::unique_ptr<LocalCoordinator> c;
  Time now{};
  int scans = 0;

  // Node 1 of a world {4, 3}: ranks 4..6 of 7 (an agent started alone by
  // DeepSpeed's launcher).
  explicit FakeAgent(int max_restarts = 2, bool disk = false) {
    Coordinator::Options o;
    o.ranks_per_slot = {3};
    o.first_rank = 4;
    o.world_size = 7;
    o.replicas = 0;
    o.max_restarts = max_restarts;
    o.master_port = 31000;
    if (disk) o.scan_disk = [this] { scans++; };
    c = std::make_unique<LocalCoordinator>(o, 1);
    RegisterMsg r;
    r.slot = 0;
    r.address = "10.0.0.2:0";
    Report(r);
  }
  template <class M>
  void Report(const M& m) {
    c->Report(M::kType, Encode(m));
    c->Pump([this](uint16_t type, const std::string& p) { got.emplace_back(static_cast<ClusterMsg>(type), p); }, now);
  }
  int Count(ClusterMsg t) const {
    int n = 0;
    for (const auto& [type, p] : got) n += type == t;
    return n;
  }
  template <class M>
  M Last() const {
    M m;
    for (auto it = got.rbegin(); it != got.rend(); ++it) {
      if (it->first == M::kType) {
        REQUIRE(Decode(it->second, &m).ok());
        return m;
      }
    }
    FAIL("no " << ClusterMsgName(static_cast<uint16_t>(M::kType)));
    return m;
  }
};

TEST_CASE("one node: the agent's coordinator starts it at once, telling it its own ranks of the world",
          "[local_coordinator]") {
  FakeAgent a;
  AssignMsg assign = a.Last<AssignMsg>();
  CHECK(assign.first_rank == 4);
  CHECK(assign.local_ranks == 3);
  CHECK(assign.world_size == 7);
  StartMsg start = a.Last<StartMsg>();
  CHECK(start.epoch == 0);
  CHECK_FALSE(start.version);
  CHECK(start.master_addr == "10.0.0.2");
  CHECK(start.master_port == 31000);
}

TEST_CASE("one node: a version commits once every rank of the node holds it", "[local_coordinator]") {
  FakeAgent a;
  a.Report(HeldMsg{0, {{4, 1}, {5, 1}}});
  CHECK(a.Count(ClusterMsg::kCommit) == 0);
  a.Report(HeldMsg{0, {{6, 1}}});
  REQUIRE(a.Count(ClusterMsg::kCommit) == 1);
  CHECK(a.Last<CommitMsg>().version == 1);
  // Ranks running ahead: version 3 is whole before version 2 ever is.
  a.Report(HeldMsg{0, {{4, 2}, {4, 3}, {5, 3}}});
  CHECK(a.Count(ClusterMsg::kCommit) == 1);
  a.Report(HeldMsg{0, {{6, 3}}});
  CHECK(a.Last<CommitMsg>().version == 3);
  a.Report(HeldMsg{0, {{5, 2}, {6, 2}}});  // older than the commit: nothing
  CHECK(a.Count(ClusterMsg::kCommit) == 2);
  // A stopped generation's saves never count.
  a.Report(HeldMsg{7, {{4, 4}, {5, 4}, {6, 4}}});
  CHECK(a.Count(ClusterMsg::kCommit) == 2);
}

TEST_CASE(
    "one node: a rank's failure halts the node, which restarts from the committed version, until "
    "job.max_restarts",
    "[local_coordinator]") {
  FakeAgent a(/*max_restarts=*/1);
  a.Report(HeldMsg{0, {{4, 5}, {5, 5}, {6, 5}}});
  a.Report(HeldMsg{0, {{4, 6}, {5, 6}}});  // version 6 not whole when rank 6 dies
  a.Report(RankFailedMsg{0, 137, "rank 6 killed by signal 9", false});
  REQUIRE(a.Count(ClusterMsg::kHalt) == 1);
  CHECK(a.Count(ClusterMsg::kStart) == 1);  // not before the node halted
  a.Report(HaltedMsg{1});
  REQUIRE(a.Count(ClusterMsg::kStart) == 2);
  StartMsg start = a.Last<StartMsg>();
  CHECK(start.epoch == 1);
  CHECK(start.version == 5u);
  a.Report(RankFailedMsg{1, 137, "rank 4 killed by signal 9", false});
  REQUIRE(a.Count(ClusterMsg::kStop) == 1);
  StopMsg stop = a.Last<StopMsg>();
  CHECK(stop.code == 137);
  CHECK(stop.message.find("giving up after 1 restarts (job.max_restarts)") != std::string::npos);
}

TEST_CASE("one node: every rank finished ends the job with exit 0", "[local_coordinator]") {
  FakeAgent a;
  a.Report(NodeDoneMsg{0});
  REQUIRE(a.Count(ClusterMsg::kStop) == 1);
  CHECK(a.Last<StopMsg>().code == 0);
}

TEST_CASE("one node: a corrupted chunk that took the last copy stops the job naming it", "[local_coordinator]") {
  FakeAgent a;
  a.Report(HeldMsg{0, {{4, 5}, {5, 5}, {6, 5}}});
  a.Report(DroppedMsg{0, {{5, 5}}, "rank 5 tensor 'w' chunk #3 of version 5 is corrupted in shared memory"});
  a.Report(RankFailedMsg{0, 137, "rank 5 killed by signal 9", false});
  REQUIRE(a.Count(ClusterMsg::kStop) == 1);
  StopMsg stop = a.Last<StopMsg>();
  CHECK(stop.code == 1);
  INFO(stop.message);
  CHECK(stop.message.find("cannot restart: rank 5 tensor 'w' chunk #3 of version 5 is corrupted") == 0);
  CHECK(stop.message.find("no persist.dir") != std::string::npos);
  CHECK(a.Count(ClusterMsg::kStart) == 1);  // never started again on wrong bytes
}

TEST_CASE(
    "one node with a persist directory: nothing starts before the disk scan answers; a scan that fails "
    "stops the job with exit 2",
    "[local_coordinator]") {
  SECTION("the newest version on disk is read before the start") {
    FakeAgent a(2, /*disk=*/true);
    REQUIRE(a.scans == 1);
    CHECK(a.Count(ClusterMsg::kStart) == 0);
    a.c->DiskScanned(Status::Ok(), {12, 10}, a.now);
    a.Report(ReadyMsg{0});  // (Pump delivers what DiskScanned queued)
    PullMsg pull = a.Last<PullMsg>();
    CHECK(pull.from_disk);
    CHECK(pull.version == 12);
    REQUIRE(pull.ranks.size() == 3);
    CHECK(pull.ranks[0].first == 4);
  }
  SECTION("a scan that fails") {
    FakeAgent a(2, /*disk=*/true);
    a.c->DiskScanned(Status::IoError("persist: cannot list /p/job: Permission denied"), {}, a.now);
    a.Report(HeartbeatMsg{0});
    REQUIRE(a.Count(ClusterMsg::kStop) == 1);
    CHECK(a.Last<StopMsg>().code == 2);
    CHECK(a.Count(ClusterMsg::kStart) == 0);
  }
}

}  // namespace
}  // namespace ftrun
