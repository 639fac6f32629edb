// The coordinator's state machine, driven by hand: messages in, a manual
// clock, and a recording outbox.
#include "recovery/coordinator.h"

#include "recovery/coordinator_json.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

using Time = Coordinator::Time;
using std::chrono::milliseconds;

struct Recorder : Coordinator::Outbox {
  std::vector<std::tuple<PeerId, ClusterMsg, std::string>> sent;
  std::vector<PeerId> disconnected;
  void Send(PeerId to, ClusterMsg type, std::string payload) override { sent.emplace_back(to, type, payload); }
  void Disconnect(PeerId p) override { disconnected.push_back(p); }
  int Count(PeerId to, ClusterMsg type) const {
    int n = 0;
    for (const auto& [p, t, s] : sent) n += p == to && t == type;
    return n;
  }
  std::string Last(PeerId to, ClusterMsg type) const {
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (std::get<0>(*it) == to && std::get<1>(*it) == type) return std::get<2>(*it);
    }
    return {};
  }
};

std::string HeldMsg(uint64_t epoch, std::vector<RankVersion> v) {
  ByteWriter w;
  w.Put<uint64_t>(epoch);
  PutRankVersions(v, &w);
  return w.data();
}

// kDropped: the held-shaped pairs, then why they were dropped.
std::string DroppedMsg(uint64_t epoch, std::vector<RankVersion> v, const std::string& why = "") {
  return Encode(ftrun::DroppedMsg{epoch, std::move(v), why});
}

struct Fixture {
  Recorder out;
  Time now{};
  std::unique_ptr<Coordinator> c;

  // 3 nodes x 1 rank, replicas 1, plus `spares` spares (agents 3, 4, ...).
  // With `disk`: a persist directory whose scans answer disk(). A scan the
  // coordinator asks for is answered after the call that asked (as the
  // runner's disk worker would, a moment later), unless hold_scans.
  std::function<std::vector<uint64_t>()> disk;
  int scans_asked = 0;
  int scans_answered = 0;
  std::string store;  // what store_address answers
  bool hold_scans = false;

  explicit Fixture(int spares, int replicas = 1, std::function<std::vector<uint64_t>()> disk_versions = nullptr)
      : disk(std::move(disk_versions)) {
    Coordinator::Options o;
    if (disk) o.scan_disk = [this] { scans_asked++; };
    o.store_address = [this] { return store; };
    o.ranks_per_slot = {1, 1, 1};
    o.replicas = replicas;
    o.heartbeat_interval = milliseconds(100);
    o.heartbeat_misses = 3;
    o.lost_node_timeout = milliseconds(2000);
    c = std::make_unique<Coordinator>(o, &out);
    for (int a = 0; a < 3 + spares; ++a) {
      RegisterMsg m;
      m.slot = a < 3 ? a : -1;
      m.address = "127.0.0.1:" + std::to_string(5000 + a);
      c->OnMessage(static_cast<PeerId>(a), static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m), now);
      AnswerScans();
    }
  }
  void AnswerScans() {
    while (!hold_scans && scans_answered < scans_asked) {
      scans_answered++;
      c->DiskScanned(ftrun::Status::Ok(), disk(), now);
    }
  }
  void Msg(PeerId from, ClusterMsg t, const std::string& p) {
    c->OnMessage(from, static_cast<uint16_t>(t), p, now);
    AnswerScans();
  }
  void Down(PeerId peer) {
    c->OnPeerDown(peer, "gone", now);
    AnswerScans();
  }
  // Every node saves `v` and its holder (the next node) keeps a copy.
  void SaveEverywhere(uint64_t v, uint64_t epoch) {
    for (int a = 0; a < 3; ++a) {
      Msg(static_cast<PeerId>(a), ClusterMsg::kHeld, HeldMsg(epoch, {{a, v}}));
      Msg(static_cast<PeerId>((a + 1) % 3), ClusterMsg::kHeld, HeldMsg(epoch, {{a, v}}));
    }
  }
};

