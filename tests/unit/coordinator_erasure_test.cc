// The coordinator with an erasure code (cluster.redundancy erasure): a
// commit waits for every node's parity rows; a lost node is rebuilt from its
// group while each stripe keeps `data` fragments, and its replacement is told
// which members have what; more losses than the code covers stop the job
// naming the code; status says what each group survives.
#include "recovery/coordinator.h"
#include "recovery/coordinator_json.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

struct Outbox : Coordinator::Outbox {
  std::vector<std::tuple<PeerId, ClusterMsg, std::string>> sent;
  void Send(PeerId to, ClusterMsg type, std::string payload) override { sent.emplace_back(to, type, payload); }
  void Disconnect(PeerId) override {}
  template <class M>
  std::optional<M> Last(PeerId to) const {
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (std::get<0>(*it) == to && std::get<1>(*it) == M::kType) {
        M m;
        REQUIRE(Decode(std::get<2>(*it), &m).ok());
        return m;
      }
    }
    return std::nullopt;
  }
};

// `nodes` one-rank nodes in groups of data + parity, and `spares` spares
// (agents nodes, nodes + 1, ...).
struct ErasureJob {
  // `disk`: the versions in the persist directory, newest first (none: no persist.dir).
  ErasureJob(int data, int parity, int nodes, int spares, std::vector<uint64_t> disk = {}) : nodes(nodes) {
    Coordinator::Options o;
    if (!disk.empty()) o.scan_disk = [this, disk] { scans.push_back(disk); };
    o.ranks_per_slot.assign(static_cast<size_t>(nodes), 1);
    o.erasure_data = data;
    o.erasure_parity = parity;
    o.heartbeat_interval = milliseconds(100);
    o.heartbeat_misses = 3;
    c = std::make_unique<Coordinator>(o, &out);
    for (int a = 0; a < nodes + spares; ++a) {
      RegisterMsg m;
      m.slot = a < nodes ? a : -1;
      m.address = "10.0.0.1:" + std::to_string(5000 + a);
      Msg(static_cast<PeerId>(a), m);
    }
  }
  template <class M>
  void Msg(PeerId from, const M& m) {
    c->OnMessage(from, static_cast<uint16_t>(M::kType), Encode(m), now);
    while (!scans.empty()) {  // the persist directory's answer
      std::vector<uint64_t> d = scans.back();
      scans.pop_back();
      c->DiskScanned(Status::Ok(), d, now);
    }
  }
  void Saved(uint64_t v) {
    for (int a = 0; a < nodes; ++a) Msg(static_cast<PeerId>(a), HeldMsg{c->epoch(), {{a, v}}});
  }
  void Parity(uint64_t v, std::vector<int> agents) {
    for (int a : agents) Msg(static_cast<PeerId>(a), ParityHeldMsg{c->epoch(), v});
  }
  std::vector<int> All() const {
    std::vector<int> v;
    for (int a = 0; a < nodes; ++a) v.push_back(a);
    return v;
  }

  int nodes;
  std::vector<std::vector<uint64_t>> scans;
  Outbox out;
  Coordinator::Time now{};
  std::unique_ptr<Coordinator> c;
};

TEST_CASE("coordinator erasure: a version commits once every node saved it and every node's parity rows are complete",
          "[coordinator][erasure]") {
  ErasureJob j(2, 1, 3, 0);
  j.Saved(4);
  REQUIRE(!j.c->committed());  // no copies needed, but no parity yet
  auto round = j.out.Last<ReplicateMsg>(0);
  REQUIRE(round);
  CHECK(round->version == 4);  // the round that makes the parity
  j.Parity(4, {0, 1});
  REQUIRE(!j.c->committed());
  j.Parity(4, {2});
  REQUIRE(j.c->committed() == 4u);
  // Each agent knows its group and its place in it.
  auto m = j.out.Last<MembershipMsg>(1);
  REQUIRE(m);
  CHECK(m->erasure_data == 2);
  CHECK(m->erasure_parity == 1);
  CHECK(m->group.size() == 3);
  CHECK(m->group[static_cast<size_t>(m->group_member)] == 1);
  CHECK(m->members.size() == 3);  // its group's addresses
  auto view = StatusJson(j.c->View());
  REQUIRE(view.contains("erasure"));
  CHECK(view["erasure"]["groups"][0]["survives"] == 1);
}

