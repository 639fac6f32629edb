// CorruptChunks against a real SnapshotStore over real memory: a rank's
// report is believed only when the store's own bytes are bad; a bad chunk
// is repaired in place from a good copy, or dropped with every snapshot
// that uses it; a pull repairs what was dropped.
#include "launcher/agent/corrupt_chunks.h"

#include <cstring>

#include "plugin/common/bytes.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

constexpr uint64_t kBase = 4096;  // the store's first offset in the arena

struct Node {
  std::vector<char> arena = std::vector<char>(kBase + 64 * 4096);
  SnapshotStore store{kBase, 64 * 4096, "budget"};
  std::map<ChunkHash, std::string, bool (*)(const ChunkHash&, const ChunkHash&)> disk{
      [](const ChunkHash& a, const ChunkHash& b) { return a.lo < b.lo || (a.lo == b.lo && a.hi < b.hi); }};
  bool with_disk = true;
  CorruptChunks chunks{&store, arena.data(),
                       [this](const ChunkRef& ref, char* dst) {
                         auto it = disk.find(ref.hash);
                         if (!with_disk || it == disk.end()) return Status::NotFound("no file");
                         std::memcpy(dst, it->second.data(), it->second.size());
                         return Status::Ok();
                       },
                       "the test's disk"};
  int changes = 0;
  Node() {
    chunks.on_change = [this] { ++changes; };
  }

  // `rank` saves `version`: tensor "w" with one chunk per string.
  void Save(int rank, uint64_t version, const std::vector<std::string>& contents) {
    std::vector<uint64_t> lengths, offs;
    for (const auto& c : contents) lengths.push_back(c.size());
    Manifest m;
    m.rank = rank;
    m.version = version;
    TensorManifest t;
    uint64_t total = 0;
    for (size_t i = 0; i < contents.size(); ++i) {
      ChunkRef c;
      c.hash = HashBytes(contents[i].data(), contents[i].size());
      c.length = contents[i].size();
      if (!store.HoldChunk(1, c.hash)) {
        REQUIRE(store.Reserve(1, {c.length}, &offs).ok());
        c.offset = offs[0];
        std::memcpy(arena.data() + c.offset, contents[i].data(), c.length);
      }
      t.chunks.push_back(c);
      total += c.length;
      disk[c.hash] = contents[i];
    }
    t.info = {"w", DType::kUInt8, {static_cast<int64_t>(total)}, total, Device::kHost};
    m.tensors.push_back(t);
    Status s = store.AddManifest(1, std::move(m));
    INFO(s.message());
    REQUIRE(s.ok());
    store.ReleaseReservations(1);
  }
  ChunkRef Ref(int rank, uint64_t version, size_t index) const {
    return store.Find(rank, version)->tensors[0].chunks[index];
  }
  void Flip(const ChunkRef& ref) { arena[ref.offset] ^= 0x40; }
  CorruptChunkReport Report(uint64_t version, uint64_t index) const {
    CorruptChunkReport r;
    r.version = version;
    r.tensor = "w";
    r.index = index;
    return r;
  }
};

std::string Chunk(char c) { return std::string(4096, c); }

TEST_CASE("corrupt chunks: a rank's report is believed only when the store's own bytes are bad", "[corrupt]") {
  Node n;
  n.Save(0, 1, {Chunk('a'), Chunk('b')});
  CorruptChunks::Verdict v = n.chunks.Reported(0, n.Report(1, 1));
  CHECK_FALSE(v.corrupted);
  CHECK(v.message.find("checks out") != std::string::npos);
  CHECK(n.chunks.found() == 0);
  CHECK(n.chunks.Settle().snapshots.empty());
  CHECK(n.store.Find(0, 1) != nullptr);  // a rank cannot make the agent drop a good copy

  v = n.chunks.Reported(0, n.Report(1, 7));  // no such chunk
  CHECK_FALSE(v.corrupted);
  CHECK(v.message.find("not in this node's store") != std::string::npos);
  v = n.chunks.Reported(0, n.Report(9, 0));  // no such version
  CHECK_FALSE(v.corrupted);
}

TEST_CASE("corrupt chunks: a bad chunk is repaired in place from the disk's copy when the generation stops",
          "[corrupt]") {
  Node n;
  n.Save(0, 1, {Chunk('a'), Chunk('b')});
  const ChunkRef ref = n.Ref(0, 1, 1);
  n.Flip(ref);
  CorruptChunks::Verdict v = n.chunks.Reported(0, n.Report(1, 1));
  CHECK(v.corrupted);
  CHECK(n.chunks.found() == 1);
  CHECK(n.changes == 1);
  n.chunks.Reported(0, n.Report(1, 1));  // reported twice (two ranks read it): counted, kept once
  CHECK(n.chunks.found() == 2);
  CHECK(n.chunks.pending() == 1);

  CorruptChunks::Dropped d = n.chunks.Settle();
  CHECK(d.snapshots.empty());
  CHECK(n.chunks.repaired() == 1);
  CHECK(n.chunks.pending() == 0);
  CHECK(HashBytes(n.arena.data() + ref.offset, ref.length) == ref.hash);
  CHECK(n.store.Find(0, 1) != nullptr);
}

