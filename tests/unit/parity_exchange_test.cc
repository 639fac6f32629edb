// The parity exchange between the stores of an erasure-coded group over an
// in-process network: after each version every holder's rows equal a full
// Reed-Solomon encode of the members' shards (ranks of different sizes,
// chunks straddling slices); an incremental version sends only the changed
// chunks' deltas; a holder new to its rows gets whole fragments; a rebuild
// from the rows and the survivors' shards gives lost members back; and
// offers that are not the sender's to make, or that a corrupted chunk would
// poison, change nothing.
#include "plugin/erasure/parity_exchange.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "plugin/common/hash.h"
#include "tests/unit/fake_net.h"

namespace ftrun {
namespace {

constexpr uint64_t kArenaBase = 4096;
constexpr uint64_t kArenaData = 8 << 20;

struct Member {
  Member(FakeNet* net, PeerId id, const GroupCode* code)
      : arena(kArenaBase + kArenaData),
        store(kArenaBase, kArenaData, "x"),
        transport(net, id),
        exchange(&transport, &store, arena.data(), code) {}
  std::vector<char> arena;
  SnapshotStore store;
  FakeTransport transport;
  ParityExchange exchange;
  std::vector<int> ranks;
  std::vector<uint64_t> contributed, complete;
  std::vector<Status> failed;
};

// Rank `rank` saves `version` into m's store: a tensor of `bytes` bytes cut
// into chunks of `chunk` bytes. Chunk c's bytes come from `seed(c)`.
void SaveRank(Member& m, int rank, uint64_t version, uint64_t bytes, uint64_t chunk,
              const std::function<uint64_t(size_t)>& seed) {
  std::vector<uint64_t> lengths;
  for (uint64_t at = 0; at < bytes; at += chunk) lengths.push_back(std::min(chunk, bytes - at));
  std::vector<uint64_t> offs;
  REQUIRE(m.store.Reserve(1, lengths, &offs).ok());
  Manifest man;
  man.rank = rank;
  man.version = version;
  TensorManifest t;
  t.info = {"w", DType::kUInt8, {static_cast<int64_t>(bytes)}, bytes, Device::kHost};
  for (size_t c = 0; c < lengths.size(); ++c) {
    std::mt19937_64 rng(seed(c));
    char* p = m.arena.data() + offs[c];
    for (uint64_t i = 0; i < lengths[c]; ++i) p[i] = static_cast<char>(rng());
    t.chunks.push_back({HashBytes(p, lengths[c]), lengths[c], offs[c]});
  }
  man.tensors.push_back(t);
  Status s = m.store.AddManifest(1, std::move(man));
  INFO(s.message());
  REQUIRE(s.ok());
  m.store.ReleaseReservations(1);
}

// The member's shard at `version`: its ranks' bytes in order.
std::vector<uint8_t> Shard(Member& m, uint64_t version) {
  std::vector<uint8_t> out;
  for (int r : m.ranks) {
    const Manifest* man = m.store.Find(r, version);
    REQUIRE(man != nullptr);
    for (const auto& t : man->tensors)
      for (const auto& c : t.chunks)
        out.insert(out.end(), m.arena.data() + c.offset, m.arena.data() + c.offset + c.length);
  }
  return out;
}

struct Group {
  Group(int data, int parity, std::vector<std::vector<uint64_t>> rank_bytes, uint64_t chunk) : chunk(chunk) {
    REQUIRE(GroupCode::Create(data, parity, &code).ok());
    std::vector<PeerId> ids;
    int rank = 0;
    for (size_t i = 0; i < rank_bytes.size(); ++i) {
      ids.push_back(static_cast<PeerId>(10 + i));
      members.push_back(std::make_unique<Member>(&net, ids.back(), code.get()));
      for (uint64_t b : rank_bytes[i]) {
        members.back()->ranks.push_back(rank++);
        sizes.push_back(b);
      }
    }
    for (size_t i = 0; i < members.size(); ++i) Wire(i, ids);
  }
  void Wire(size_t i, const std::vector<PeerId>& ids) {
    Member* m = members[i].get();
    m->exchange.SetGroup(ids, static_cast<int>(i));
    m->exchange.on_contributed = [m](uint64_t v) { m->contributed.push_back(v); };
    m->exchange.on_complete = [m](uint64_t v) { m->complete.push_back(v); };
    m->exchange.on_failed = [m](uint64_t, const Status& s) { m->failed.push_back(s); };
  }
  // Every rank saves `version`; chunk c of rank r changes from the previous
  // version when changed(r, c).
  void Save(uint64_t version, const std::function<bool(int, size_t)>& changed) {
    for (auto& m : members) {
      for (int r : m->ranks) {
        SaveRank(*m, r, version, sizes[static_cast<size_t>(r)], chunk, [&, r](size_t c) {
          auto& last = seeds[{r, c}];
          if (last == 0 || changed(r, c)) last = version * 1000003 + static_cast<uint64_t>(r) * 1009 + c + 1;
          return last;
        });
      }
    }
  }
  void Contribute(uint64_t version, std::optional<uint64_t> base) {
    for (auto& m : members) {
      Status s = m->exchange.Contribute(version, base, m->ranks);
      INFO(s.message());
      REQUIRE(s.ok());
    }
    Run();
  }
  void Run() {
    for (bool busy = true; busy;) {
      busy = false;
      for (auto& m : members) {
        for (TransportEvent& e : m->transport.Poll()) {
          busy = true;
          if (e.kind == TransportEvent::Kind::kMessage) CHECK(m->exchange.Handle(e.peer, e.type, e.payload));
          if (e.kind == TransportEvent::Kind::kBulkDone) CHECK(m->exchange.BulkDone(e.token, e.status));
        }
      }
    }
  }
  // Every holder's rows at `version` equal ReedSolomon's own encode of the
  // members' slices (each its own slice length, zero-padded to the
  // stripe's longest).
  void CheckParity(uint64_t version) {
    const int d = code->data(), p = code->parity(), n = code->members();
    std::unique_ptr<ReedSolomon> rs;
    REQUIRE(ReedSolomon::Create(d, p, &rs).ok());
    std::vector<std::vector<uint8_t>> shards;
    for (auto& m : members) shards.push_back(Shard(*m, version));
    for (int j = 0; j < n; ++j) {
      const Stripe& s = code->stripes()[static_cast<size_t>(j)];
      uint64_t len = 0;
      for (const auto& f : s.data) len = std::max(len, NodeShardSlice(shards[static_cast<size_t>(f.member)].size()));
      std::vector<std::vector<uint8_t>> in(static_cast<size_t>(d), std::vector<uint8_t>(len, 0));
      for (int t = 0; t < d; ++t) {
        const auto& sh = shards[static_cast<size_t>(s.data[static_cast<size_t>(t)].member)];
        const uint64_t sl = NodeShardSlice(sh.size()), from = static_cast<uint64_t>(t) * sl;
        for (uint64_t i = 0; i < sl && from + i < sh.size(); ++i) in[static_cast<size_t>(t)][i] = sh[from + i];
      }
      std::vector<std::vector<uint8_t>> want(static_cast<size_t>(p), std::vector<uint8_t>(len));
      std::vector<const uint8_t*> ip;
      std::vector<uint8_t*> op;
      for (auto& b : in) ip.push_back(b.data());
      for (auto& b : want) op.push_back(b.data());
      rs->Encode(len, ip.data(), op.data());
      for (int row = 0; row < p; ++row) {
        Member& h = *members[static_cast<size_t>(s.parity[static_cast<size_t>(row)])];
        REQUIRE(h.exchange.rows().Complete(version));
        std::vector<uint8_t> got(len);
        REQUIRE(h.exchange.rows().Read(version, row, 0, len, got.data()).ok());
        INFO("stripe " << j << " row " << row);
        CHECK(got == want[static_cast<size_t>(row)]);
      }
    }
  }
  uint64_t NodeShardSlice(uint64_t size) const {
    const uint64_t d = static_cast<uint64_t>(code->data());
    return std::max<uint64_t>(1, (size + d - 1) / d);
  }