TEST_CASE(
    "coordinator erasure: a lost node's spare rebuilds it from the group; one loss more than parity stops the job",
    "[coordinator][erasure]") {
  ErasureJob j(4, 2, 6, 2);
  j.Saved(3);
  j.Parity(3, j.All());
  REQUIRE(j.c->committed() == 3u);
  CHECK(StatusJson(j.c->View())["erasure"]["groups"][0]["survives"] == 2);

  j.c->OnPeerDown(1, "gone", j.now);
  auto pull = j.out.Last<PullMsg>(6);  // the first spare takes node 1
  REQUIRE(pull);
  CHECK(pull->version == 3);
  REQUIRE(pull->ranks.size() == 1);
  CHECK(pull->ranks[0].first == 1);
  CHECK(pull->ranks[0].second.empty());  // no copy: rebuilt from the group
  REQUIRE(pull->group.size() == 6);
  CHECK(pull->group_member >= 0);
  const ErasureSource& self = pull->group[static_cast<size_t>(pull->group_member)];
  CHECK(self.agent == kNoAgent);
  int sources = 0;
  for (const ErasureSource& s : pull->group) sources += s.data && s.parity ? 1 : 0;
  CHECK(sources == 5);
  CHECK(StatusJson(j.c->View())["erasure"]["groups"][0]["survives"] == 1);

  SECTION("a second loss in the group is still covered") {
    j.c->OnPeerDown(4, "gone", j.now);
    CHECK(!j.c->done());
    CHECK(j.out.Last<PullMsg>(7));
    CHECK(StatusJson(j.c->View())["erasure"]["groups"][0]["survives"] == 0);
  }
  SECTION("a third is not: the job stops, naming the code") {
    j.c->OnPeerDown(4, "gone", j.now);
    j.c->OnPeerDown(2, "gone", j.now);
    REQUIRE(j.c->done());
    CHECK(j.c->exit_message().find("cluster.redundancy erasure: data 4, parity 2 per group") != std::string::npos);
  }
  SECTION("the rebuilt node holds data but no parity until the next commit, which restores it") {
    j.Msg(6, ReadyMsg{j.c->epoch()});
    j.Msg(6, HeldMsg{j.c->epoch(), {{1, 3}}});
    for (int a : {0, 2, 3, 4, 5}) j.Msg(static_cast<PeerId>(a), HaltedMsg{j.c->epoch()});
    j.Msg(6, HaltedMsg{j.c->epoch()});
    REQUIRE(j.out.Last<StartMsg>(6));
    CHECK(StatusJson(j.c->View())["erasure"]["groups"][0]["survives"] == 1);
    for (int a : {0, 2, 3, 4, 5}) j.Msg(static_cast<PeerId>(a), HeldMsg{j.c->epoch(), {{a, 5}}});
    j.Msg(6, HeldMsg{j.c->epoch(), {{1, 5}}});
    for (int a : {0, 2, 3, 4, 5, 6}) j.Msg(static_cast<PeerId>(a), ParityHeldMsg{j.c->epoch(), 5});
    REQUIRE(j.c->committed() == 5u);
    CHECK(StatusJson(j.c->View())["erasure"]["groups"][0]["survives"] == 2);
  }
}

// Issue 33, finding 2: two nodes' copies of committed version 5 go bad
// (corrupted in shared memory), more than 2+1 covers: the job goes back to
// version 3 on disk, with the same agents. The new timeline's version 5 must
// wait for the new timeline's parity: the abandoned one's records are void.
TEST_CASE("coordinator erasure: after a go-back to disk, the abandoned timeline's parity does not count",
          "[coordinator][erasure]") {
  ErasureJob j(2, 1, 3, 0, {3});
  j.Saved(5);
  j.Parity(5, j.All());
  REQUIRE(j.c->committed() == 5u);
  j.Msg(0, DroppedMsg{j.c->epoch(), {{0, 5}}, "chunk x of rank 0 hashes to y"});
  j.Msg(1, DroppedMsg{j.c->epoch(), {{1, 5}}, "chunk x of rank 1 hashes to y"});
  j.Msg(2, RankFailedMsg{j.c->epoch(), 137, "killed", false});
  REQUIRE(!j.c->done());
  REQUIRE(j.c->committed() == 3u);  // went back to the disk's version
  for (int a : j.All()) {
    auto pull = j.out.Last<PullMsg>(static_cast<PeerId>(a));
    REQUIRE(pull);
    CHECK(pull->from_disk);
  }
  for (int a : j.All()) j.Msg(static_cast<PeerId>(a), HaltedMsg{j.c->epoch()});
  for (int a : j.All()) j.Msg(static_cast<PeerId>(a), ReadyMsg{j.c->epoch()});
  REQUIRE(j.out.Last<StartMsg>(0));
  CHECK(j.out.Last<StartMsg>(0)->version == std::optional<uint64_t>(3));
  j.Saved(4);
  j.Parity(4, j.All());
  REQUIRE(j.c->committed() == 4u);
  j.Saved(5);
  CHECK(j.c->committed() == 4u);  // the old timeline's version 5 parity is not this one's
  j.Parity(5, j.All());
  CHECK(j.c->committed() == 5u);
}

// Issue 33, finding 4: a new coordinator (an etcd standby, --attach)
// learns from the agents' registrations that their parity rows cover the
// committed version: one node lost right after the failover is rebuilt from
// its group, not taken for uncovered.
TEST_CASE("coordinator erasure: a new coordinator counts the parity its agents register with",
          "[coordinator][erasure]") {
  const bool with_parity = GENERATE(true, false);
  Coordinator::Options o;
  o.ranks_per_slot.assign(3, 1);
  o.erasure_data = 2;
  o.erasure_parity = 1;
  o.heartbeat_interval = milliseconds(100);
  o.heartbeat_misses = 3;
  Outbox out;
  Coordinator c(o, &out);
  Coordinator::Time now{};
  for (int a = 0; a < 4; ++a) {
    RegisterMsg m;
    m.slot = a < 3 ? a : -1;
    m.address = "10.0.0.1:" + std::to_string(5000 + a);
    m.epoch = 4;
    if (a < 3) {
      m.committed = 9;
      m.catalog = {{a, 9}};
      if (with_parity) m.parity = 9;
    }
    c.OnMessage(static_cast<PeerId>(a), static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m), now);
  }
  REQUIRE(c.committed() == 9u);
  CHECK(StatusJson(c.View())["erasure"]["groups"][0]["survives"] == (with_parity ? 1 : 0));
}

}  // namespace
}  // namespace ftrun