TEST_CASE("coordinator: its options come from the config, with the config's defaults") {
  Coordinator::Options d;
  CHECK(d.heartbeat_interval == ClusterConfig{}.heartbeat_interval);
  CHECK(d.heartbeat_misses == ClusterConfig{}.heartbeat_misses);
  CHECK(d.lost_node_timeout == ClusterConfig{}.lost_node_timeout);
  CHECK(d.max_restarts == JobConfig{}.max_restarts);
  Config c;
  c.cluster.replicas = 0;
  c.cluster.erasure.data = 4;
  c.cluster.erasure.parity = 2;
  c.cluster.heartbeat_interval = std::chrono::milliseconds(321);
  c.cluster.heartbeat_misses = 7;
  c.cluster.lost_node_timeout = std::chrono::milliseconds(4321);
  c.cluster.copy_timeout = std::chrono::milliseconds(987);
  c.job.max_restarts = 11;
  Coordinator::Options o = Coordinator::Options::FromConfig(c);
  CHECK(o.replicas == 0);
  CHECK(o.erasure_data == 4);
  CHECK(o.erasure_parity == 2);
  CHECK(o.heartbeat_interval.count() == 321);
  CHECK(o.heartbeat_misses == 7);
  CHECK(o.lost_node_timeout.count() == 4321);
  CHECK(o.copy_timeout.count() == 987);
  CHECK(o.max_restarts == 11);
}

TEST_CASE("coordinator: starts once every node registered, commits only at full redundancy") {
  Fixture f(0);
  for (PeerId a = 0; a < 3; ++a) REQUIRE(f.out.Count(a, ClusterMsg::kStart) == 1);
  // Every rank held once: not committed (replicas 1 needs 2 copies).
  for (int a = 0; a < 3; ++a) f.Msg(static_cast<PeerId>(a), ClusterMsg::kHeld, HeldMsg(0, {{a, 5}}));
  REQUIRE(!f.c->committed());
  f.SaveEverywhere(5, 0);
  REQUIRE(f.c->committed() == 5u);
  REQUIRE(f.out.Count(2, ClusterMsg::kCommit) == 1);
  // A report from a stopped epoch never counts.
  f.Msg(0, ClusterMsg::kHeld, HeldMsg(7, {{0, 6}}));
  REQUIRE(f.c->committed() == 5u);
}

TEST_CASE("coordinator: its status counts commits and held reports, and the lag from the last save to the commit",
          "[coordinator][status]") {
  Fixture f(0);
  for (int a = 0; a < 3; ++a) f.Msg(static_cast<PeerId>(a), ClusterMsg::kHeld, HeldMsg(0, {{a, 5}}));
  f.now += milliseconds(40);  // every rank saved 5; the copies land 40 ms later
  for (int a = 0; a < 3; ++a) f.Msg(static_cast<PeerId>((a + 1) % 3), ClusterMsg::kHeld, HeldMsg(0, {{a, 5}}));
  REQUIRE(f.c->committed() == 5u);
  const CoordinatorView v = f.c->View();
  CHECK(v.commits == 1);
  CHECK(v.held_reports == 6);
  REQUIRE(v.last_commit_lag_ms);
  CHECK(*v.last_commit_lag_ms == Approx(40.0));
  const auto j = StatusJson(v);
  CHECK(j["commits"] == 1);
  CHECK(j["held_reports"] == 6);
  CHECK(j["last_commit_lag_ms"].get<double>() == Approx(40.0));
}

TEST_CASE("coordinator: a lost node is replaced by a spare that pulls from the holders, then all restart") {
  Fixture f(1);
  f.SaveEverywhere(3, 0);
  REQUIRE(f.c->committed() == 3u);
  f.c->OnPeerDown(1, "endpoint error", f.now);
  REQUIRE(f.c->epoch() == 1);
  REQUIRE(f.out.Count(0, ClusterMsg::kHalt) == 1);
  REQUIRE(f.out.Count(3, ClusterMsg::kAssign) == 1);
  PullMsg pull;
  REQUIRE(Decode(f.out.Last(3, ClusterMsg::kPull), &pull).ok());
  REQUIRE(pull.version == 3);
  REQUIRE(pull.ranks.size() == 1);
  REQUIRE(pull.ranks[0].first == 1);
  REQUIRE(pull.ranks[0].second == std::vector<uint32_t>{2});  // node 2 held node 1's copy
  // Nobody starts before every node halted and the spare is ready.
  f.Msg(0, ClusterMsg::kHalted, EncodeU64(1));
  f.Msg(2, ClusterMsg::kHalted, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);
  f.store = "10.0.0.9:41234";  // the runner's store came up meanwhile: the start names it
  f.Msg(3, ClusterMsg::kReady, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 2);
  StartMsg start;
  REQUIRE(Decode(f.out.Last(3, ClusterMsg::kStart), &start).ok());
  REQUIRE(start.version == 3u);
  REQUIRE(start.epoch == 1);
  REQUIRE(start.store == "10.0.0.9:41234");
}

