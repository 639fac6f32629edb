// The parity exchange between the stores of an erasure-coded group over an
// in-process network: after each version every holder's rows equal a full
// Reed-Solomon encode of the members' shards (ranks of different sizes,
// chunks straddling slices); an incremental version sends only the changed
// chunks' deltas; a holder new to its rows gets whole fragments; a rebuild
// from the rows and the survivors' shards gives lost members back; and
// offers that are not the sender's to make, or that a corrupted chunk would
// poison, change nothing; a holder whose store has no room left refuses the
// parity, naming the budget, and keeps the committed version's.
#include "plugin/erasure/parity_exchange.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "plugin/common/hash.h"
#include "tests/catch.h"
#include "tests/unit/erasure_group.h"

namespace ftrun {
namespace {

uint64_t SentBytes(Group& g) {
  uint64_t n = 0;
  for (auto& m : g.members) n += m->exchange.stats().delta_bytes_sent;
  return n;
}

// What the holder sent `to` in answer: the refusals' messages (of offers
// and of fragment requests) and the kParityWant count; taken off the net.
struct Answers {
  std::vector<std::string> refused;
  int wants = 0;
};
void TakeAnswers(Group& g, PeerId to, Answers* out) {
  for (TransportEvent& e : g.net.events[to]) {
    if (e.type == static_cast<uint16_t>(ClusterMsg::kParityRefused)) {
      ParityRefusedMsg r;
      REQUIRE(Decode(e.payload, &r).ok());
      out->refused.push_back(r.message);
    } else if (e.type == static_cast<uint16_t>(ClusterMsg::kFragmentRefused)) {
      FragmentRefusedMsg r;
      REQUIRE(Decode(e.payload, &r).ok());
      out->refused.push_back(r.message);
    } else if (e.type == static_cast<uint16_t>(ClusterMsg::kParityWant)) {
      out->wants++;
    }
  }
  g.net.events[to].clear();
}

// An offer of version 2 since version 1 for row 0 of stripe 0, naming
// fragment 0 (member 1's), of `bytes` bytes.
ParityOfferMsg OfferOfVersion2(uint64_t bytes) {
  ParityOfferMsg m;
  m.version = 2;
  m.base = 1;
  m.stripe = 0;
  m.fragment = 0;
  m.extents = {{0, bytes}};
  return m;
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

// Issue 33, finding 1: a new coordinator (etcd failover, --attach) starts
// the agents in a new epoch without halting them first. Version 2, half
// built when the leader died (member 0's deltas in, the others' not), is
// saved again by the new generation with other bytes: its deltas must not
// be added to the half-built rows (XOR: member 0's first deltas would stay
// in), whether they arrive before the holder's own start order or after.
TEST_CASE("parity exchange: a version half-built in an older epoch is built again, not added to",
          "[erasure][parity_exchange]") {
  const bool start_order_first = GENERATE(false, true);
  Group g(2, 1, {{20000}, {12000}, {20000}}, 4096);
  for (auto& m : g.members) m->exchange.SetEpoch(1);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  for (auto& m : g.members) m->exchange.Committed(1);
  const auto seeds_at_1 = g.seeds;
  g.Save(2, [](int, size_t c) { return c % 2 == 0; });
  REQUIRE(g.members[0]->exchange.Contribute(2, 1, g.members[0]->ranks).ok());
  g.Run();
  for (auto& m : g.members) CHECK(!m->exchange.rows().Complete(2));  // half built

  // Epoch 2 starts from version 1; the ranks save version 2 again, otherwise.
  for (auto& m : g.members) {
    m->store.DiscardAbove(1);
    if (start_order_first)
      m->exchange.StartsFrom(2, 1);
    else
      m->exchange.SetEpoch(2);  // the holders learn of the start only later
  }
  g.seeds = seeds_at_1;
  g.Save(2, [](int, size_t c) { return c % 3 == 0; });
  g.Contribute(2, 1);
  for (auto& m : g.members) {
    CHECK(m->failed.empty());
    CHECK(m->exchange.rows().EpochOf(2) == std::optional<uint64_t>(2));
  }
  g.CheckParity(2);
}

// Issue 33, finding 2: after going back to the disk's version 1, the
// abandoned timeline's complete version 2 is void on every holder, so that
// it can neither serve a rebuild nor be the base of the new timeline.
TEST_CASE("parity exchange: a start from an older version voids the parity an older epoch built above it",
          "[erasure][parity_exchange]") {
  Group g(2, 1, {{8192}, {8192}, {8192}}, 4096);
  for (auto& m : g.members) m->exchange.SetEpoch(1);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  g.Save(2, [](int, size_t c) { return c == 0; });
  g.Contribute(2, 1);
  for (auto& m : g.members) REQUIRE(m->exchange.rows().Complete(2));
  for (auto& m : g.members) {
    m->exchange.StartsFrom(3, 1);
    CHECK(m->exchange.rows().Complete(1));
    CHECK(!m->exchange.rows().Complete(2));
    CHECK(m->exchange.Manifests(2, 0) == nullptr);
  }
  // The new timeline's version 2 builds on version 1's parity, right.
  for (auto& m : g.members) m->store.DiscardAbove(1);
  g.Save(2, [](int, size_t c) { return c == 1; });
  g.Contribute(2, 1);
  for (auto& m : g.members) CHECK(m->failed.empty());
  g.CheckParity(2);
}

TEST_CASE("parity exchange: offers that are not the sender's, and a chunk corrupted at the source, change nothing",
          "[erasure][parity_exchange][security]") {
  Group g(2, 1, {{8192}, {8192}, {8192}}, 4096);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  g.CheckParity(1);
  Member& holder = *g.members[0];  // holds row 0 of stripe 0, whose fragments are members 1 and 2's
  Answers answers;
  const std::vector<std::string>& refused = answers.refused;
  auto offer = [&](PeerId from, ParityOfferMsg m) {
    m.xfer = 77;
    holder.exchange.Handle(from, static_cast<uint16_t>(ClusterMsg::kParityOffer), Encode(m));
    TakeAnswers(g, from, &answers);
  };
  ParityOfferMsg m = OfferOfVersion2(16);
  m.last = true;
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

// Issue 33, finding 6: what a group member can make another allocate is
// bounded before anything is allocated: offers in flight per sender (the
// holder posts a receive, of up to kOfferBytes, for each), and fragment
// requests (a survivor stages the bytes asked for).
TEST_CASE("parity exchange: a flood of offers and an oversize fragment request are refused before allocating",
          "[erasure][parity_exchange][security]") {
  Group g(2, 1, {{8192}, {8192}, {8192}}, 4096);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  Member& holder = *g.members[0];  // holds row 0 of stripe 0, whose fragments are members 1 and 2's
  Answers answers;
  std::vector<std::string>& refused = answers.refused;
  auto send = [&](PeerId from, ClusterMsg type, const std::string& payload) {
    const bool handled = holder.exchange.Handle(from, static_cast<uint16_t>(type), payload) ||
                         holder.server.Handle(from, static_cast<uint16_t>(type), payload, g.net.clock.Now());
    REQUIRE(handled);
    TakeAnswers(g, from, &answers);
  };
  ParityOfferMsg m = OfferOfVersion2(ParityOfferMsg::kMaxBytes);
  const int allowed = g.code->parity() * ParityExchange::kInflight;
  for (int i = 0; i < 50; ++i) {
    m.xfer = 100 + static_cast<uint64_t>(i);
    send(11, ClusterMsg::kParityOffer, Encode(m));
  }
  CHECK(answers.wants == allowed);  // a receive posted for each of those only
  CHECK(g.net.recvs.size() == static_cast<size_t>(allowed));
  REQUIRE(refused.size() == static_cast<size_t>(50 - allowed));
  CHECK(refused[0].find("parity offers in flight here already") != std::string::npos);

  // 64 GiB asked of a survivor: refused, nothing staged.
  refused.clear();
  FragmentRequestMsg r;
  r.xfer = 7;
  r.epoch = holder.exchange.epoch();
  r.version = 1;
  r.kind = FragmentRequestMsg::kParity;
  r.index = 0;
  r.length = 64ull << 30;
  r.tag = 9;
  send(12, ClusterMsg::kFragmentRequest, Encode(r));
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find("at most " + std::to_string(FragmentRequestMsg::kMaxLength)) != std::string::npos);

  // A fragment staged but never fetched: dropped after kPatience, and the requester told.
  refused.clear();
  r.length = 4096;
  send(12, ClusterMsg::kFragmentRequest, Encode(r));
  CHECK(refused.empty());
  holder.server.Tick(g.net.clock.Now() + FragmentServer::kPatience + std::chrono::seconds(1));
  send(12, ClusterMsg::kFragmentGo, Encode(FragmentGoMsg{7}));
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find("not fetched within") != std::string::npos);
}

TEST_CASE(
    "parity exchange: a holder whose store is full refuses the parity, naming the budget; the committed "
    "version's stays",
    "[erasure][parity_exchange]") {
  Group g(2, 1, {{20000}, {20000}, {20000}}, 3000);
  g.Save(1, [](int, size_t) { return true; });
  g.Contribute(1, std::nullopt);
  for (auto& m : g.members) m->exchange.Committed(1);
  g.Save(2, [](int, size_t c) { return c % 2 == 0; });
  // Then member 0's store full (another owner's reservations).
  Member& full = *g.members[0];
  std::vector<uint64_t> offs;
  while (full.store.Reserve(77, {4096}, &offs).ok()) {
  }
  CHECK(full.store.Stats().used_bytes == full.store.Stats().capacity_bytes);
  std::vector<uint8_t> before(6000);
  REQUIRE(full.exchange.rows().Read(1, 0, 0, before.size(), before.data()).ok());

  g.Contribute(2, 1);
  bool named = false;
  for (auto& m : g.members) {
    for (const Status& s : m->failed) {
      named = named || (s.message().find("snapshot store full") != std::string::npos &&
                        s.message().find("erasure parity") != std::string::npos);
    }
  }
  CHECK(named);
  CHECK_FALSE(full.exchange.rows().Complete(2));
  std::vector<uint8_t> after(before.size());
  REQUIRE(full.exchange.rows().Read(1, 0, 0, after.size(), after.data()).ok());
  CHECK(after == before);

  // Room again: the next version's parity goes through.
  full.store.ReleaseReservations(77);
  for (auto& m : g.members) m->exchange.DiscardAbove(1);
  g.Save(3, [](int, size_t c) { return c % 3 == 0; });
  g.Contribute(3, 1);
  for (auto& m : g.members) CHECK(m->exchange.rows().Complete(3));
  g.CheckParity(3);
}

}  // namespace
}  // namespace ftrun
