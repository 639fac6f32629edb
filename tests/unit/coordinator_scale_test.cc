// The coordinator with many ranks: commits decided as copies arrive in any
// order (the count of ranks at full redundancy only filters the exact
// check, never replaces it), and each agent's membership naming only the
// members it deals with.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "recovery/coordinator.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

constexpr int kNodes = 64, kRanks = 8;

struct Recorder : Coordinator::Outbox {
  std::vector<std::tuple<PeerId, ClusterMsg, std::string>> sent;
  void Send(PeerId to, ClusterMsg type, std::string payload) override { sent.emplace_back(to, type, payload); }
  void Disconnect(PeerId) override {}
  int Count(ClusterMsg type) const {
    return static_cast<int>(
        std::count_if(sent.begin(), sent.end(), [&](const auto& s) { return std::get<1>(s) == type; }));
  }
};

struct Job {
  Recorder out;
  Coordinator::Time now{};
  std::unique_ptr<Coordinator> c;

  Job() {
    Coordinator::Options o;
    o.ranks_per_slot.assign(kNodes, kRanks);
    o.replicas = 1;
    c = std::make_unique<Coordinator>(o, &out);
    for (int a = 0; a < kNodes; ++a) Register(a);
  }
  void Register(int a, std::vector<RankVersion> catalog = {}) {
    RegisterMsg m;
    m.slot = a;
    m.address = "10.0.0." + std::to_string(a) + ":7000";
    m.catalog = std::move(catalog);
    c->OnMessage(static_cast<PeerId>(a), static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m), now);
  }
  void Held(int agent, int slot, uint64_t v) {
    std::vector<RankVersion> items;
    for (int r = 0; r < kRanks; ++r) items.push_back({slot * kRanks + r, v});
    c->OnMessage(static_cast<PeerId>(agent), static_cast<uint16_t>(ClusterMsg::kHeld),
                 Encode(HeldMsg{c->epoch(), items}), now);
  }
};

// Every node's own report and its holder's copy of version v, shuffled.
std::vector<std::pair<int, int>> Reports(std::mt19937* rng) {
  std::vector<std::pair<int, int>> r;  // (agent, slot)
  for (int s = 0; s < kNodes; ++s) {
    r.push_back({s, s});
    r.push_back({(s + 1) % kNodes, s});  // PlaceReplicas without racks: the next node holds it
  }
  std::shuffle(r.begin(), r.end(), *rng);
  return r;
}

TEST_CASE("coordinator: 512 ranks' copies in any order commit exactly at the last one", "[coordinator]") {
  Job job;
  std::mt19937 rng(7);
  for (uint64_t v = 1; v <= 5; ++v) {
    const auto reports = Reports(&rng);
    for (size_t i = 0; i < reports.size(); ++i) {
      REQUIRE(job.c->committed() == (v == 1 ? std::nullopt : std::optional<uint64_t>(v - 1)));
      job.Held(reports[i].first, reports[i].second, v);
    }
    REQUIRE(job.c->committed() == v);
  }
  CHECK(job.out.Count(ClusterMsg::kCommit) == 5 * kNodes);
}

TEST_CASE("coordinator: the status view counts each rank's live copies of the committed version", "[coordinator]") {
  Job job;
  std::mt19937 rng(3);
  for (const auto& [agent, slot] : Reports(&rng)) job.Held(agent, slot, 1);
  REQUIRE(job.c->committed() == 1u);
  CoordinatorView v = job.c->View();
  REQUIRE(v.committed_copies.size() == static_cast<size_t>(kNodes * kRanks));
  CHECK(std::count(v.committed_copies.begin(), v.committed_copies.end(), 2) == kNodes * kRanks);
  // Agent 7 dies: its own ranks (slot 7) and the ones it holds (slot 6,
  // held by the next node) each lose a copy; no other rank does.
  job.c->OnPeerDown(7, "killed", job.now);
  v = job.c->View();
  for (int r = 0; r < kNodes * kRanks; ++r) {
    const int slot = r / kRanks;
    CHECK(v.committed_copies[static_cast<size_t>(r)] == (slot == 6 || slot == 7 ? 1 : 2));
  }
}