TEST_CASE("coordinator: losing more nodes than the replicas cover stops the job naming the ranks") {
  Fixture f(1);
  f.SaveEverywhere(4, 0);
  f.c->OnPeerDown(1, "gone", f.now);
  f.c->OnPeerDown(2, "gone", f.now);  // node 2 held node 1's only copy
  REQUIRE(f.c->done());
  REQUIRE(f.c->exit_code() != 0);
  INFO(f.c->exit_message());
  REQUIRE(f.c->exit_message().find("ranks 1") != std::string::npos);
  REQUIRE(f.c->exit_message().find("cluster.replicas") != std::string::npos);
}

TEST_CASE("coordinator: missed heartbeats make a node lost; with no spare the job waits, then gives up") {
  Fixture f(0);
  f.SaveEverywhere(2, 0);
  for (int i = 0; i < 5; ++i) {
    f.now += milliseconds(100);
    f.Msg(0, ClusterMsg::kHeartbeat, EncodeU64(0));
    f.Msg(1, ClusterMsg::kHeartbeat, EncodeU64(0));
    f.c->Tick(f.now);
  }
  REQUIRE(f.c->epoch() == 1);  // node 2 went silent
  REQUIRE(std::find(f.out.disconnected.begin(), f.out.disconnected.end(), 2u) != f.out.disconnected.end());
  REQUIRE(!f.c->done());
  for (int i = 0; i < 25; ++i) {
    f.now += milliseconds(100);
    f.Msg(0, ClusterMsg::kHeartbeat, EncodeU64(1));
    f.Msg(1, ClusterMsg::kHeartbeat, EncodeU64(1));
    f.c->Tick(f.now);
  }
  REQUIRE(f.c->done());
  REQUIRE(f.c->exit_message().find("cluster.lost_node_timeout") != std::string::npos);
}

TEST_CASE("coordinator: a node's agent that comes back is fenced if a spare took its place") {
  Fixture f(1);
  f.SaveEverywhere(1, 0);
  f.c->OnPeerDown(0, "partitioned", f.now);
  REQUIRE(f.out.Count(3, ClusterMsg::kAssign) == 1);
  RegisterMsg m;
  m.slot = 0;
  m.address = "127.0.0.1:5000";
  f.Msg(0, ClusterMsg::kRegister, Encode(m));
  REQUIRE(f.out.Count(0, ClusterMsg::kFenced) == 1);
}

TEST_CASE("coordinator: a restarted coordinator re-learns the committed version from the agents") {
  Recorder out;
  Coordinator::Options o;
  o.ranks_per_slot = {1, 1};
  Coordinator c(o, &out);
  for (int a = 0; a < 2; ++a) {
    RegisterMsg m;
    m.slot = a;
    m.address = "127.0.0.1:1";
    m.epoch = 4;
    m.committed = 9;
    m.catalog = {{a, 9}, {1 - a, 9}};
    c.OnMessage(static_cast<PeerId>(a), static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m), Time{});
  }
  REQUIRE(c.committed() == 9u);
  StartMsg start;
  REQUIRE(Decode(out.Last(1, ClusterMsg::kStart), &start).ok());
  REQUIRE(start.version == 9u);
  REQUIRE(start.epoch == 5u);  // a restart of the fenced ranks: never their epoch again
}

TEST_CASE("coordinator: a fresh job starts in epoch 0, an adopted one whose ranks ran in epoch 0 in epoch 1") {
  for (bool ran : {false, true}) {
    Recorder out;
    Coordinator::Options o;
    o.ranks_per_slot = {1, 1};
    Coordinator c(o, &out);
    for (int a = 0; a < 2; ++a) {
      RegisterMsg m;
      m.slot = a;
      m.address = "127.0.0.1:1";
      m.epoch = 0;
      if (ran) m.catalog = {{a, 3}};
      c.OnMessage(static_cast<PeerId>(a), static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m), Time{});
    }
    StartMsg start;
    REQUIRE(Decode(out.Last(0, ClusterMsg::kStart), &start).ok());
    REQUIRE(start.epoch == (ran ? 1u : 0u));
  }
}

}  // namespace
}  // namespace ftrun

