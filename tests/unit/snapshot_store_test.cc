#include "plugin/store/snapshot_store.h"

#include "tests/catch.h"

using namespace ftrun;

namespace {

constexpr uint64_t kBase = 4096;

// A one-tensor manifest whose chunks are the given (content, new?) pairs.
// New chunks get the extents in `offsets`, in order.
Manifest Make(int rank, uint64_t version, const std::vector<std::pair<std::string, bool>>& chunks,
              const std::vector<uint64_t>& offsets) {
  Manifest m;
  m.rank = rank;
  m.version = version;
  TensorManifest t;
  uint64_t n = 0;
  size_t k = 0;
  for (const auto& [content, fresh] : chunks) {
    ChunkRef c;
    c.hash = HashBytes(content.data(), content.size());
    c.length = content.size();
    c.offset = fresh ? offsets.at(k++) : kNoOffset;
    t.chunks.push_back(c);
    n += content.size();
  }
  t.info = {"w", DType::kUInt8, {static_cast<int64_t>(n)}, n, Device::kHost};
  m.tensors.push_back(t);
  return m;
}

std::vector<uint64_t> Reserve(SnapshotStore& s, uint64_t owner, std::vector<uint64_t> lens) {
  std::vector<uint64_t> offs;
  REQUIRE(s.Reserve(owner, lens, &offs).ok());
  return offs;
}

}  // namespace

TEST_CASE("chunks are shared between versions and freed with the last reference", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "cfg.yaml:3: store.memory_budget");
  auto offs = Reserve(s, 1, {4, 4});
  REQUIRE(s.AddManifest(1, Make(0, 1, {{"aaaa", true}, {"bbbb", true}}, offs)).ok());
  s.ReleaseReservations(1);
  CHECK(s.Stats().chunks == 2);
  CHECK(s.Stats().used_bytes == 2 * 4096);
  // Version 2 changes only the second chunk: the first is referenced.
  offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 2, {{"aaaa", false}, {"cccc", true}}, offs)).ok());
  s.ReleaseReservations(1);
  CHECK(s.Stats().chunks == 3);
  s.ReleaseBelow(2);  // version 2 committed: version 1 goes, "bbbb" with it
  CHECK(s.Stats().chunks == 2);
  CHECK(s.Stats().used_bytes == 2 * 4096);
  CHECK(s.Versions() == std::vector<uint64_t>{2});
  const Manifest* m = s.Find(0, 2);
  REQUIRE(m);
  CHECK(m->tensors[0].chunks[0].offset == offs.size() * 0 + m->tensors[0].chunks[0].offset);
  CHECK(m->tensors[0].chunks[0].offset != kNoOffset);
}

TEST_CASE("identical chunks of two ranks are stored once", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  auto a = Reserve(s, 1, {4});
  auto b = Reserve(s, 2, {4});
  REQUIRE(s.AddManifest(1, Make(0, 1, {{"same", true}}, a)).ok());
  REQUIRE(s.AddManifest(2, Make(1, 1, {{"same", true}}, b)).ok());
  s.ReleaseReservations(1);
  s.ReleaseReservations(2);
  CHECK(s.Stats().chunks == 1);
  CHECK(s.Stats().used_bytes == 4096);
  CHECK(s.Find(1, 1)->tensors[0].chunks[0].offset == a[0]);
}

