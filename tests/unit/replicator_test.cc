// The replicator between two stores over an in-process transport: a pull
// copies a (rank, version) with every chunk checked, a chunk corrupted in the
// source's shared memory is never sent in a pull and never kept by a holder.
#include "plugin/replication/replicator.h"

#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "tests/catch.h"
#include "tests/unit/fake_net.h"

namespace ftrun {
namespace {

constexpr uint64_t kBase = 4096;
constexpr uint64_t kData = 64 * 4096;

struct Node {
  Node(FakeNet* net, PeerId id)
      : arena(kBase + kData),
        store(kBase, kData, "x"),
        transport(net, id),
        replicator(&transport, &store, arena.data(), 4096, net->clock) {}
  std::vector<char> arena;
  SnapshotStore store;
  FakeTransport transport;
  Replicator replicator;
};

// Rank 0's `version` in `n`'s store: two chunks of 4 KiB, filled with
// `fill` and `fill` + 1.
Manifest Save(Node& n, uint64_t version = 1, char fill = 'a') {
  std::vector<uint64_t> offs;
  REQUIRE(n.store.Reserve(1, {4096, 4096}, &offs).ok());
  Manifest m;
  m.rank = 0;
  m.version = version;
  TensorManifest t;
  for (size_t i = 0; i < 2; ++i) {
    std::memset(n.arena.data() + offs[i], fill + static_cast<int>(i), 4096);
    ChunkRef c;
    c.hash = HashBytes(n.arena.data() + offs[i], 4096);
    c.length = 4096;
    c.offset = offs[i];
    t.chunks.push_back(c);
  }
  t.info = {"w", DType::kUInt8, {8192}, 8192, Device::kHost};
  m.tensors.push_back(t);
  REQUIRE(n.store.AddManifest(1, m).ok());
  n.store.ReleaseReservations(1);
  return m;
}

// A membership of one-rank nodes: (agent, slot) each, rank = slot;
// `held_slots`: the nodes whose copies the receiver keeps.
PeerRoles Roles(std::vector<std::pair<PeerId, int>> nodes, std::vector<int32_t> held_slots, uint64_t epoch = 0) {
  MembershipMsg m;
  m.epoch = epoch;
  for (auto [agent, slot] : nodes) m.members.push_back({agent, slot, "x", slot < 0 ? 0 : slot, slot < 0 ? 0 : 1});
  m.held_slots = std::move(held_slots);
  return PeerRoles(m);
}

void Run(std::vector<Node*> nodes) {
  for (bool busy = true; busy;) {
    busy = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (TransportEvent& e : nodes[i]->transport.Poll()) {
        busy = true;
        if (e.kind == TransportEvent::Kind::kMessage) nodes[i]->replicator.Handle(e.peer, e.type, e.payload);
        if (e.kind == TransportEvent::Kind::kBulkDone) nodes[i]->replicator.BulkDone(e.token, e.status);
      }
    }
  }
}

TEST_CASE("replicator: a pull copies a shard, and a chunk corrupted at the source is never sent",
          "[replicator][corrupt]") {
  FakeNet net;
  Node holder(&net, 1), puller(&net, 2);
  holder.replicator.SetRoles(Roles({{2, 0}, {1, 1}}, {0}));  // the puller runs rank 0's node now
  Manifest m = Save(holder);
  std::vector<std::tuple<uint64_t, int, uint64_t, Status>> pulled;
  puller.replicator.on_pulled = [&](uint64_t, PeerId, int rank, uint64_t version, const Status& s) {
    pulled.emplace_back(0, rank, version, s);
  };
  std::vector<ChunkHash> reported;
  holder.replicator.on_corrupt = [&](int rank, uint64_t version, const ChunkRef& c) {
    CHECK(rank == 0);
    CHECK(version == 1);
    reported.push_back(c.hash);
  };

  SECTION("good bytes arrive, checked") {
    puller.replicator.Pull(1, 0, 1);
    Run({&holder, &puller});
    REQUIRE(pulled.size() == 1);
    CHECK(std::get<3>(pulled[0]).ok());
    const Manifest* got = puller.store.Find(0, 1);
    REQUIRE(got != nullptr);
    for (const auto& c : got->tensors[0].chunks) CHECK(HashBytes(puller.arena.data() + c.offset, c.length) == c.hash);
    CHECK(reported.empty());
  }

  SECTION("a flipped bit in the holder's copy: reported there, not sent, and the pull fails cleanly") {
    holder.arena[m.tensors[0].chunks[1].offset + 100] ^= 4;
    puller.replicator.Pull(1, 0, 1);
    Run({&holder, &puller});
    REQUIRE(reported.size() == 1);
    CHECK(reported[0] == m.tensors[0].chunks[1].hash);
    REQUIRE(pulled.size() == 1);
    INFO(std::get<3>(pulled[0]).message());
    CHECK(!std::get<3>(pulled[0]).ok());
    CHECK(std::get<3>(pulled[0]).message().find("corrupted") != std::string::npos);
    CHECK(puller.store.Find(0, 1) == nullptr);
    CHECK(puller.store.Stats().used_bytes == 0);  // its reservations went with the failed copy
    CHECK(net.recvs.empty());
  }
}

TEST_CASE(
    "replicator: a routine copy is checked once, by its holder; a chunk corrupted at the source is refused "
    "there and named by the source",
    "[replicator][corrupt]") {
  FakeNet net;
  Node source(&net, 1), holder(&net, 2);
  source.replicator.SetHolders({2});
  holder.replicator.SetRoles(Roles({{1, 0}, {2, 1}}, {0}));
  Manifest m = Save(source);
  std::vector<uint64_t> stored;
  holder.replicator.on_stored = [&](int, uint64_t version) { stored.push_back(version); };
  std::vector<Status> failed;
  source.replicator.on_copy_failed = [&](int, uint64_t, const Status& s) { failed.push_back(s); };
  std::vector<ChunkHash> reported;
  source.replicator.on_corrupt = [&](int rank, uint64_t version, const ChunkRef& c) {
    CHECK(rank == 0);
    CHECK(version == 1);
    reported.push_back(c.hash);
  };

  SECTION("good bytes: stored, nothing reported") {
    source.replicator.Saved(0, 1);
    Run({&source, &holder});
    CHECK(stored == std::vector<uint64_t>{1});
    CHECK(failed.empty());
    CHECK(reported.empty());
    REQUIRE(holder.store.Find(0, 1) != nullptr);
  }
  SECTION("a flipped bit at the source: the holder keeps nothing, the source names the chunk") {
    source.arena[m.tensors[0].chunks[1].offset + 7] ^= 1;
    source.replicator.Saved(0, 1);
    Run({&source, &holder});
    CHECK(stored.empty());
    CHECK(holder.store.Find(0, 1) == nullptr);
    CHECK(holder.store.Stats().used_bytes == 0);
    REQUIRE(reported.size() == 1);
    CHECK(reported[0] == m.tensors[0].chunks[1].hash);
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].code() == Code::kCorruption);
    CHECK(failed[0].message().find("the holder refused the copy") != std::string::npos);
  }
}