namespace ftrun {
namespace {

TEST_CASE("coordinator: a replacement whose every holder failed stops the job naming the ranks without a copy") {
  Fixture f(1);
  f.SaveEverywhere(6, 0);
  f.c->OnPeerDown(1, "gone", f.now);
  REQUIRE(f.out.Count(3, ClusterMsg::kPull) == 1);
  // Node 2, the only holder of rank 1, dies before the coordinator hears of
  // it: the spare's pull fails first.
  ByteWriter w;
  w.Put<uint64_t>(1);
  w.Put<int32_t>(1);
  w.Put<uint64_t>(6);
  w.PutString("agent 2 is down");
  f.Msg(3, ClusterMsg::kPullFailed, w.data());
  REQUIRE(f.c->done());
  INFO(f.c->exit_message());
  REQUIRE(f.c->exit_message().find("ranks 1 have no complete copy") != std::string::npos);
  REQUIRE(f.c->exit_message().find("agent 2 is down") != std::string::npos);
}

std::string RankFailedMsg(uint64_t epoch, bool early = false, int32_t code = 1) {
  ByteWriter w;
  w.Put<uint64_t>(epoch);
  w.Put<int32_t>(code);
  w.PutString("rank 1 exited with code " + std::to_string(code));
  w.Put<uint8_t>(early ? 1 : 0);
  return w.data();
}

// Brings every node of `f` through the halt of `epoch` back to running.
void Restart(Fixture& f, uint64_t epoch) {
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(epoch));
}

TEST_CASE("coordinator: the same failure before the first save in two epochs in a row stops the job",
          "[coordinator][early]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(0, true, 2));  // argparse: exit code 2
  REQUIRE(f.c->epoch() == 1);
  Restart(f, 1);
  f.Msg(0, ClusterMsg::kRankFailed, RankFailedMsg(1, true, 2));  // again, another rank first
  REQUIRE(f.c->done());
  REQUIRE(f.c->exit_code() == 2);
  REQUIRE(f.c->exit_message().find("two epochs in a row") != std::string::npos);
}

TEST_CASE("coordinator: early failures with other codes, or a step between them, still restart",
          "[coordinator][early]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(0, false, 2));  // after a save
  Restart(f, 1);
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(1, true, 2));  // the first early one
  REQUIRE(!f.c->done());
  Restart(f, 2);
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(2, true, 1));  // early, another code
  REQUIRE(!f.c->done());
  REQUIRE(f.c->epoch() == 3);
  // A malformed report (no early flag) is refused, not taken as a failure.
  Restart(f, 3);
  ByteWriter w;
  w.Put<uint64_t>(3);
  w.Put<int32_t>(2);
  f.Msg(1, ClusterMsg::kRankFailed, w.data());
  REQUIRE(f.c->epoch() == 3);
  REQUIRE(!f.c->done());
}

TEST_CASE("coordinator: a node that dropped a corrupted copy pulls it from its holder before the restart",
          "[coordinator][corrupt]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  REQUIRE(f.c->committed() == 3u);
  // Node 1's copy of rank 1 had a corrupted chunk: dropped, then the rank fails.
  f.Msg(1, ClusterMsg::kDropped, DroppedMsg(0, {{1, 3}}));
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(0));
  REQUIRE(f.c->epoch() == 1);
  REQUIRE(f.out.Count(0, ClusterMsg::kPull) == 0);
  PullMsg pull;
  REQUIRE(Decode(f.out.Last(1, ClusterMsg::kPull), &pull).ok());
  REQUIRE(pull.version == 3);
  REQUIRE(pull.ranks.size() == 1);
  REQUIRE(pull.ranks[0].first == 1);
  REQUIRE(pull.ranks[0].second == std::vector<uint32_t>{2});
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);  // not before the pull
  f.Msg(1, ClusterMsg::kHeld, HeldMsg(1, {{1, 3}}));
  f.Msg(1, ClusterMsg::kReady, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 2);
  StartMsg start;
  REQUIRE(Decode(f.out.Last(1, ClusterMsg::kStart), &start).ok());
  REQUIRE(start.version == 3u);
}