TEST_CASE("the store refuses bad manifests and changes nothing", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  auto offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 5, {{"aaaa", true}}, offs)).ok());
  s.ReleaseReservations(1);
  const auto before = s.Stats();

  SECTION("version going backwards") {
    Status st = s.AddManifest(1, Make(0, 5, {{"aaaa", false}}, {}));
    CHECK(st.code() == Code::kFailedPrecondition);
    CHECK_THAT(st.message(), Catch::Contains("rank 0 version 5") && Catch::Contains("already saved version 5"));
  }
  SECTION("a chunk the store does not hold") {
    Status st = s.AddManifest(1, Make(0, 6, {{"zzzz", false}}, {}));
    CHECK(st.code() == Code::kChunkMissing);
  }
  SECTION("an extent the rank did not reserve") {
    Status st = s.AddManifest(1, Make(0, 6, {{"dddd", true}}, {kBase + 4096 * 10}));
    CHECK(st.code() == Code::kInvalidArgument);
  }
  SECTION("a chunk length of 0, or above any store's chunk size") {
    for (uint64_t bad : {uint64_t{0}, kMaxChunkSize + 1}) {
      Manifest m = Make(0, 6, {{"aaaa", false}}, {});
      m.tensors[0].chunks[0].length = bad;
      Status st = s.AddManifest(1, m);
      CHECK(st.code() == Code::kInvalidArgument);
      CHECK_THAT(st.message(), Catch::Contains("rank 0 version 6: tensor 'w' chunk #0 field 'length' is " +
                                               std::to_string(bad) + " bytes"));
    }
  }
  SECTION("a different tensor layout") {
    Manifest m = Make(0, 6, {{"aaaa", false}, {"aaaa", false}}, {});
    Status st = s.AddManifest(1, m);
    CHECK(st.code() == Code::kFailedPrecondition);
    CHECK_THAT(st.message(), Catch::Contains("'w'") && Catch::Contains("[8]") && Catch::Contains("[4]"));
  }
  CHECK(s.Stats().chunks == before.chunks);
  CHECK(s.Stats().used_bytes == before.used_bytes);
  CHECK(s.Versions() == std::vector<uint64_t>{5});
}

TEST_CASE("the budget is never exceeded and the error names the config field", "[store]") {
  SnapshotStore s(kBase, 4 * 4096, "configs/x.yaml:7: store.memory_budget");
  auto offs = Reserve(s, 1, {4096, 4096, 4096});
  REQUIRE(s.AddManifest(
               1, Make(0, 1,
                       {{std::string(4096, 'a'), true}, {std::string(4096, 'b'), true}, {std::string(4096, 'c'), true}},
                       offs))
              .ok());
  s.ReleaseReservations(1);
  std::vector<uint64_t> more;
  Status st = s.Reserve(1, {4096, 4096}, &more);
  CHECK(st.code() == Code::kResourceExhausted);
  CHECK_THAT(st.message(), Catch::Contains("configs/x.yaml:7: store.memory_budget"));
  CHECK(more.empty());
  CHECK(s.Stats().used_bytes == 3 * 4096);  // the failed request took nothing
  CHECK(s.Find(0, 1) != nullptr);           // nothing committed was evicted
}

TEST_CASE("a pinned version outlives its release until unpinned", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  auto offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 1, {{"aaaa", true}}, offs)).ok());
  offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 2, {{"bbbb", true}}, offs)).ok());
  s.ReleaseReservations(1);
  s.Pin(1);
  s.ReleaseBelow(2);
  CHECK(s.Find(0, 1) != nullptr);
  s.Unpin(1);
  CHECK(s.Find(0, 1) == nullptr);
  CHECK(s.Stats().chunks == 1);
}

TEST_CASE("discarding a failed generation's versions resets the version order", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  for (uint64_t v = 1; v <= 3; ++v) {
    auto offs = Reserve(s, 1, {4});
    REQUIRE(s.AddManifest(1, Make(0, v, {{"v" + std::to_string(v) + "xx", true}}, offs)).ok());
    s.ReleaseReservations(1);
  }
  s.DiscardAbove(1);
  CHECK(s.Versions() == std::vector<uint64_t>{1});
  CHECK(s.LastSaved(0) == 1u);
  auto offs = Reserve(s, 1, {4});
  CHECK(s.AddManifest(1, Make(0, 2, {{"v2yy", true}}, offs)).ok());
  s.DiscardAbove(std::nullopt);
  s.ReleaseReservations(1);
  CHECK(s.Stats().used_bytes == 0);
}

TEST_CASE("going back to an older version: a pin and unpin of it does not release it", "[store]") {
  SnapshotStore s(kBase, 64 * 4096, "cfg.yaml:3: store.memory_budget");
  auto offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 10, {{"aaaa", true}}, offs)).ok());
  s.ReleaseReservations(1);
  s.ReleaseBelow(10);  // version 10 committed
  s.DiscardAbove(5);   // the job goes back to version 5 (restored from disk)
  CHECK(s.Versions().empty());
  offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 5, {{"bbbb", true}}, offs)).ok());
  s.ReleaseReservations(1);
  s.ReleaseBelow(5);  // version 5 committed again
  s.Pin(5);           // a rank loads it ...
  s.Unpin(5);         // ... and is done
  CHECK(s.Find(0, 5) != nullptr);
}