TEST_CASE("replicator: a copy that stalls is cancelled on both sides, and the next version goes in full",
          "[replicator][stall]") {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  FakeNet net;
  Node source(&net, 1), holder(&net, 2);
  source.replicator.SetHolders({2});
  holder.replicator.SetRoles(Roles({{1, 0}, {2, 1}}, {0}));
  source.replicator.SetCopyTimeout(milliseconds(1000));
  holder.replicator.SetCopyTimeout(milliseconds(1000));
  std::vector<std::pair<uint64_t, Status>> failed;
  source.replicator.on_copy_failed = [&](int, uint64_t version, const Status& s) { failed.emplace_back(version, s); };
  std::vector<uint64_t> stored;
  holder.replicator.on_stored = [&](int, uint64_t version) { stored.push_back(version); };
  std::vector<std::pair<PeerId, PeerId>> stalled;  // (who, peer)
  source.replicator.on_stalled = [&](PeerId p) { stalled.emplace_back(1, p); };
  holder.replicator.on_stalled = [&](PeerId p) { stalled.emplace_back(2, p); };

  Save(source, 1, 'a');
  net.swallow_bulk = true;  // version 1's chunks never land, and no error ever comes
  source.replicator.Saved(0, 1);
  Run({&source, &holder});
  REQUIRE(net.recvs.size() == 2);  // the holder waits for both chunks
  CHECK(holder.store.Stats().reserved_bytes == 8192);
  const auto t0 = net.clock.Now();
  source.replicator.Tick(t0);  // within the bound: nothing happens
  holder.replicator.Tick(t0);
  Run({&source, &holder});
  CHECK(failed.empty());
  CHECK(stalled.empty());

  SECTION("the source gives up first: it tells the holder, which lets its receives and reservations go") {
    source.replicator.Tick(t0 + seconds(2));
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].first == 1);
    CHECK(failed[0].second.code() == Code::kTimeout);
    CHECK(failed[0].second.message().find("cluster.copy_timeout") != std::string::npos);
    REQUIRE(stalled.size() == 1);
    CHECK(stalled[0] == std::make_pair(PeerId{1}, PeerId{2}));
    Run({&source, &holder});
  }
  SECTION("the holder gives up first: it cancels its receives and refuses the copy") {
    holder.replicator.Tick(t0 + seconds(2));
    REQUIRE(stalled.size() == 1);
    CHECK(stalled[0] == std::make_pair(PeerId{2}, PeerId{1}));
    Run({&source, &holder});
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].first == 1);
    CHECK(failed[0].second.message().find("refused") != std::string::npos);
  }
  CHECK(net.recvs.empty());
  CHECK(holder.store.Find(0, 1) == nullptr);
  CHECK(holder.store.Stats().reserved_bytes == 0);
  CHECK(stored.empty());

  // The link works again: the next version goes, with every chunk the
  // holder lacks (all of them: version 1 never arrived).
  net.swallow_bulk = false;
  Save(source, 2, 'p');
  source.replicator.Saved(0, 2);
  Run({&source, &holder});
  REQUIRE(stored == std::vector<uint64_t>{2});
  const Manifest* got = holder.store.Find(0, 2);
  REQUIRE(got != nullptr);
  for (const auto& c : got->tensors[0].chunks) CHECK(HashBytes(holder.arena.data() + c.offset, c.length) == c.hash);
  REQUIRE(!source.replicator.history().empty());
  CHECK(source.replicator.history().back().version == 2);
  CHECK(source.replicator.history().back().bytes_sent == 8192);
  CHECK(failed.size() == 1);
}

