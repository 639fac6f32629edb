// A lost member of an erasure-coded group rebuilt by a fresh agent from the
// survivors (their data slices, parity rows and copies of its manifests):
// every rank comes back bit-identical, one or two lost members at a time; a
// parity row corrupted at a survivor is found by the chunk hashes and
// decoded around; with fewer than `data` fragments left it fails, saying so.
// Pieces of a few KiB (many per slice, across chunk edges) and of a whole
// slice.
#include "plugin/erasure/erasure_rebuild.h"

#include "tests/catch.h"
#include "tests/unit/erasure_group.h"

namespace ftrun {
namespace {

// A 4+2 group (uneven ranks) that committed version 1 and then version 2.
struct Committed {
  Committed() : g(4, 2, {{40000, 9000}, {50000}, {50000}, {12000}, {50000}, {30000, 20000}}, 3000) {
    g.Save(1, [](int, size_t) { return true; });
    g.Contribute(1, std::nullopt);
    g.Save(2, [](int, size_t c) { return c % 5 == 0; });
    g.Contribute(2, 1);
    for (auto& m : g.members) m->exchange.Committed(2);
  }
  // Member `m`'s agent replaced by a fresh one with an empty store; the
  // others' bytes are kept to compare.
  void Lose(int m) {
    want[m] = Shard(*g.members[static_cast<size_t>(m)], version);
    auto fresh = std::make_unique<Member>(&g.net, static_cast<PeerId>(100 + m), g.code.get());
    fresh->ranks = g.members[static_cast<size_t>(m)]->ranks;
    g.members[static_cast<size_t>(m)] = std::move(fresh);
    std::vector<PeerId> ids;
    for (auto& x : g.members) ids.push_back(x->transport.self());
    for (size_t i = 0; i < g.members.size(); ++i) g.Wire(i, ids);
    lost.push_back(m);
  }
  // Member `m`'s agent restarted: its store holds only `kept` (its ranks'
  // manifests and chunks of that version), not the committed one.
  void Restart(int m, uint64_t kept) {
    Member& old = *g.members[static_cast<size_t>(m)];
    const std::vector<int> ranks = old.ranks;
    std::vector<std::pair<Manifest, std::vector<std::vector<char>>>> copies;
    for (int r : ranks) {
      const Manifest* man = old.store.Find(r, kept);
      REQUIRE(man);
      std::vector<std::vector<char>> bytes;
      for (const auto& t : man->tensors)
        for (const auto& c : t.chunks)
          bytes.emplace_back(old.arena.data() + c.offset, old.arena.data() + c.offset + c.length);
      copies.emplace_back(*man, std::move(bytes));
    }
    Lose(m);
    Member& fresh = *g.members[static_cast<size_t>(m)];
    for (auto& [man, bytes] : copies) {
      std::vector<uint64_t> lengths, offs;
      for (const auto& b : bytes) lengths.push_back(b.size());
      REQUIRE(fresh.store.Reserve(1, lengths, &offs).ok());
      size_t i = 0;
      for (auto& t : man.tensors) {
        for (auto& c : t.chunks) {
          std::memcpy(fresh.arena.data() + offs[i], bytes[i].data(), c.length);
          c.offset = offs[i++];
        }
      }
      REQUIRE(fresh.store.AddManifest(1, man).ok());
      fresh.store.ReleaseReservations(1);
    }
  }
  // Each lost member rebuilds from the others (the lost ones have nothing).
  void Rebuild(std::vector<Status>* failed = nullptr) {
    for (int m : lost) {
      Member& x = *g.members[static_cast<size_t>(m)];
      x.rebuild.set_piece_bytes(piece);
      std::vector<ErasureSource> group;
      for (size_t i = 0; i < g.members.size(); ++i) {
        const bool gone = std::find(lost.begin(), lost.end(), static_cast<int>(i)) != lost.end();
        group.push_back({gone ? kNoAgent : g.members[i]->transport.self(), !gone, !gone});
      }
      x.rebuild.on_done = [&x](uint64_t, uint64_t, const std::vector<int>&) { x.contributed.push_back(99); };
      x.rebuild.on_failed = [failed](uint64_t, uint64_t, int, const Status& s) {
        if (failed) failed->push_back(s);
      };
      x.rebuild.Begin(0, version, x.ranks, group, m);
    }
    g.Run();
  }
  Group g;
  std::map<int, std::vector<uint8_t>> want;
  std::vector<int> lost;
  uint64_t version = 2;
  // Fetched and decoded in pieces of this many bytes: several per slice,
  // chunks (3,000 bytes) across their edges; or one piece per slice.
  uint64_t piece = 4096;
};

TEST_CASE("erasure rebuild: one or two lost members come back bit-identical from the survivors", "[erasure][rebuild]") {
  Committed c;
  c.piece = GENERATE(uint64_t{4096}, ErasureRebuild::kPieceBytes);
  SECTION("one") { c.Lose(1); }
  SECTION("two, one of them with two ranks") {
    c.Lose(0);
    c.Lose(4);
  }
  c.Rebuild();
  for (int m : c.lost) {
    Member& x = *c.g.members[static_cast<size_t>(m)];
    INFO("member " << m);
    REQUIRE(x.contributed == std::vector<uint64_t>{99});
    CHECK(Shard(x, 2) == c.want[m]);
    for (int r : x.ranks) {
      const Manifest* man = x.store.Find(r, 2);
      REQUIRE(man);
      for (const auto& t : man->tensors)
        for (const auto& ch : t.chunks) CHECK(HashBytes(x.arena.data() + ch.offset, ch.length) == ch.hash);
    }
    CHECK(x.rebuild.stats().redecoded == 0);
  }
}

TEST_CASE("erasure rebuild: a restarted agent keeps the chunks it still holds and writes only the others",
          "[erasure][rebuild]") {
  Committed c;
  c.Restart(5, 1);  // member 5 (two ranks) still holds version 1; version 2 changed every fifth chunk
  Member& x = *c.g.members[5];
  const StoreStats before = x.store.Stats();
  c.Rebuild();
  REQUIRE(x.contributed == std::vector<uint64_t>{99});
  CHECK(Shard(x, 2) == c.want[5]);
  CHECK(Shard(x, 1).size() == c.want[5].size());  // version 1 still there
  const StoreStats after = x.store.Stats();
  CHECK(after.reserved_bytes == 0);
  // Only version 2's changed chunks took new extents.
  uint64_t changed = 0;
  for (int r : x.ranks) {
    const Manifest *v1 = x.store.Find(r, 1), *v2 = x.store.Find(r, 2);
    for (size_t i = 0; i < v2->tensors[0].chunks.size(); ++i)
      changed += v1->tensors[0].chunks[i].hash != v2->tensors[0].chunks[i].hash ? 1 : 0;
  }
  CHECK(changed > 0);
  CHECK(after.chunks - before.chunks == changed);
  // Only the pieces with a changed chunk in them were fetched.
  CHECK(x.rebuild.stats().fragment_bytes < c.want[5].size() * 4);
}

// Issue 33, findings 5 and 11: a survivor that stops answering (SIGSTOP)
// holds the rebuild up for kAskTimeout per try at most; its fragment is
// asked for again, then decoded around; the rebuild finishes, bit-identical.
// A survivor that comes back late answers asks nobody waits for any more.
TEST_CASE("erasure rebuild: a stalled survivor costs a deadline, not the rebuild", "[erasure][rebuild]") {
  Committed c;
  c.Lose(1);
  Member& stalled = *c.g.members[3];
  stalled.stalled = true;
  std::vector<Status> failed;
  c.Rebuild(&failed);
  Member& x = *c.g.members[1];
  auto t = c.g.net.clock.Now();
  int rounds = 0;
  while (x.contributed.empty() && failed.empty() && rounds++ < 20) {
    x.rebuild.Tick(t);  // (the asks' clocks start)
    t += ErasureRebuild::kAskTimeout + std::chrono::seconds(1);
    x.rebuild.Tick(t);
    c.g.Run();
  }
  INFO((failed.empty() ? std::string() : failed[0].message()));
  REQUIRE(failed.empty());
  REQUIRE(x.contributed == std::vector<uint64_t>{99});  // done
  CHECK(rounds <= 3 * ErasureRebuild::kMisses + 2);
  CHECK(Shard(x, 2) == c.want[1]);
  stalled.stalled = false;
  c.g.Run();  // its late answers change nothing
  CHECK(Shard(x, 2) == c.want[1]);
}

TEST_CASE("erasure rebuild: a parity row corrupted at a survivor is decoded around; too few fragments fail clearly",
          "[erasure][rebuild]") {
  Committed c;
  SECTION("a corrupted row: the chunk hashes catch it, another choice of fragments decodes right") {
    // Version 3 (no change) whose parity at member 0 (row 0 of stripe 0,
    // where member 2's first slice is coded) took a stray delta first.
    c.g.Save(3, [](int, size_t) { return false; });
    const uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    GroupCode::Place p;
    p.fragment = 0;
    p.offset = 100;
    REQUIRE(
        c.g.members[0]->exchange.rows().Apply(3, 2, c.g.members[0]->exchange.epoch(), 0, p, junk, sizeof junk).ok());
    c.g.Contribute(3, 2);
    for (auto& m : c.g.members) REQUIRE(m->exchange.rows().Complete(3));
    c.version = 3;
    c.Lose(2);
    c.Rebuild();
    Member& x = *c.g.members[2];
    REQUIRE(x.contributed == std::vector<uint64_t>{99});
    CHECK(Shard(x, 3) == c.want[2]);
    CHECK(x.rebuild.stats().redecoded >= 1);
  }
  SECTION("three lost of a 4+2 group: not enough fragments") {
    c.Lose(2);
    c.Lose(3);
    c.Lose(5);
    std::vector<Status> failed;
    c.Rebuild(&failed);
    REQUIRE(failed.size() >= 1);
    CHECK(failed[0].message().find("usable fragments left") != std::string::npos);
  }
}

}  // namespace
}  // namespace ftrun