TEST_CASE("coordinator: a copy dropped while a restart is planned is pulled before the start",
          "[coordinator][corrupt]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  f.Msg(0, ClusterMsg::kRankFailed, RankFailedMsg(0));  // another node's rank failed first
  REQUIRE(f.out.Count(1, ClusterMsg::kPull) == 0);
  f.Msg(1, ClusterMsg::kDropped, DroppedMsg(1, {{1, 3}}));  // found while its ranks stopped
  PullMsg pull;
  REQUIRE(Decode(f.out.Last(1, ClusterMsg::kPull), &pull).ok());
  REQUIRE(pull.ranks.size() == 1);
  REQUIRE(pull.ranks[0].second == std::vector<uint32_t>{2});
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);
  f.Msg(1, ClusterMsg::kReady, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 2);
}

TEST_CASE("coordinator: when every copy of a shard was dropped as corrupted the job stops naming the rank",
          "[coordinator][corrupt]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  f.Msg(2, ClusterMsg::kDropped, DroppedMsg(0, {{1, 3}}, "rank 1 tensor 'w' chunk #2 of version 3 is corrupted"));
  f.Msg(1, ClusterMsg::kDropped, DroppedMsg(0, {{1, 3}}));  // and the node's own
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(0));
  REQUIRE(f.c->done());
  INFO(f.c->exit_message());
  REQUIRE(f.c->exit_message().find("ranks 1 have no complete copy of committed version 3") != std::string::npos);
  // The error names the chunk whose corruption took the last copy.
  REQUIRE(f.c->exit_message().find("cannot restart: rank 1 tensor 'w' chunk #2 of version 3 is corrupted") == 0);
}

TEST_CASE("coordinator: ranks far apart: after a failed round the target is the fastest rank's newest version",
          "[coordinator][stall]") {
  Fixture f(0);
  auto replicate_version = [&](PeerId to) {
    const std::string payload = f.out.Last(to, ClusterMsg::kReplicate);
    ByteReader r(payload);
    uint64_t epoch = r.Get<uint64_t>();
    uint64_t v = r.Get<uint64_t>();
    CHECK(epoch == 0);
    return v;
  };
  // Rank 0 runs ahead (its agent keeps only its newest saves); ranks 1 and 2 are at 10.
  for (uint64_t v = 10; v <= 20; ++v) f.Msg(0, ClusterMsg::kHeld, HeldMsg(0, {{0, v}}));
  f.Msg(1, ClusterMsg::kHeld, HeldMsg(0, {{1, 10}}));
  f.Msg(2, ClusterMsg::kHeld, HeldMsg(0, {{2, 10}}));
  REQUIRE(f.out.Count(0, ClusterMsg::kReplicate) == 1);
  CHECK(replicate_version(0) == 10);  // the newest version every rank holds
  // Agent 0 released rank 0's version 10 already: the round fails.
  ByteWriter w;
  w.Put<uint64_t>(0);
  w.Put<uint64_t>(10);
  f.Msg(0, ClusterMsg::kRoundFailed, w.data());
  REQUIRE(f.out.Count(0, ClusterMsg::kReplicate) == 2);
  CHECK(replicate_version(1) == 20);  // the slower ranks copy it when they reach it
  // A slower rank saving an older version changes nothing while the round runs.
  f.Msg(1, ClusterMsg::kHeld, HeldMsg(0, {{1, 11}}));
  CHECK(f.out.Count(1, ClusterMsg::kReplicate) == 2);
  f.SaveEverywhere(20, 0);
  CHECK(f.c->committed() == 20u);
}

TEST_CASE("coordinator: a round that hears of no copy for 3 x copy_timeout gives way to a newer version on Tick",
          "[coordinator][stall]") {
  Fixture f(0);
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHeld, HeldMsg(0, {{static_cast<int>(a), 5}}));
  REQUIRE(f.out.Count(0, ClusterMsg::kReplicate) == 1);  // the round of version 5
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHeld, HeldMsg(0, {{static_cast<int>(a), 6}}));
  auto wait = [&](int ms) {  // time passes, every agent alive
    for (int t = 0; t < ms; t += 100) {
      f.now += milliseconds(100);
      for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHeartbeat, EncodeU64(0));
      f.c->Tick(f.now);
    }
  };
  wait(1000);
  f.Msg(1, ClusterMsg::kHeld, HeldMsg(0, {{0, 5}}));  // one copy of 5 lands: progress
  wait(14000);                                        // 14 s since: within 3 x copy_timeout (5 s)
  CHECK(f.out.Count(0, ClusterMsg::kReplicate) == 1);
  wait(1100);  // 15 s with no copy of 5 held: the round gives way
  REQUIRE(f.out.Count(0, ClusterMsg::kReplicate) == 2);
  const std::string payload = f.out.Last(0, ClusterMsg::kReplicate);
  ByteReader r(payload);
  r.Get<uint64_t>();
  CHECK(r.Get<uint64_t>() == 6u);
}