TEST_CASE("coordinator: copies voided by a re-registration never complete a commit", "[coordinator]") {
  Job job;
  std::mt19937 rng(11);
  auto reports = Reports(&rng);
  // Node 5's copy of node 4's ranks last; node 5 registers again (a
  // coordinator link that broke) before it: its earlier reports are void.
  auto last = std::find(reports.begin(), reports.end(), std::pair<int, int>{5, 4});
  std::rotate(last, last + 1, reports.end());
  for (size_t i = 0; i + 1 < reports.size(); ++i) job.Held(reports[i].first, reports[i].second, 1);
  REQUIRE(!job.c->committed());
  const uint64_t epoch = job.c->epoch();
  job.Register(5);
  job.c->Tick(job.now);
  // A same-slot reconnect is a recovery (a new epoch): the old copies never
  // count, even when the missing one arrives in the old epoch.
  job.Held(5, 4, 1);
  REQUIRE(!job.c->committed());
  REQUIRE(job.c->epoch() > epoch);
}

TEST_CASE("coordinator: each agent's membership names the members it deals with, and reads back whole",
          "[coordinator]") {
  Job job;
  std::map<PeerId, MembershipMsg> got;
  for (const auto& [to, type, payload] : job.out.sent) {
    if (type != ClusterMsg::kMembership) continue;
    MembershipMsg m;
    REQUIRE(Decode(payload, &m).ok());
    REQUIRE(Encode(m) == payload);
    got[to] = m;
  }
  REQUIRE(got.size() == static_cast<size_t>(kNodes));
  // Agent a runs slot a (address 10.0.0.a); each slot has one holder,
  // another node, which lists the slot among those it holds.
  for (const auto& [a, m] : got) {
    REQUIRE(m.my_holders.size() == 1);
    const PeerId h = m.my_holders[0];
    CHECK(h != a);
    const auto& held = got.at(h).held_slots;
    CHECK(std::count(held.begin(), held.end(), static_cast<int32_t>(a)) == 1);
    // Members: itself, its holder, the agents of the slots it holds; no one
    // else (the whole list to every agent was N^2 bytes at a change).
    std::set<PeerId> want = {a, h};
    for (int32_t s : m.held_slots) want.insert(static_cast<PeerId>(s));
    std::set<PeerId> named;
    for (const MemberInfo& x : m.members) {
      named.insert(x.agent);
      CHECK(x.slot == static_cast<int32_t>(x.agent));
      CHECK(x.address == "10.0.0." + std::to_string(x.agent) + ":7000");
      CHECK(x.first_rank == x.slot * kRanks);
      CHECK(x.ranks == kRanks);
    }
    CHECK(named == want);
    CHECK(m.members.size() == want.size());  // each once
  }
}

TEST_CASE("coordinator: a heartbeat goes only to an agent that was sent nothing for an interval", "[coordinator]") {
  Job job;  // formed at time 0: every agent was sent its start then
  auto beats = [&] { return job.out.Count(ClusterMsg::kCoordHeartbeat); };
  job.now += milliseconds(150);
  job.c->Tick(job.now);
  CHECK(beats() == 0);
  job.now += milliseconds(50);
  job.c->Tick(job.now);
  CHECK(beats() == kNodes);  // 200 ms of silence: one each
  // A version commits at 300 ms: the commit speaks for the coordinator.
  job.now += milliseconds(100);
  std::mt19937 rng(3);
  for (const auto& [agent, slot] : Reports(&rng)) job.Held(agent, slot, 1);
  REQUIRE(job.c->committed() == 1u);
  job.now += milliseconds(150);
  job.c->Tick(job.now);
  CHECK(beats() == kNodes);
  job.now += milliseconds(50);
  job.c->Tick(job.now);
  CHECK(beats() == 2 * kNodes);
}

}  // namespace
}  // namespace ftrun