  FakeNet net;
  std::unique_ptr<GroupCode> code;
  std::vector<std::unique_ptr<Member>> members;
  std::vector<uint64_t> sizes;  // by rank
  uint64_t chunk;
  std::map<std::pair<int, size_t>, uint64_t> seeds;
};

uint64_t SentBytes(Group& g) {
  uint64_t n = 0;
  for (auto& m : g.members) n += m->exchange.stats().delta_bytes_sent;
  return n;
}

TEST_CASE("parity exchange: every version's parity equals a full encode, and an increment sends only its change",
          "[erasure][parity_exchange]") {
  // 4+2 with uneven ranks (two nodes of two ranks, one a short shard);
  // chunks of 3000 bytes straddle slice boundaries.
  Group g(4, 2, {{40000, 9000}, {50000}, {50000}, {12000}, {50000}, {30000, 20000}}, 3000);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  uint64_t state = 0;
  for (uint64_t b : g.sizes) state += b;
  for (auto& m : g.members) {
    CHECK(m->failed.empty());
    CHECK(m->contributed == std::vector<uint64_t>{1});
    CHECK(m->complete == std::vector<uint64_t>{1});
  }
  g.CheckParity(1);
  CHECK(SentBytes(g) == state * 2);  // the first version: every fragment whole, to both its holders

  // Version 2: about one chunk in ten changes.
  std::mt19937 rng(5);
  uint64_t changed = 0;
  g.Save(2, [&](int r, size_t c) {
    const bool ch = rng() % 10 == 0;
    if (ch) changed += std::min<uint64_t>(g.chunk, g.sizes[static_cast<size_t>(r)] - c * g.chunk);
    return ch;
  });
  REQUIRE(changed > 0);
  const uint64_t before = SentBytes(g);
  g.Contribute(2, 1);
  for (auto& m : g.members) {
    CHECK(m->failed.empty());
    CHECK(m->complete == std::vector<uint64_t>{1, 2});
  }
  g.CheckParity(2);
  CHECK(SentBytes(g) - before == changed * 2);
  g.CheckParity(1);  // the base stays intact (its blocks are shared, copied on write)
  for (auto& m : g.members) m->exchange.rows().Committed(2);
  CHECK(!g.members[0]->exchange.rows().Complete(1));

  SECTION("a member new to its rows (a replacement) gets whole fragments, and its rows come out right") {
    FakeNet& net = g.net;
    Member& old = *g.members[3];
    auto fresh = std::make_unique<Member>(&net, 10 + 3, g.code.get());
    fresh->ranks = old.ranks;
    // Its store holds its ranks' versions 2 (as a rebuild leaves it) and 3.
    for (int r : old.ranks) {
      const Manifest* m2 = old.store.Find(r, 2);
      std::vector<uint64_t> lengths, offs;
      for (const auto& c : m2->tensors[0].chunks) lengths.push_back(c.length);
      REQUIRE(fresh->store.Reserve(1, lengths, &offs).ok());
      Manifest copy = *m2;
      for (size_t c = 0; c < offs.size(); ++c) {
        std::memcpy(fresh->arena.data() + offs[c], old.arena.data() + copy.tensors[0].chunks[c].offset,
                    copy.tensors[0].chunks[c].length);
        copy.tensors[0].chunks[c].offset = offs[c];
      }
      REQUIRE(fresh->store.AddManifest(1, copy).ok());
      fresh->store.ReleaseReservations(1);
    }
    g.members[3] = std::move(fresh);
    std::vector<PeerId> ids;
    for (size_t i = 0; i < g.members.size(); ++i) ids.push_back(static_cast<PeerId>(10 + i));
    g.Wire(3, ids);
    g.Save(3, [&](int, size_t c) { return c % 7 == 0; });
    g.Contribute(3, 2);
    for (auto& m : g.members) {
      INFO(m->failed.size());
      CHECK(m->failed.empty());
      CHECK(m->contributed.back() == 3);
    }
    uint64_t restarts = 0;
    for (auto& m : g.members) restarts += m->exchange.stats().full_restarts;
    CHECK(restarts == 4 * 2);  // each of its two rows: four contributors start over whole
    g.CheckParity(3);
  }

  SECTION("a rebuild from the rows and the surviving shards gives two lost members back") {
    const std::vector<int> lost = {1, 4};
    const int n = g.code->members(), p = g.code->parity();
    std::vector<std::vector<uint8_t>> shards;
    uint64_t longest = 0;
    for (auto& m : g.members) {
      shards.push_back(Shard(*m, 2));
      longest = std::max<uint64_t>(longest, shards.back().size());
    }
    // GroupCode::Rebuild takes one slice for the group: members whose
    // slices are shorter are re-cut by a caller. Here every member's
    // fragment is padded into the group's slice by taking the longest.
    const uint64_t slice = g.NodeShardSlice(longest);
    std::vector<std::vector<uint8_t>> padded(static_cast<size_t>(n));
    std::vector<ConstBytes> alive(static_cast<size_t>(n));
    std::vector<std::vector<std::vector<uint8_t>>> held(static_cast<size_t>(n));
    std::vector<std::vector<const uint8_t*>> held_p(static_cast<size_t>(n));
    for (int m = 0; m < n; ++m) {
      const auto& sh = shards[static_cast<size_t>(m)];
      const uint64_t own = g.NodeShardSlice(sh.size());
      auto& pad = padded[static_cast<size_t>(m)];
      pad.assign(static_cast<size_t>(g.code->data()) * slice, 0);
      for (int t = 0; t < g.code->data(); ++t)
        for (uint64_t i = 0; i < own && t * own + i < sh.size(); ++i) pad[t * slice + i] = sh[t * own + i];
      if (std::find(lost.begin(), lost.end(), m) != lost.end()) continue;
      alive[static_cast<size_t>(m)] = {pad.data(), pad.size()};
      for (int row = 0; row < p; ++row) {
        held[static_cast<size_t>(m)].emplace_back(slice);
        REQUIRE(g.members[static_cast<size_t>(m)]
                    ->exchange.rows()
                    .Read(2, row, 0, slice, held[static_cast<size_t>(m)].back().data())
                    .ok());
        held_p[static_cast<size_t>(m)].push_back(held[static_cast<size_t>(m)].back().data());
      }
    }
    std::vector<std::vector<uint8_t>> out(lost.size(),
                                          std::vector<uint8_t>(static_cast<size_t>(g.code->data()) * slice));
    std::vector<std::vector<std::vector<uint8_t>>> out_par(
        lost.size(), std::vector<std::vector<uint8_t>>(static_cast<size_t>(p), std::vector<uint8_t>(slice)));
    std::vector<uint8_t*> op;
    std::vector<std::vector<uint8_t*>> opp(lost.size());
    for (size_t l = 0; l < lost.size(); ++l) {
      op.push_back(out[l].data());
      for (auto& b : out_par[l]) opp[l].push_back(b.data());
    }
    Status s = g.code->Rebuild(lost, alive, held_p, slice, op, opp);
    INFO(s.message());
    REQUIRE(s.ok());
    for (size_t l = 0; l < lost.size(); ++l) CHECK(out[l] == padded[static_cast<size_t>(lost[l])]);
  }
}

TEST_CASE("parity exchange: a 2+1 group, and a version with no change still completes", "[erasure][parity_exchange]") {
  Group g(2, 1, {{20000}, {7000}, {20000}}, 4096);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  g.CheckParity(1);
  const uint64_t before = SentBytes(g);
  g.Save(2, [](int, size_t) { return false; });
  g.Contribute(2, 1);
  for (auto& m : g.members) CHECK(m->complete == std::vector<uint64_t>{1, 2});
  CHECK(SentBytes(g) == before);
  g.CheckParity(2);
}

TEST_CASE("parity exchange: offers that are not the sender's, and a chunk corrupted at the source, change nothing",
          "[erasure][parity_exchange][security]") {
  Group g(2, 1, {{8192}, {8192}, {8192}}, 4096);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  g.CheckParity(1);
  Member& holder = *g.members[0];  // holds row 0 of stripe 0, whose fragments are members 1 and 2's
  std::vector<std::string> refused;
  auto offer = [&](PeerId from, ParityOfferMsg m) {
    m.xfer = 77;
    holder.exchange.Handle(from, static_cast<uint16_t>(ClusterMsg::kParityOffer), Encode(m));
    for (TransportEvent& e : g.net.events[from]) {
      if (e.type == static_cast<uint16_t>(ClusterMsg::kParityRefused)) {
        ParityRefusedMsg r;
        REQUIRE(Decode(e.payload, &r).ok());
        refused.push_back(r.message);
      }
    }
    g.net.events[from].clear();
  };
  ParityOfferMsg m;
  m.version = 2;
  m.base = 1;
  m.stripe = 0;
  m.fragment = 0;  // member 1's
  m.last = true;
  m.extents = {{0, 16}};
  offer(99, m);  // not a member
  offer(12, m);  // member 2 naming member 1's fragment
  m.stripe = 1;
  offer(11, m);  // a stripe whose row member 0 does not hold
  REQUIRE(refused.size() == 3);
  CHECK(refused[0].find("not a member") != std::string::npos);
  CHECK(refused[1].find("not the sender's") != std::string::npos);
  CHECK(refused[2].find("holds no row") != std::string::npos);
  CHECK(!holder.exchange.rows().Complete(2));
  CHECK(g.net.recvs.empty());

  // Malformed: extents that overlap, or add up past an offer's bound.
  m.extents = {{0, 16}, {8, 16}};
  ParityOfferMsg back;
  CHECK(!Decode(Encode(m), &back).ok());
  m.extents = {{0, ParityOfferMsg::kMaxBytes}, {ParityOfferMsg::kMaxBytes, 1}};
  CHECK(!Decode(Encode(m), &back).ok());

  // A chunk of member 1 corrupted in its memory after its save: its
  // contribution fails, naming the chunk; the rows it contributes to
  // (members 0's and 2's) never complete at version 2.
  g.Save(2, [](int, size_t c) { return c == 0; });
  Member& src = *g.members[1];
  const Manifest* bad = src.store.Find(src.ranks[0], 2);
  src.arena[bad->tensors[0].chunks[0].offset + 3] ^= 1;
  g.Contribute(2, 1);
  REQUIRE(src.failed.size() == 1);
  CHECK(src.failed[0].message().find(bad->tensors[0].chunks[0].hash.ToHex()) != std::string::npos);
  CHECK(!g.members[0]->exchange.rows().Complete(2));
  CHECK(!g.members[2]->exchange.rows().Complete(2));
}

}  // namespace
}  // namespace ftrun