TEST_CASE("corrupt chunks: with no good copy, the chunk goes with every snapshot that uses it; a pull repairs it",
          "[corrupt]") {
  Node n;
  n.with_disk = false;
  n.Save(0, 1, {Chunk('a'), Chunk('b')});
  n.Save(0, 2, {Chunk('a'), Chunk('c')});  // shares chunk 'a'
  n.Save(1, 2, {Chunk('d')});
  const ChunkRef ref = n.Ref(0, 2, 0);
  n.Flip(ref);
  REQUIRE(n.chunks.Reported(0, n.Report(2, 0)).corrupted);

  CorruptChunks::Dropped d = n.chunks.Settle();
  CHECK(d.snapshots == std::vector<std::pair<int, uint64_t>>{{0, 1}, {0, 2}});
  CHECK(d.why.find("rank 0 tensor 'w' chunk #0 of version 2 is corrupted in shared memory") == 0);
  CHECK(d.why.find(ref.hash.ToHex()) != std::string::npos);
  CHECK(n.store.Find(0, 1) == nullptr);
  CHECK(n.store.Find(0, 2) == nullptr);
  CHECK(n.store.Find(1, 2) != nullptr);
  CHECK(n.chunks.Settle().snapshots.empty());  // settled once

  n.chunks.Pulled(1, 2, "agent 3");  // another rank's pull repairs nothing
  CHECK(n.chunks.repaired() == 0);
  n.chunks.Pulled(0, 2, "agent 3");
  CHECK(n.chunks.repaired() == 1);
  CHECK(n.chunks.pending() == 0);
}

TEST_CASE("corrupt chunks: what was dropped and never repaired is given up when the job starts again", "[corrupt]") {
  Node n;
  n.with_disk = false;
  n.Save(0, 1, {Chunk('a')});
  n.Flip(n.Ref(0, 1, 0));
  REQUIRE(n.chunks.Reported(0, n.Report(1, 0)).corrupted);
  REQUIRE(n.chunks.Settle().snapshots.size() == 1);
  std::vector<int> asked;
  n.chunks.GiveUpDropped(
      [&](int rank) {
        asked.push_back(rank);
        return true;
      },
      0);
  CHECK(asked == std::vector<int>{0});
  CHECK(n.chunks.pending() == 0);
}

TEST_CASE("corrupt chunks: a chunk the replicator found bad, released or good again by the stop, is left alone",
          "[corrupt]") {
  Node n;
  n.with_disk = false;
  n.Save(0, 1, {Chunk('a'), Chunk('b')});
  const ChunkRef bad = n.Ref(0, 1, 1);
  n.Flip(bad);
  n.chunks.FoundSending(0, 1, bad);
  CHECK(n.chunks.found() == 1);
  n.Flip(bad);  // the bit flips back
  CHECK(n.chunks.Settle().snapshots.empty());
  CHECK(n.chunks.pending() == 0);
  CHECK(n.store.Find(0, 1) != nullptr);

  n.Flip(bad);
  n.chunks.FoundSending(0, 1, bad);
  n.store.ReleaseBelow(2);  // nothing references those bytes now
  CHECK(n.chunks.Settle().snapshots.empty());
  CHECK(n.chunks.pending() == 0);
}

TEST_CASE("corrupt chunks: a malformed report is refused by name", "[corrupt]") {
  ByteWriter w;
  w.Put<uint64_t>(3);
  w.PutString("w");
  CorruptChunkReport r;
  Status s = CorruptChunkReport::Decode(w.data(), &r);
  CHECK(s.code() == Code::kCorruption);
  CHECK(s.message() == "malformed corrupted-chunk report");
  w.Put<uint64_t>(1);
  w.Put<uint64_t>(2);
  w.Put<uint64_t>(3);
  REQUIRE(CorruptChunkReport::Decode(w.data(), &r).ok());
  CHECK(r.version == 3);
  CHECK(r.index == 1);
  CHECK((r.seen.lo == 2 && r.seen.hi == 3));
  w.Put<uint8_t>(0);  // a trailing byte
  CHECK_FALSE(CorruptChunkReport::Decode(w.data(), &r).ok());
}

}  // namespace
}  // namespace ftrun