TEST_CASE("a corrupted chunk leaves the store with every manifest that uses it", "[store][corrupt]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  auto offs = Reserve(s, 1, {4, 4});
  REQUIRE(s.AddManifest(1, Make(0, 1, {{"aaaa", true}, {"bbbb", true}}, offs)).ok());
  const uint64_t bad_at = offs[0];
  auto other = Reserve(s, 2, {4});
  REQUIRE(s.AddManifest(2, Make(1, 1, {{"cccc", true}}, other)).ok());  // another rank, not using it
  offs = Reserve(s, 1, {4});
  REQUIRE(s.AddManifest(1, Make(0, 2, {{"aaaa", false}, {"dddd", true}}, offs)).ok());
  s.ReleaseReservations(1);
  s.ReleaseReservations(2);
  const ChunkHash bad = HashBytes("aaaa", 4);
  CHECK(s.ChunkOffset(bad) == bad_at);

  auto dropped = s.DropChunk(bad);
  CHECK(dropped == std::vector<std::pair<int, uint64_t>>{{0, 1}, {0, 2}});
  CHECK(s.Find(0, 1) == nullptr);
  CHECK(s.Find(0, 2) == nullptr);
  CHECK(s.Find(1, 1) != nullptr);
  CHECK(!s.ChunkOffset(bad));
  CHECK(s.Stats().chunks == 1);  // "bbbb" and "dddd" went with their manifests
  CHECK(s.Stats().used_bytes == 4096);
  CHECK(s.RankVersions(0).empty());
  CHECK(s.DropChunk(bad).empty());  // once

  // A save that references the dropped chunk by hash must copy it again.
  offs = Reserve(s, 1, {4});
  CHECK(s.AddManifest(1, Make(0, 3, {{"aaaa", false}, {"eeee", true}}, offs)).code() == Code::kChunkMissing);
  s.ReleaseReservations(1);
  offs = Reserve(s, 1, {4, 4});
  REQUIRE(s.AddManifest(1, Make(0, 3, {{"aaaa", true}, {"eeee", true}}, offs)).ok());
  s.ReleaseReservations(1);
  CHECK(s.ChunkOffset(bad) == offs[0]);
}

TEST_CASE("a dropped chunk's pinned manifests and holds stay valid until released", "[store][corrupt]") {
  SnapshotStore s(kBase, 64 * 4096, "x");
  auto offs = Reserve(s, 1, {4, 4});
  REQUIRE(s.AddManifest(1, Make(0, 1, {{"aaaa", true}, {"bbbb", true}}, offs)).ok());
  s.ReleaseReservations(1);
  const ChunkHash bad = HashBytes("aaaa", 4);
  const Manifest* reader_view = s.Find(0, 1);
  s.Pin(1);                      // a reader (the flusher, a rank's load) uses version 1
  REQUIRE(s.HoldChunk(7, bad));  // an incoming copy references the bad chunk
  REQUIRE(s.DropChunk(bad).size() == 1);
  CHECK(s.Find(0, 1) == nullptr);                     // no longer listed ...
  CHECK(reader_view->tensors[0].chunks.size() == 2);  // ... but still alive for the reader
  CHECK(s.Stats().used_bytes == 2 * 4096);

  // A good copy of the same hash comes back (a pull) while the old holds last.
  offs = Reserve(s, 2, {4});
  REQUIRE(s.AddManifest(2, Make(0, 1, {{"aaaa", true}, {"bbbb", false}}, offs)).ok());
  s.ReleaseReservations(2);
  CHECK(s.ChunkOffset(bad) == offs[0]);
  CHECK(s.Stats().used_bytes == 3 * 4096);

  s.ReleaseReservations(7);  // the hold ends: the new copy is untouched
  s.Unpin(1);                // the old manifest goes, and the bad extent with it
  CHECK(s.ChunkOffset(bad) == offs[0]);
  CHECK(s.Find(0, 1) != nullptr);
  CHECK(s.Stats().chunks == 2);
  CHECK(s.Stats().used_bytes == 2 * 4096);
  s.DiscardAbove(std::nullopt);
  CHECK(s.Stats().used_bytes == 0);
}
