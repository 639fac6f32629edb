// An erasure-coded group of agents' parts over an in-process network (for
// the parity exchange's and the rebuild's tests): each member a store in
// its own arena, a ParityExchange, a FragmentServer and an ErasureRebuild.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "plugin/common/hash.h"
#include "plugin/erasure/erasure_rebuild.h"
#include "plugin/erasure/fragment_server.h"
#include "plugin/erasure/parity_exchange.h"
#include "tests/catch.h"
#include "tests/unit/fake_net.h"

namespace ftrun {

constexpr uint64_t kArenaBase = 4096;
constexpr uint64_t kArenaData = 8 << 20;

struct Member {
  Member(FakeNet* net, PeerId id, const GroupCode* code)
      : arena(kArenaBase + kArenaData),
        store(kArenaBase, kArenaData, "x"),
        transport(net, id),
        exchange(&transport, &store, arena.data(), code),
        server(&transport, &store, arena.data(), &exchange, [this] { return ranks; }),
        rebuild(&transport, &store, arena.data(), code, [](PeerId) {}) {}
  std::vector<char> arena;
  SnapshotStore store;
  FakeTransport transport;
  ParityExchange exchange;
  FragmentServer server;
  ErasureRebuild rebuild;
  std::vector<int> ranks;
  std::vector<uint64_t> contributed, complete;
  std::vector<Status> failed;
  bool stalled = false;  // a process that stopped (SIGSTOP): its messages wait, unread
};

// Rank `rank` saves `version` into m's store: a tensor of `bytes` bytes cut
// into chunks of `chunk` bytes. Chunk c's bytes come from `seed(c)`.
inline void SaveRank(Member& m, int rank, uint64_t version, uint64_t bytes, uint64_t chunk,
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
inline std::vector<uint8_t> Shard(Member& m, uint64_t version) {
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
        if (m->stalled) continue;
        for (TransportEvent& e : m->transport.Poll()) {
          busy = true;
          if (e.kind == TransportEvent::Kind::kMessage) {
            CHECK((m->exchange.Handle(e.peer, e.type, e.payload) ||
                   m->server.Handle(e.peer, e.type, e.payload, net.clock.Now()) ||
                   m->rebuild.Handle(e.peer, e.type, e.payload)));
          }
          if (e.kind == TransportEvent::Kind::kBulkDone) {
            CHECK((m->exchange.BulkDone(e.token, e.status) || m->server.BulkDone(e.token, e.status) ||
                   m->rebuild.BulkDone(e.token, e.status)));
          }
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

}  // namespace ftrun