TEST_CASE("coordinator: a node told to start without its ranks' committed copy pulls it; lacking it again stops",
          "[coordinator][missing]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  REQUIRE(f.c->committed() == 3u);
  // Rank 1 fails; node 1 was counted as holding its own copy of version 3.
  f.Msg(1, ClusterMsg::kRankFailed, RankFailedMsg(0));
  REQUIRE(f.c->epoch() == 1);
  REQUIRE(f.out.Count(1, ClusterMsg::kPull) == 0);
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(1));
  REQUIRE(f.out.Count(1, ClusterMsg::kStart) == 2);
  // Told to start, node 1 finds it lacks that copy: a stale report changes
  // nothing but the count of copies; this epoch's starts a recovery in
  // which node 1 pulls it from its holder.
  f.Msg(1, ClusterMsg::kMissing, HeldMsg(0, {{1, 3}}));
  REQUIRE(f.c->epoch() == 1);
  f.Msg(1, ClusterMsg::kMissing, HeldMsg(1, {{1, 3}}));
  REQUIRE(f.c->epoch() == 2);
  REQUIRE(!f.c->done());
  PullMsg pull;
  REQUIRE(Decode(f.out.Last(1, ClusterMsg::kPull), &pull).ok());
  REQUIRE(pull.version == 3);
  REQUIRE(pull.ranks.size() == 1);
  REQUIRE(pull.ranks[0].first == 1);
  REQUIRE(pull.ranks[0].second == std::vector<uint32_t>{2});
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(2));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 2);  // not before the pull
  f.Msg(1, ClusterMsg::kHeld, HeldMsg(2, {{1, 3}}));
  f.Msg(1, ClusterMsg::kReady, EncodeU64(2));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 3);
  // Lacking it again after the pull: the job stops with an error, never a loop.
  f.Msg(1, ClusterMsg::kMissing, HeldMsg(2, {{1, 3}}));
  REQUIRE(f.c->done());
  REQUIRE(f.c->exit_code() == 1);
  INFO(f.c->exit_message());
  CHECK(f.c->exit_message().find("node 1 (agent 1) has no copy of rank(s) 1 of committed version 3") !=
        std::string::npos);
  CHECK(f.c->exit_message().find("again after pulling it") != std::string::npos);
}

TEST_CASE("coordinator: a node lacking a copy no other node holds goes back to the disk or stops",
          "[coordinator][missing]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  f.Msg(2, ClusterMsg::kDropped, DroppedMsg(0, {{1, 3}}));  // the holder's copy went
  f.Msg(0, ClusterMsg::kRankFailed, RankFailedMsg(0));
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(1));
  REQUIRE(f.out.Count(1, ClusterMsg::kStart) == 2);
  f.Msg(1, ClusterMsg::kMissing, HeldMsg(1, {{1, 3}}));
  REQUIRE(f.c->done());
  INFO(f.c->exit_message());
  CHECK(f.c->exit_message().find("ranks 1 have no complete copy of committed version 3") != std::string::npos);
}

}  // namespace
}  // namespace ftrun