TEST_CASE("replicator: copies and pulls only from the peers the membership names for that role",
          "[replicator][security]") {
  using std::chrono::seconds;
  FakeNet net;
  // Agent 1 runs node 0 (rank 0); agent 2 runs node 1 and keeps node 0's
  // copies; agent 3 is a spare; agent 4 is not a member (fenced).
  Node source(&net, 1), holder(&net, 2), spare(&net, 3), outsider(&net, 4);
  const PeerRoles roles = Roles({{1, 0}, {2, 1}, {3, -1}}, {0});
  holder.replicator.SetRoles(roles);
  std::vector<std::pair<uint64_t, Status>> failed;
  auto on_failed = [&](int, uint64_t version, const Status& s) { failed.emplace_back(version, s); };
  std::vector<uint64_t> stored;
  holder.replicator.on_stored = [&](int, uint64_t version) { stored.push_back(version); };
  std::vector<Status> pulled;
  auto on_pulled = [&](uint64_t, PeerId, int, uint64_t, const Status& s) { pulled.push_back(s); };

  SECTION("routine copies") {
    for (Node* n : {&outsider, &spare, &source}) {
      n->replicator.SetHolders({2});
      n->replicator.on_copy_failed = on_failed;
    }
    Save(outsider, 1, 'x');
    outsider.replicator.Saved(0, 1);  // not a member
    Save(spare, 2, 'y');
    spare.replicator.Saved(0, 2);  // a spare runs no ranks
    Run({&outsider, &spare, &holder});
    REQUIRE(failed.size() == 2);
    CHECK(failed[0].second.message().find("not a member") != std::string::npos);
    CHECK(failed[1].second.message().find("spare") != std::string::npos);
    CHECK(stored.empty());
    CHECK(holder.store.Find(0, 1) == nullptr);
    CHECK(holder.store.Stats().used_bytes == 0);
    // The node's own agent, whose copies the holder keeps: stored.
    Save(source, 3, 'a');
    source.replicator.Saved(0, 3);
    Run({&source, &holder});
    CHECK(stored == std::vector<uint64_t>{3});
    // A holder that does not keep node 0's copies refuses them.
    holder.replicator.SetRoles(Roles({{1, 0}, {2, 1}}, {}));
    Save(source, 4, 'b');
    source.replicator.Saved(0, 4);
    Run({&source, &holder});
    REQUIRE(failed.size() == 3);
    CHECK(failed[2].second.message().find("does not keep") != std::string::npos);
  }
  SECTION("pulls") {
    Save(holder, 1, 'a');  // rank 0 version 1 in the holder's store
    outsider.replicator.on_pulled = on_pulled;
    spare.replicator.on_pulled = on_pulled;
    source.replicator.on_pulled = on_pulled;
    outsider.replicator.Pull(2, 0, 1);
    spare.replicator.Pull(2, 0, 1);
    Run({&outsider, &spare, &holder});
    REQUIRE(pulled.size() == 2);
    for (const Status& s : pulled) CHECK(s.message().find("pull refused") != std::string::npos);
    CHECK(outsider.store.Find(0, 1) == nullptr);
    CHECK(spare.store.Find(0, 1) == nullptr);
    // The node's own agent pulls its rank.
    source.replicator.Pull(2, 0, 1);
    Run({&source, &holder});
    REQUIRE(pulled.size() == 3);
    CHECK(pulled[2].ok());
    CHECK(source.store.Find(0, 1) != nullptr);
  }
  SECTION("a pull that arrives before the membership naming its puller waits for it") {
    Save(holder, 1, 'a');
    spare.replicator.on_pulled = on_pulled;
    spare.replicator.SetEpoch(1);  // it took over node 0 in epoch 1; the holder's membership is of epoch 0
    spare.replicator.Pull(2, 0, 1);
    Run({&spare, &holder});
    CHECK(pulled.empty());  // deferred
    holder.replicator.SetRoles(Roles({{1, -1}, {2, 1}, {3, 0}}, {0}, 1));
    Run({&spare, &holder});
    REQUIRE(pulled.size() == 1);
    CHECK(pulled[0].ok());
    CHECK(spare.store.Find(0, 1) != nullptr);
  }
  SECTION("a deferred pull no membership names is refused after a copy timeout") {
    outsider.replicator.on_pulled = on_pulled;
    outsider.replicator.SetEpoch(5);
    outsider.replicator.Pull(2, 0, 1);
    Run({&outsider, &holder});
    CHECK(pulled.empty());
    net.clock.Advance(seconds(60));
    holder.replicator.Tick(net.clock.Now());
    Run({&outsider, &holder});
    REQUIRE(pulled.size() == 1);
    CHECK(pulled[0].message().find("not a member") != std::string::npos);
  }
}

}  // namespace
}  // namespace ftrun