namespace ftrun {
namespace {

PullMsg LastPull(const Fixture& f, PeerId to) {
  PullMsg p;
  REQUIRE(Decode(f.out.Last(to, ClusterMsg::kPull), &p).ok());
  return p;
}

size_t IndexOf(const Recorder& out, PeerId to, ClusterMsg type) {
  for (size_t i = 0; i < out.sent.size(); ++i) {
    if (std::get<0>(out.sent[i]) == to && std::get<1>(out.sent[i]) == type) return i;
  }
  return out.sent.size();
}

std::string DiskFailedMsg(uint64_t epoch, uint64_t version) {
  ByteWriter w;
  w.Put<uint64_t>(epoch);
  w.Put<uint64_t>(version);
  w.PutString("node 1 cannot restore version 5 from disk: chunk file 'x': its bytes hash to y");
  return w.data();
}

TEST_CASE("coordinator: a version given up on disk is kept there until a newer version commits",
          "[coordinator][security]") {
  Fixture f(0, 1, [] { return std::vector<uint64_t>{5, 4}; });
  // A job started again: every node reads version 5 from disk.
  for (PeerId a = 0; a < 3; ++a) REQUIRE(LastPull(f, a).version == 5);
  f.Msg(1, ClusterMsg::kDiskFailed, DiskFailedMsg(0, 5));
  REQUIRE(!f.c->done());
  for (PeerId a = 0; a < 3; ++a) {
    PullMsg p = LastPull(f, a);
    CHECK(p.from_disk);
    CHECK(p.version == 4);
    CHECK(p.epoch == 1);
    // Nothing of version 5 is dropped at the go-back: the job has no newer version yet.
    CHECK(f.out.Count(a, ClusterMsg::kDropAbove) == 0);
  }
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(1));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);
  f.SaveEverywhere(5, 1);
  REQUIRE(f.c->committed() == 5u);
  // Now the old timeline's files above 4 go, before the commit is written.
  for (PeerId a = 0; a < 3; ++a) {
    REQUIRE(f.out.Count(a, ClusterMsg::kDropAbove) == 1);
    CHECK(f.out.Last(a, ClusterMsg::kDropAbove) == EncodeU64(4));
    CHECK(IndexOf(f.out, a, ClusterMsg::kDropAbove) < IndexOf(f.out, a, ClusterMsg::kCommit));
  }
  // Version 5 on disk is the new timeline's now: a later go-back may use it.
  f.Msg(0, ClusterMsg::kDropped, DroppedMsg(1, {{1, 5}}));
  f.Msg(1, ClusterMsg::kDropped, DroppedMsg(1, {{1, 5}}));
  f.Msg(2, ClusterMsg::kDropped, DroppedMsg(1, {{1, 5}}));
  f.Msg(0, ClusterMsg::kRankFailed, RankFailedMsg(1));
  REQUIRE(!f.c->done());
  CHECK(LastPull(f, 1).version == 5);
  CHECK(LastPull(f, 1).from_disk);
}

TEST_CASE("coordinator: a pull that fails when the disk covers it sends every node back to the disk",
          "[coordinator][security]") {
  Fixture f(1, 1, [] { return std::vector<uint64_t>{2}; });
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(0));  // restored 2 from disk
  f.SaveEverywhere(3, 0);
  REQUIRE(f.c->committed() == 3u);
  f.Down(1);
  REQUIRE(LastPull(f, 3).version == 3);
  ByteWriter w;
  w.Put<uint64_t>(1);
  w.Put<int32_t>(1);
  w.Put<uint64_t>(3);
  w.PutString("agent 2 is down");
  f.Msg(3, ClusterMsg::kPullFailed, w.data());
  INFO(f.c->exit_message());
  REQUIRE(!f.c->done());
  for (PeerId a : {0u, 2u, 3u}) {
    PullMsg p = LastPull(f, a);
    CHECK(p.from_disk);
    CHECK(p.version == 2);
  }
  const uint64_t e = f.c->epoch();
  for (PeerId a : {0u, 2u, 3u}) f.Msg(a, ClusterMsg::kHalted, EncodeU64(e));
  for (PeerId a : {0u, 2u, 3u}) f.Msg(a, ClusterMsg::kReady, EncodeU64(e));
  REQUIRE(f.out.Count(3, ClusterMsg::kStart) == 1);
  StartMsg start;
  REQUIRE(Decode(f.out.Last(3, ClusterMsg::kStart), &start).ok());
  CHECK(start.version == 2u);
}

TEST_CASE("coordinator: a node that halted before a disk re-plan counts as halted after it",
          "[coordinator][security]") {
  // Found by the chaos soak: a node lost, the job goes back to disk version
  // 5 in epoch 1, a node cannot read it and the job re-plans version 4 in
  // epoch 2; the nodes' kHalted of epoch 1 arrive after that. They still
  // count: the job starts once every node has read version 4.
  Fixture f(0, 1, [] { return std::vector<uint64_t>{5, 4}; });
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(0));  // restored 5 from disk
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);
  f.Msg(2, ClusterMsg::kRankFailed, RankFailedMsg(0));  // no copy of 5 in RAM: every node reads it again
  const uint64_t halted_in = 1;                         // the recovery's first epoch
  const uint64_t e1 = f.c->epoch();
  REQUIRE(LastPull(f, 0).from_disk);
  REQUIRE(LastPull(f, 0).epoch == e1);
  f.Msg(1, ClusterMsg::kDiskFailed, DiskFailedMsg(e1, 5));
  const uint64_t e2 = f.c->epoch();
  REQUIRE(e2 > e1);
  for (PeerId a = 0; a < 3; ++a) REQUIRE(LastPull(f, a).version == 4u);
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kHalted, EncodeU64(halted_in));
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(e1));  // the abandoned plan's: ignored
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 1);
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(e2));
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 2);
  StartMsg start;
  REQUIRE(Decode(f.out.Last(0, ClusterMsg::kStart), &start).ok());
  CHECK(start.version == 4u);
  CHECK(start.epoch == e2);
}

TEST_CASE("coordinator: it asks for a scan of the disk and goes on with the answer; nothing starts meanwhile",
          "[coordinator][security]") {
  Fixture f(2, 1, [] { return std::vector<uint64_t>{2}; });
  REQUIRE(f.scans_asked == 1);  // the job formed with nothing in RAM: version 2 from disk
  for (PeerId a = 0; a < 3; ++a) f.Msg(a, ClusterMsg::kReady, EncodeU64(0));
  f.SaveEverywhere(3, 0);
  REQUIRE(f.c->committed() == 3u);
  f.hold_scans = true;  // the disk worker is slow
  f.Down(1);
  f.Down(2);                    // node 2 held node 1's only copy: rank 1 has no live copy
  REQUIRE(f.scans_asked == 2);  // one scan for the recovery, however many losses
  const size_t sent = f.out.sent.size();
  for (int i = 0; i < 50; ++i) {  // longer than lost_node_timeout: heartbeats flow, nothing is decided
    f.now += milliseconds(100);
    for (PeerId a : {0u, 3u, 4u}) f.Msg(a, ClusterMsg::kHeartbeat, EncodeU64(f.c->epoch()));
    f.c->Tick(f.now);
  }
  for (size_t i = sent; i < f.out.sent.size(); ++i) {
    CHECK(std::get<1>(f.out.sent[i]) != ClusterMsg::kPull);
    CHECK(std::get<1>(f.out.sent[i]) != ClusterMsg::kStart);
  }
  CHECK(!f.c->done());
  f.hold_scans = false;
  f.AnswerScans();
  INFO(f.c->exit_message());
  REQUIRE(!f.c->done());
  for (PeerId a : {0u, 3u, 4u}) {  // node 0, and the spares in nodes 1 and 2's places, read version 2
    PullMsg p = LastPull(f, a);
    CHECK(p.from_disk);
    CHECK(p.version == 2u);
  }
}

TEST_CASE("coordinator: a message without its epoch is ignored, not read as epoch 0", "[coordinator][security]") {
  Fixture f(0, 1, [] { return std::vector<uint64_t>{5}; });
  REQUIRE(f.out.Count(0, ClusterMsg::kStart) == 0);  // every node reads 5 first
  f.Msg(0, ClusterMsg::kReady, EncodeU64(0));
  f.Msg(1, ClusterMsg::kReady, EncodeU64(0));
  f.Msg(2, ClusterMsg::kReady, "");                          // truncated
  f.Msg(2, ClusterMsg::kReady, std::string("\x00\x00", 2));  // short
  CHECK(f.out.Count(0, ClusterMsg::kStart) == 0);
  f.Msg(2, ClusterMsg::kReady, EncodeU64(0));
  CHECK(f.out.Count(0, ClusterMsg::kStart) == 1);
}

TEST_CASE("coordinator: a node's agent that registers again as a spare leaves the node", "[coordinator][security]") {
  Fixture f(0);
  f.SaveEverywhere(3, 0);
  RegisterMsg m;
  m.slot = -1;
  m.address = "127.0.0.1:5001";
  f.Msg(1, ClusterMsg::kRegister, Encode(m));
  nlohmann::json st = StatusJson(f.c->View());
  INFO(st.dump());
  // Never both a node's agent and a spare.
  for (const auto& n : st["nodes"]) {
    for (const auto& sp : st["spares"]) CHECK(n["agent"] != sp["agent"]);
  }
  CHECK(f.c->epoch() == 1);  // the node was left: a recovery
  CHECK(f.out.Count(0, ClusterMsg::kHalt) == 1);
}

}  // namespace
}  // namespace ftrun
